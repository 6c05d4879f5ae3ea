# The two entry points of the README. Both set the machine up first (idempotent).
.PHONY: setup demo test test-wide test-unit soak lint ui

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/exactly demo

# Two workers, each test file whole on one of them (module fixtures such as the Dagster UI
# stay single): one worker per core; the suite keeps both busy (a third gained nothing).
# --no-loadscope-reorder: files go out in tests/conftest.py's order (LONGEST_FIRST), not
# xdist's default of most tests first, which sent the few-test long files out last.
# Each prints its wall time last ("make test: 1234 s"), setup excluded, pass or fail.
# `make test` runs every behaviour once; `make test-wide` runs the `wide` cases (the same
# behaviours again on another deployment, format or crash-point family: tests/conftest.py).
# CI (.ci/run) runs both, `make test` first.
test: setup
	start=$$(date +%s); .venv/bin/ruff check . && .venv/bin/lint-imports && \
	.venv/bin/python -m pytest -m "not wide" -n 2 --dist loadfile --no-loadscope-reorder; \
	code=$$?; echo "make test: $$(( $$(date +%s) - start )) s"; exit $$code

test-wide: setup
	start=$$(date +%s); \
	.venv/bin/python -m pytest -m wide -n 2 --dist loadfile --no-loadscope-reorder; \
	code=$$?; echo "make test-wide: $$(( $$(date +%s) - start )) s"; exit $$code

# Only the tests that start no JVM and no server (tests/conftest.py marks them): seconds.
# Two workers (default distribution, test by test): the tests are CPU-bound and short.
test-unit: setup
	start=$$(date +%s); .venv/bin/python -m pytest -m unit -n 2; \
	code=$$?; echo "make test-unit: $$(( $$(date +%s) - start )) s"; exit $$code

# The soaks (tests marked `soak`) at full size: `make test` runs the same tests on the same
# code path with fewer records, kills and rounds (tests/fixtures/soak.py reads EXACTLY_SOAK).
# Twice the default per-test limit: a full-size soak on a loaded machine may need it.
soak: setup
	EXACTLY_SOAK=1 .venv/bin/python -m pytest -m soak -n 2 --dist loadfile --no-loadscope-reorder --timeout 1800

lint: setup
	.venv/bin/ruff check .
	.venv/bin/lint-imports

# The Dagster UI (webserver + daemon) on loopback, with this project's instance settings.
# Runs stage on the host's shared Spark server (started as the code location loads, kept
# between runs; `.venv/bin/exactly spark-server stop` stops it), not a JVM per run.
DAGSTER_HOME ?= $(CURDIR)/.dagster_home
ui: setup
	mkdir -p $(DAGSTER_HOME) && cp orchestration/dagster.yaml $(DAGSTER_HOME)/dagster.yaml
	EXACTLY_SPARK_SERVER=shared DAGSTER_HOME=$(DAGSTER_HOME) .venv/bin/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000
