"""Test-suite wiring: the shared fixtures, and the unit/integration split.

Every test is marked `unit` or `integration` automatically, so nobody has to remember to:
a test is `integration` when it asks for a fixture that starts a real server or JVM (the
Kafka broker, Spark, PostgreSQL, the S3 server; directly or through another fixture), takes
the PostgreSQL variant of `ledger_url`, or is marked `integration` by hand (tests that start
their own broker, Connect server or Dagster webserver). Everything else is `unit`, and
`pytest -m unit` runs it all in about a minute with no JVM and no server.

Two tiers, both run by CI (.ci/run): `make test` runs every behaviour at least once, on the
default deployment (local Spark, SQLite, local files, JSON) and in one case of its own on
each other one (a standalone cluster, Spark Connect, S3, PostgreSQL, Avro and Protobuf,
SASL_SSL, the Dagster UI); every crash point, every storage fault whose retry must decide by
content, and every one-line failure. A case marked `wide` (`make test-wide`) repeats a
behaviour `make test` already checks, on another deployment or format or at the same point
of another batch kind: the kill soak on cluster + S3 + PostgreSQL, the Avro kill soaks, a
fill's commit-side crash points (a replace's and a live batch's are in `make test`), the
backfill and partitioned crash points whose state another case in `make test` leaves, one
more pair of a point-by-ledger matrix, the race's control without conditional writes. Each
mark says, where it is set, which case in `make test` checks the same behaviour.
"""

from __future__ import annotations

import os

import pytest

from resources.jvm.options import JVM_OPTIONS_ENV

#: Every JVM the suite starts (brokers, Spark drivers and servers, clusters, the S3 server)
#: compiles with C1 only: they live seconds to minutes, and C2's warm-up was half of a short
#: driver's CPU on the two cores the suite keeps busy (resources/jvm/options.py).
SUITE_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"
os.environ[JVM_OPTIONS_ENV] = SUITE_JVM_OPTIONS

pytest_plugins = [
    "tests.fixtures.kafka",
    "tests.fixtures.ledger",
    "tests.fixtures.postgres",
    "tests.fixtures.s3",
    "tests.fixtures.secure_kafka",
    "tests.fixtures.pipeline",
    "tests.fixtures.partitioned",
    "tests.fixtures.spark_cluster",
    "tests.fixtures.webhook",
]

#: Fixtures that start a JVM or a server. `item.fixturenames` is the closure of what a test
#: requests, so a fixture built on one of these (e.g. `pipeline_factory`) counts too.
SERVER_FIXTURES = frozenset(
    {"kafka_broker", "spark", "spark_cluster", "postgres_url", "s3_server", "secure_kafka"}
)


def _starts_a_server(item: pytest.Item) -> bool:
    if item.get_closest_marker("integration") is not None:
        return True
    names = set(getattr(item, "fixturenames", ()))
    if names & SERVER_FIXTURES:
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and callspec.params.get("ledger_url") == "postgresql"


#: The files that take longest on one worker (the CI of 2026-11-28, seconds of tests in
#: `make test`: the UI ~280, the backfill crash matrix ~235, the one-line failures ~230, the
#: cluster ~190, ...; the four first are `make test-wide`'s longest: the bench smoke ~210, the
#: kill soaks ~150 and ~100, Avro sessions ~95), run first, longest first: each of the two
#: workers takes a whole file at a time in this order (`--no-loadscope-reorder`: xdist's
#: default sends the files with most tests first, and a long file with few tests sent last
#: keeps one worker busy while the other idles).
LONGEST_FIRST = (
    "test_bench_smoke.py",
    "test_kill_restart.py",
    "test_kill_restart_avro.py",
    "test_avro_sessions.py",
    "test_ui.py",
    "test_crash_backfill.py",
    "test_failure_lines.py",
    "test_spark_cluster.py",
    "test_shared_spark.py",
    "test_storage_faults.py",
    "test_crash.py",
    "test_pipeline.py",
    "test_s3_pipeline.py",
    "test_service_restarts.py",
    "test_orchestration.py",
    "test_topic_identity.py",
    "test_spark_connect.py",
    "test_compaction.py",
    "test_secure_kafka.py",
    "test_pipeline_topics.py",
    "test_cli.py",
    "test_clean.py",
    "test_backfill_plan.py",
    "test_backfill.py",
)


def _run_order(item: pytest.Item) -> int:
    name = item.path.name
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_run_order)  # stable: every file keeps its tests' order
    for item in items:
        if _starts_a_server(item):
            if item.get_closest_marker("integration") is None:
                item.add_marker(pytest.mark.integration)
        else:
            item.add_marker(pytest.mark.unit)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop this worker's shared Spark server, if a crash test started one."""
    from resources.spark.shared_server import STATE_ENV, stop_servers
    from tests.fixtures.pipeline import crash_spark_state

    folder = crash_spark_state()
    if folder.is_dir():
        stop_servers({STATE_ENV: str(folder)})
