"""The test suite: `pytest -m unit` (no JVM, no server) and `pytest -m integration` (the real
broker, Spark, Delta, PostgreSQL, Dagster); tests/conftest.py marks each test automatically."""
