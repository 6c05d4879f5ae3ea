"""The crash matrix of live batches: a real `exactly run` is killed with os._exit at each
crash point of docs/protocol.md, then the pipeline restarts twice from the state the crash
left: once with the ledger kept, once with the ledger deleted (the
Delta logs must rebuild it, invariants 7 and 12). Both restarts must end with every record
once in the table or the quarantine (invariant 1), and, for a pipeline with derived outputs,
every output equal to its recomputation over the raw table.

One broker topic, one crashed child and one set of tables per crash point: the state the
crash left is copied (tables and staged files, without the ledger) for the ledger-lost
restart, so each case pays for one child process, the expensive part. The data has
malformed records in every batch, so both tables are written. The restarts run in this
process on the session's Spark.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from deltalake import DeltaTable

from jobs.examples.sample_data import pageviews
from jobs.wiring.pipeline import build
from ledger.coordinator.crash import POINTS
from ledger.core.protocol import BatchState
from ledger.store.ledger_store import LedgerStore
from resources.config.derived_spec import PostgresOutput
from resources.postgres.connection import create_output_engine
from resources.postgres.tables import STATE_TABLE
from tests.fixtures.derived import (
    TRANSFORM,
    assert_derived_match,
    derived_outputs,
    postgres_held,
    postgres_output,
    user_events,
)
from tests.fixtures.pipeline import (
    FIRST_DERIVED_ONLY,
    assert_exactly_once,
    crash_run,
)

S = BatchState

#: crash point -> the state the crashed batch is left in (with the ledger kept)
LEFT_IN = {
    "after_plan": S.PLANNED,
    "before_stage": S.PLANNED,
    "during_stage": S.PLANNED,
    "after_stage": S.STAGED,
    "after_prepare": S.PREPARED,
    "between_derived_commits": S.PREPARED,
    "after_derived_commit": S.PREPARED,
    "postgres_before_commit": S.PREPARED,
    "postgres_after_commit": S.PREPARED,
    "between_table_commits": S.PREPARED,
    "after_delta_commit": S.PREPARED,
    "after_committed": S.COMMITTED,
    "recovery_after_delta_commit": S.PREPARED,
}
#: where each output stands after the crash: (quarantine holds the batch, table holds it)
HELD = {
    "between_table_commits": (True, False),
    "after_delta_commit": (True, True),
    "after_committed": (True, True),
    "recovery_after_delta_commit": (True, True),
}


#: points reached only by a pipeline with derived outputs: in their own test below
DERIVED_ONLY = {
    "between_derived_commits",
    "after_derived_commit",
    "postgres_before_commit",
    "postgres_after_commit",
}
#: the points of the pipelines without derived outputs
PLAIN = [p for p in LEFT_IN if p not in DERIVED_ONLY]


def test_every_crash_point_is_in_the_matrix() -> None:
    assert set(LEFT_IN) == set(POINTS)
    assert {p.partition("#")[0].partition("@")[0] for p in DERIVED_HELD} >= DERIVED_ONLY


def without_ledger(config: Any, dest: Path) -> Any:
    """A copy of the pipeline's tables (with the staged files under them) and no ledger:
    what the crash left, as an operator who lost the ledger database finds it."""
    copies = {}
    for field in ("table_uri", "quarantine_uri"):
        source = Path(getattr(config.delta, field))
        copies[field] = str(dest / source.name)
        if source.exists():
            shutil.copytree(source, copies[field])
    derived = []
    for spec in config.derived:
        if isinstance(spec, PostgresOutput):
            derived.append(copy_postgres_output(spec))
            continue
        source = Path(spec.table_uri)
        copy = dest / "derived" / source.name
        if source.exists():
            shutil.copytree(source, copy)
        derived.append(spec.model_copy(update={"table_uri": str(copy)}))
    return config.model_copy(
        update={
            "delta": config.delta.model_copy(update=copies),
            "ledger": config.ledger.model_copy(update={"url": f"sqlite:///{dest / 'new.db'}"}),
            "derived": derived,
        }
    )


def copy_postgres_output(spec: PostgresOutput) -> PostgresOutput:
    """The PostgreSQL output's table and its state rows copied to `<table>_lost`, as the
    crash left them: the ledger-lost restart must not see what the kept one applied."""
    copy = spec.model_copy(update={"table": f"{spec.table}_lost"})
    engine = create_output_engine(spec)
    state = f'"{STATE_TABLE}"'
    try:
        with engine.begin() as conn:
            if conn.execute(sa.text("SELECT to_regclass(:t)"), {"t": spec.table}).scalar():
                conn.execute(sa.text(f'CREATE TABLE "{copy.table}" AS TABLE "{spec.table}"'))
            if conn.execute(sa.text("SELECT to_regclass(:t)"), {"t": STATE_TABLE}).scalar():
                conn.execute(
                    sa.text(
                        f"INSERT INTO {state} (output, app_id, batch_id, token, metadata) "
                        f"SELECT :copy, app_id, batch_id, token, metadata FROM {state} "
                        "WHERE output = :o"
                    ),
                    {"copy": copy.table, "o": spec.table},
                )
    finally:
        engine.dispose()
    return copy


def held(config: Any, app_id: str) -> tuple[bool, bool]:
    """Whether the quarantine and the table hold the crashed batch's app transaction."""

    def at(uri: str) -> int:
        if not DeltaTable.is_deltatable(uri):
            return 0
        return DeltaTable(uri).transaction_version(app_id) or 0

    latest = max(b.batch_id for b in LedgerStore(config.ledger.url).batches(app_id=app_id))
    return (
        at(config.delta.quarantine_uri) >= latest,
        at(config.delta.table_uri) >= latest,
    )


