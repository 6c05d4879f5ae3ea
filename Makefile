# The two entry points of the README. Both set the machine up first (idempotent).
.PHONY: setup demo test lint

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/exactly demo

test: setup
	.venv/bin/ruff check .
	.venv/bin/python -m pytest

lint: setup
	.venv/bin/ruff check .
