"""Crash tests: a real `exactly run` child process dies with os._exit at each crash point
of docs/protocol.md, then the pipeline restarts and the table must hold every record once."""

from __future__ import annotations

from typing import Any

import pytest
from deltalake import DeltaTable

from jobs.examples.sample_data import pageviews
from jobs.pipeline import build
from ledger.crash import POINTS
from ledger.protocol import BatchState
from ledger.store import LedgerStore
from tests.fixtures.pipeline import assert_exactly_once, crash_run

#: crash point -> the state the batch is left in when the process dies there
LEFT_IN = {
    "after_plan": BatchState.PLANNED,
    "during_stage": BatchState.PLANNED,
    "after_stage": BatchState.STAGED,
    "after_prepare": BatchState.PREPARED,
    "after_delta_commit": BatchState.PREPARED,
    "after_committed": BatchState.COMMITTED,
}


def restart(config: Any, spark: Any) -> list[Any]:
    tpc = build(config, spark_factory=lambda: spark)
    tpc.recover_and_commit()
    reports = []
    while (report := tpc.run_batch()) is not None:
        reports.append(report)
    return reports


def test_every_protocol_crash_point_is_tested() -> None:
    assert set(LEFT_IN) | {"recovery_after_delta_commit"} == set(POINTS)


@pytest.mark.parametrize("point", sorted(LEFT_IN))
def test_crash_then_restart_keeps_exactly_once(
    point: str, spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    config = pipeline_factory(3, max_records=300)
    kafka_client.produce(config.kafka.topic, pageviews(1500, malformed_every=70))
    tpc = build(config, spark_factory=lambda: spark)
    tpc.recover_and_commit()
    assert tpc.run_batch() is not None  # history before the crash

    crash_run(config, point)
    store = LedgerStore(config.ledger.url)
    crashed = store.get(config.app_id, 2)
    assert crashed is not None and crashed.state is LEFT_IN[point]
    table_had_it = DeltaTable(config.delta.table_uri).transaction_version(config.app_id) == 2
    assert table_had_it == (point in ("after_delta_commit", "after_committed"))

    restart(config, spark)
    table, quarantined = assert_exactly_once(config, kafka_client)
    assert table + quarantined == 1500
    after = store.get(config.app_id, 2)
    assert after is not None
    expected = (
        BatchState.ABORTED
        if LEFT_IN[point] in (BatchState.PLANNED, BatchState.STAGED)
        else BatchState.ACKED
    )
    assert after.state is expected


def test_crash_during_recovery_itself(spark: Any, kafka_client: Any, pipeline_factory: Any) -> None:
    config = pipeline_factory(2, max_records=500)
    kafka_client.produce(config.kafka.topic, pageviews(800, malformed_every=33))
    crash_run(config, "after_prepare")
    # the next start recovers the prepared batch, publishes it, and dies before the ledger
    # learns it: the table has the batch, the ledger still says PREPARED
    crash_run(config, "recovery_after_delta_commit")
    store = LedgerStore(config.ledger.url)
    batch = store.get(config.app_id, 1)
    assert batch is not None and batch.state is BatchState.PREPARED and batch.attempt == 2
    assert DeltaTable(config.delta.table_uri).transaction_version(config.app_id) == 1

    restart(config, spark)
    table, quarantined = assert_exactly_once(config, kafka_client)
    assert table + quarantined == 800
    final = store.get(config.app_id, 1)
    assert final is not None and final.state is BatchState.ACKED and final.attempt == 3