def crashed_batch(config: Any, app_id: str) -> Any:
    store = LedgerStore(config.ledger.url)
    try:
        return store.batches(app_id=app_id, limit=1)[0]
    finally:
        store.dispose()


# -- live batches -------------------------------------------------------------------------


def live_restart(config: Any, spark: Any) -> None:
    """The next `exactly run --until-caught-up`: recover (rebuilding a lost ledger), then
    batches until caught up."""
    tpc = build(config, spark_factory=lambda: spark)
    tpc.recover_and_commit()
    while tpc.run_batch() is not None:
        pass


@pytest.mark.parametrize("point", PLAIN)
def test_live_crash_then_restart_with_and_without_the_ledger(
    point: str, spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    config = pipeline_factory(3)
    topic = config.kafka.topic
    kafka_client.produce(topic, pageviews(600, malformed_every=20))
    live_restart(config, spark)  # batch 1: history before the crash
    kafka_client.produce(topic, pageviews(300, start=600, malformed_every=20))

    if point == "recovery_after_delta_commit":
        crash_run(config, "after_prepare")  # the next start recovers batch 2 and dies
    crash_run(config, point)
    crashed = crashed_batch(config, config.app_id)
    assert (crashed.batch_id, crashed.state) == (2, LEFT_IN[point])
    assert held(config, config.app_id) == HELD.get(point, (False, False))
    # the topic moves on before anyone restarts: a batch planned again would read more
    kafka_client.produce(topic, pageviews(300, start=900, malformed_every=20))
    lost = without_ledger(config, tmp_path / "ledger-lost")

    live_restart(config, spark)
    table, quarantined = assert_exactly_once(config, kafka_client)
    assert (table + quarantined, quarantined) == (1200, 60)
    after = LedgerStore(config.ledger.url).get(config.app_id, 2)
    assert after is not None
    voted = LEFT_IN[point] not in (S.PLANNED, S.STAGED)
    assert after.state is (S.ACKED if voted else S.ABORTED)

    live_restart(lost, spark)
    assert assert_exactly_once(lost, kafka_client) == (table, quarantined)
    rebuilt = LedgerStore(lost.ledger.url).get(lost.app_id, 2)
    assert rebuilt is not None and rebuilt.state in (S.COMMITTED, S.ACKED)
    if HELD.get(point, (False, False))[0]:
        # a batch some table holds is finished over its own ranges, never planned again
        assert rebuilt.ranges == crashed.ranges


# -- a pipeline with derived outputs -------------------------------------------------------

#: crash point -> which outputs hold the crashed batch: the quarantine, each derived output
#: in config order (views_per_app, views_per_minute, latest_per_user), the table.
#: The derived Delta outputs MERGE at once (jobs/publish/lanes.py): a kill before the
#: first MERGE leaves none of them holding the batch; FIRST_DERIVED_ONLY holds the others
#: before theirs and dies once views_per_app's committed (tests/fixtures/pipeline.py).
DERIVED_HELD = {
    "between_derived_commits": (True, False, False, False, False, False),
    FIRST_DERIVED_ONLY: (True, True, False, False, False, False),
    "postgres_before_commit": (True, True, True, True, False, False),
    # every derived output holds the batch, the table not: between_table_commits's state
    # (that point is in the plain matrix)
    "postgres_after_commit": (True, True, True, True, True, False),
}


def derived_held(config: Any, app_id: str, batch_id: int) -> tuple[bool, ...]:
    """Whether each output (quarantine, derived ones, table) holds `batch_id` by its own
    app transaction version."""

    def at(uri: str, app: str) -> bool:
        if not DeltaTable.is_deltatable(uri):
            return False
        return (DeltaTable(uri).transaction_version(app) or 0) >= batch_id

    def output(spec: Any) -> bool:
        if isinstance(spec, PostgresOutput):
            return (postgres_held(spec, app_id) or 0) >= batch_id
        return at(spec.table_uri, spec.app_id(app_id))

    return (
        at(config.delta.quarantine_uri, app_id),
        *(output(spec) for spec in config.derived),
        at(config.delta.table_uri, app_id),
    )


@pytest.mark.parametrize(
    "point",
    # one derived output holding the batch: `make test-wide` (tests/test_restage_pipeline.py
    # and tests/test_crash_backfill.py kill there in `make test`)
    [
        pytest.param(p, marks=pytest.mark.wide) if p == FIRST_DERIVED_ONLY else p
        for p in DERIVED_HELD
    ],
)
def test_derived_outputs_crash_then_restart_with_and_without_the_ledger(
    point: str,
    spark: Any,
    kafka_client: Any,
    pipeline_factory: Any,
    postgres_url: str,
    tmp_path: Path,
) -> None:
    """A crash between the commits of a batch's outputs leaves some holding it: recovery
    with the ledger kept publishes to the others (each output skips by its own version);
    with the ledger lost, the logs that hold the batch re-create it to be re-staged over
    its ranges and published to the outputs that lack it. Either way every record is once
    in the table or the quarantine and every derived output equals its recomputation."""
    # the PostgreSQL output last of the derived ones, on the suite's server
    dashboard = postgres_output(postgres_url, f"views_{uuid.uuid4().hex[:12]}")
    derived = [*derived_outputs(tmp_path / "derived"), dashboard]
    config = pipeline_factory(3, transform=TRANSFORM, derived=derived)
    topic = config.kafka.topic
    kafka_client.produce_records(topic, user_events(0, 300, 3, malformed_every=20))
    live_restart(config, spark)  # batch 1
    kafka_client.produce_records(topic, user_events(300, 150, 3, malformed_every=20))

    crash_run(config, point)
    crashed = crashed_batch(config, config.app_id)
    assert (crashed.batch_id, crashed.state) == (2, S.PREPARED)
    assert derived_held(config, config.app_id, 2) == DERIVED_HELD[point]
    kafka_client.produce_records(topic, user_events(450, 60, 3, malformed_every=20))
    lost = without_ledger(config, tmp_path / "ledger-lost")

    for restarted in (config, lost):
        live_restart(restarted, spark)
        table, quarantined = assert_exactly_once(restarted, kafka_client)
        assert table + quarantined == 510
        assert_derived_match(restarted)
        store = LedgerStore(restarted.ledger.url)
        try:
            again = store.get(restarted.app_id, 2)
        finally:
            store.dispose()
        assert again is not None and again.state in (S.COMMITTED, S.ACKED)
        # a batch some output holds is finished over its own ranges, never planned again
        assert again.ranges == crashed.ranges
        assert all(derived_held(restarted, restarted.app_id, 2))
