# The two entry points of the README. Both set the machine up first (idempotent).
.PHONY: setup demo test test-unit soak lint ui

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/exactly demo

# Two workers, each test file whole on one of them (module fixtures such as the Dagster UI
# stay single): most of the suite waits on JVMs, brokers and daemons, not on the 2 cores.
test: setup
	.venv/bin/ruff check .
	.venv/bin/lint-imports
	.venv/bin/python -m pytest -n 2 --dist loadfile

# Only the tests that start no JVM and no server (tests/conftest.py marks them): seconds.
test-unit: setup
	.venv/bin/python -m pytest -m unit

# The soaks (tests marked `soak`) at full size: `make test` runs the same tests on the same
# code path with fewer records, kills and rounds (tests/fixtures/soak.py reads EXACTLY_SOAK).
# Twice the default per-test limit: a full-size soak on a loaded machine may need it.
soak: setup
	EXACTLY_SOAK=1 .venv/bin/python -m pytest -m soak -n 2 --dist loadfile --timeout 1800

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
