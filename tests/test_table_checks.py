"""The lineage and the tables' asset checks, without a server: the definitions draw the topic
upstream of the table and the quarantine with the checks on them, the checks judge what
they read, and a failing check alerts once and resolves once."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import yaml

from ledger.core.batch import Batch, utcnow
from ledger.core.protocol import BatchState, OffsetRange
from orchestration.health.checks_sensor import decide_checks
from orchestration.health.table_checks import (
    CONSUMER_LAG,
    LAST_BATCH_COMPLETE,
    NO_STUCK_BATCH,
    QUARANTINE_RATIO,
    Verdict,
    judge_lag,
    judge_ratio,
    judge_rows,
    judge_stuck,
    other_incarnations,
)
from orchestration.pipeline_definitions import pipeline_definitions
from tests.fixtures.batches import a_batch

S = BatchState
CHECKS = [NO_STUCK_BATCH, CONSUMER_LAG, LAST_BATCH_COMPLETE, QUARANTINE_RATIO]


def batch(
    batch_id: int, state: BatchState, in_state_s: float, metrics: dict[str, Any] | None = None
) -> Batch:
    """A batch of pipeline `pv` that entered `state` `in_state_s` seconds ago."""
    then = utcnow() - timedelta(seconds=in_state_s)
    return a_batch(
        batch_id,
        state,
        at=then,
        committed_at=then if state in (S.COMMITTED, S.ACKED) else None,
        ranges=(OffsetRange("pv", 0, 100, 200),),
        metrics=metrics or {},
    )


# -- the definitions -----------------------------------------------------------------------


def test_the_lineage_has_the_topic_upstream_of_the_table_and_the_quarantine(
    tmp_path: Path,
) -> None:
    path = tmp_path / "orders.yaml"
    doc = {
        "pipeline": "orders",
        "kafka": {"bootstrap_servers": "127.0.0.1:9", "topic": "orders-events"},
        "delta": {"table_uri": "t", "quarantine_uri": "q"},
    }
    path.write_text(yaml.safe_dump(doc))
    defs = pipeline_definitions(path).definitions
    graph = defs.resolve_asset_graph()
    topic, table, quarantine = (
        dg.AssetKey(f"orders_{n}") for n in ("topic", "table", "quarantine")
    )
    assert graph.get_all_asset_keys() == {topic, table, quarantine}
    assert graph.get(topic).parent_keys == set()
    assert graph.get(table).parent_keys == {topic}
    assert graph.get(quarantine).parent_keys == {topic}
    assert graph.get(topic).kinds == {"kafka"}
    assert graph.get(table).kinds == graph.get(quarantine).kinds == {"delta"}
    assert not graph.get(topic).is_materializable  # external: exactly only reads it
    assert graph.get(quarantine).partitions_def == graph.get(table).partitions_def
    assert graph.get(table).check_keys == {
        dg.AssetCheckKey(table, NO_STUCK_BATCH),
        dg.AssetCheckKey(table, CONSUMER_LAG),
        dg.AssetCheckKey(table, "fresh_within_bound"),
        dg.AssetCheckKey(table, LAST_BATCH_COMPLETE),
    }
    assert graph.get(quarantine).check_keys == {dg.AssetCheckKey(quarantine, QUARANTINE_RATIO)}
    sensor = defs.resolve_sensor_def("orders_checks_sensor")
    assert sensor.default_status is dg.DefaultSensorStatus.STOPPED


# -- the verdicts --------------------------------------------------------------------------


def test_a_batch_past_the_stuck_threshold_in_any_state_that_is_not_final_fails() -> None:
    now = utcnow()
    young = [batch(1, state, 10) for state in (S.PLANNED, S.STAGED, S.PREPARED, S.COMMITTED)]
    assert judge_stuck("pv", young, now, 300).passed
    old = batch(7, S.PREPARED, 600)
    verdict = judge_stuck("pv", [*young, old], now, 300)
    assert not verdict.passed
    assert "pv/7 PREPARED 10.0 min" in verdict.text
    assert verdict.metadata["stuck_batches"] == 1
    assert verdict.metadata["oldest_stuck_seconds"] >= 600
    # a COMMITTED batch whose ack the group refused is the ack alert's, as in the stuck alert
    refused = batch(8, S.COMMITTED, 600, {"ack_error": "group has active members"})
    assert judge_stuck("pv", [refused], now, 300).passed


def test_lag_is_judged_against_its_bound_and_shown_as_numbers() -> None:
    unbounded = judge_lag("pv", {0: 40, 1: 2}, None)
    assert unbounded.passed and "42" in unbounded.text
    assert unbounded.metadata == {"total_lag": 42, "lag_partition_0": 40, "lag_partition_1": 2}
    assert judge_lag("pv", {0: 40, 1: 2}, 42).passed
    over = judge_lag("pv", {0: 40, 1: 3}, 42)
    assert not over.passed and "43" in over.text and "alerts.max_consumer_lag 42" in over.text


def test_the_quarantine_ratio_of_the_last_batch_is_judged_against_its_bound() -> None:
    counts = {"records_read": 200, "quarantine_records": 50}
    last = batch(3, S.ACKED, 5, counts)
    over = judge_ratio("pv", last, 0.1)
    assert over is not None and not over.passed
    assert over.asset == dg.AssetKey("pv_quarantine")
    assert over.metadata["quarantine_ratio"] == 0.25 and "25.00%" in over.text
    within = judge_ratio("pv", last, 0.25)
    assert within is not None and within.passed
    unbounded = judge_ratio("pv", last, None)
    assert unbounded is not None and unbounded.passed
    empty = judge_ratio("pv", batch(4, S.ACKED, 5, {"records_read": 0, "quarantine_records": 0}), 0)
    assert empty is not None and empty.passed
    assert judge_ratio("pv", None, 0.1).passed  # type: ignore[union-attr]
    # rebuilt from the Delta log: no counts, no verdict rather than a guess
    assert judge_ratio("pv", batch(5, S.ACKED, 5), 0.1) is None


def test_the_last_batch_is_complete_only_when_both_tables_hold_what_it_read() -> None:
    last = batch(3, S.ACKED, 5, {"records_read": 100, "quarantine_records": 4})
    whole = judge_rows("pv", last, 96, 4)
    assert whole is not None and whole.passed
    for table_rows, quarantine_rows in ((95, 4), (97, 4), (96, 3), (96, 5)):
        broken = judge_rows("pv", last, table_rows, quarantine_rows)
        assert broken is not None and not broken.passed, (table_rows, quarantine_rows)
        assert f"{table_rows} rows in the table (expected 96)" in broken.text
        assert "pv-0[100,200)" in broken.text  # what a replace backfill would rewrite
    assert judge_rows("pv", batch(5, S.ACKED, 5), 1, 0) is None


# -- the alerts ----------------------------------------------------------------------------


def verdict(check: str, passed: bool) -> Verdict:
    return Verdict(check, dg.AssetKey("pv_table"), passed, f"{check} {passed}", {})


def test_a_failing_check_alerts_once_and_resolves_once() -> None:
    failing = [verdict(c, c != LAST_BATCH_COMPLETE) for c in CHECKS]
    first = decide_checks([], CHECKS, failing)
    assert [v.check for v in first.failed] == [LAST_BATCH_COMPLETE] and first.resolved == []
    assert first.open_after == [LAST_BATCH_COMPLETE]
    again = decide_checks(first.open_after, CHECKS, failing)
    assert again.failed == again.resolved == [] and again.open_after == first.open_after
    # no verdict (Kafka unreachable, counts unknown): nothing changes
    unknown = decide_checks(first.open_after, CHECKS, [])
    assert unknown.failed == unknown.resolved == [] and unknown.open_after == first.open_after
    passing = [verdict(c, True) for c in CHECKS]
    healed = decide_checks(again.open_after, CHECKS, passing)
    assert healed.failed == [] and [v.check for v in healed.resolved] == [LAST_BATCH_COMPLETE]
    assert healed.open_after == []
    assert decide_checks(healed.open_after, CHECKS, passing).resolved == []


def test_rows_of_another_topic_incarnation_at_the_same_coordinates_are_left_out() -> None:
    """A re-created topic's offsets start again at 0: the old incarnation's rows sit at the
    coordinates of the new one's, and only the topic id tells them apart."""
    last = replace(batch(9, S.ACKED, 5), topic_id="new")  # pv-0 [100, 200)
    old = replace(batch(2, S.ACKED, 500), topic_id="old")  # the same coordinates
    elsewhere = replace(old, batch_id=3, ranges=(OffsetRange("pv", 0, 200, 300),))
    other_partition = replace(old, batch_id=4, ranges=(OffsetRange("pv", 1, 100, 200),))
    same = replace(batch(7, S.ACKED, 50), topic_id="new")
    unknown = batch(1, S.ACKED, 900)  # recorded before topic ids: not told apart
    shared_id = replace(old, app_id="pv.backfill", batch_id=9)
    published = [last, old, elsewhere, other_partition, same, unknown, shared_id]
    assert other_incarnations(last, published) == {2}
    assert other_incarnations(replace(last, topic_id=None), published) == frozenset()


def test_freshness_reports_the_age_and_fails_only_past_its_bound() -> None:
    from datetime import UTC, datetime, timedelta

    from orchestration.health.freshness import FRESHNESS, judge_freshness

    now = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
    newest = (a_batch(4, BatchState.ACKED), now - timedelta(seconds=90))
    never = judge_freshness("pv", None, now, 60)
    assert never.passed and never.check == FRESHNESS
    told = judge_freshness("pv", newest, now, None)
    assert told.passed and told.metadata["staleness_seconds"] == 90
    assert "alerts.max_staleness_seconds" in told.text
    assert judge_freshness("pv", newest, now, 120).passed
    late = judge_freshness("pv", newest, now, 60)
    assert not late.passed and late.text.startswith(
        "the newest committed record (batch pv/4) has Kafka timestamp 2026-11-27T11:58:30+00:00, "
        "90s ago, over the bound of 60s"
    )
