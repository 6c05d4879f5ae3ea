"""The coordinator's liveness rules (ledger/coordinator/two_phase.py) and the stuck sensor's
decisions,
as pure logic: in-memory fakes of Kafka, Spark and Delta with a real SQLite ledger, as in
tests/test_two_phase.py. The same behaviour against the real broker, Spark, Delta and Dagster
is in tests/test_edge_liveness.py.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ledger.coordinator.two_phase import TwoPhaseCommit
from ledger.core.batch import Batch, utcnow
from ledger.core.errors import ConfigError, ExactlyError
from ledger.core.protocol import Available, BatchState, OffsetRange, Owner
from ledger.core.stuck import decide_stuck
from ledger.store.ledger_store import LedgerStore
from orchestration.health.stuck_sensor import Cursor, decide_ack, decide_blocked
from resources.config.loading import parse_config
from tests.fixtures.batches import a_batch
from tests.fixtures.fakes import FakePublisher, FakeSource, FakeStager
from tests.test_two_phase import dead_pid, plan_as

S = BatchState
APP = "pageviews"
TOPIC = "pageviews"


@dataclass
class RefusingSource(FakeSource):
    """A consumer group that refuses commits while `refusing` (active members, no ACL)."""

    refusing: bool = False

    def ack(self, ranges: Sequence[OffsetRange]) -> None:
        if self.refusing:
            raise ExactlyError("Kafka at k:9092: committing offsets of group 'g' failed: busy")
        super().ack(ranges)


@pytest.fixture
def source() -> RefusingSource:
    return RefusingSource({0: Available(0, 100), 1: Available(0, 100)})


@pytest.fixture
def publisher() -> FakePublisher:
    return FakePublisher()


def coordinator(
    store: LedgerStore, source: FakeSource, publisher: FakePublisher, **kw: Any
) -> TwoPhaseCommit:
    return TwoPhaseCommit(
        store,
        pipeline="pv",
        app_id=APP,
        source=source,
        stager=FakeStager(disk=publisher.disk),
        publisher=publisher,
        max_records_per_partition=10,
        **kw,
    )


@pytest.fixture
def tpc(store: LedgerStore, source: RefusingSource, publisher: FakePublisher) -> TwoPhaseCommit:
    return coordinator(store, source, publisher)


# -- abandoning the batches of dead runs ---------------------------------------------------


@pytest.mark.parametrize("state", [S.PLANNED, S.STAGED])
def test_abandon_dead_aborts_a_dead_owners_batch_and_the_next_plans_its_ranges(
    tpc: TwoPhaseCommit, store: LedgerStore, state: BatchState
) -> None:
    dead = plan_as(store, Owner(socket.gethostname(), dead_pid()), state)
    abandoned = tpc.abandon_dead()
    assert [(b.batch_id, b.state) for b in abandoned] == [(1, S.ABORTED)]
    assert "abandoned" in (abandoned[0].error or "")
    assert tpc.abandon_dead() == []
    report = tpc.run_batch()
    assert report is not None and report.batch.batch_id == 2
    assert report.batch.ranges[0].start == dead.ranges[0].start


def test_abandon_dead_leaves_live_owners_and_running_runs_alone(
    tpc: TwoPhaseCommit, store: LedgerStore
) -> None:
    plan_as(store, Owner(socket.gethostname(), os.getppid()), S.STAGED)  # alive
    assert tpc.abandon_dead() == []
    assert store.get(APP, 1).state is S.STAGED  # type: ignore[union-attr]

    store.transition(store.get(APP, 1), S.ABORTED, error="test")  # type: ignore[arg-type]
    plan_as(store, Owner(socket.gethostname(), dead_pid()))
    seen: list[int] = []

    def still_running(batch: Batch) -> bool:
        seen.append(batch.batch_id)
        return True

    assert tpc.abandon_dead(still_running) == []
    assert seen == [2]
    assert store.get(APP, 2).state is S.PLANNED  # type: ignore[union-attr]


def test_abandon_dead_skips_a_batch_that_moved_on_meanwhile(
    tpc: TwoPhaseCommit, store: LedgerStore
) -> None:
    plan_as(store, Owner(socket.gethostname(), dead_pid()))

    def moves_on(batch: Batch) -> bool:
        store.transition(batch, S.STAGED)  # the owner was slow, not dead
        return False

    assert tpc.abandon_dead(moves_on) == []
    assert store.get(APP, 1).state is S.STAGED  # type: ignore[union-attr]


# -- the advisory ack ----------------------------------------------------------------------


def test_a_refused_ack_leaves_a_complete_batch_and_the_next_one_runs(
    tpc: TwoPhaseCommit, store: LedgerStore, source: RefusingSource, publisher: FakePublisher
) -> None:
    source.refusing = True
    first = tpc.run_batch()
    assert first is not None
    assert first.batch.state is S.COMMITTED
    assert "busy" in first.batch.metrics["ack_error"]
    assert first.batch.metrics["ack_failures"] == 1
    assert first.batch.metrics["ack_failures_in_a_row"] == 1
    second = tpc.run_batch()  # COMMITTED does not block planning
    assert second is not None and second.batch.batch_id == 2
    assert second.batch.metrics["ack_failures_in_a_row"] == 2
    retried = tpc.recover_and_commit()  # recovery retries both acks, refused again
    assert [(b.batch_id, b.state, b.metrics["ack_failures"]) for b in retried] == [
        (1, S.COMMITTED, 2),
        (2, S.COMMITTED, 2),
    ]
    assert tpc.ack_failures_in_a_row() == 4
    assert [b.batch_id for b in tpc.refused_acks()] == [1, 2]
    assert publisher.published_ids() == [1, 2]
    assert source.acks == []


def test_the_next_successful_ack_catches_up_and_never_moves_the_group_back(
    tpc: TwoPhaseCommit, store: LedgerStore, source: RefusingSource
) -> None:
    source.refusing = True
    reports = [tpc.run_batch() for _ in range(2)]
    stale_first = reports[0].batch  # type: ignore[union-attr]
    source.refusing = False
    third = tpc.run_batch()
    assert third is not None and third.batch.state is S.ACKED
    newest_ends = [OffsetRange(TOPIC, p, 20, 30) for p in (0, 1)]
    assert source.acks == [newest_ends]
    states = {b.batch_id: (b.state, b.metrics.get("acked_to_batch")) for b in store.batches()}
    assert states == {1: (S.ACKED, 3), 2: (S.ACKED, 3), 3: (S.ACKED, 3)}
    assert tpc.ack_failures_in_a_row() == 0

    # a zombie acks batch 1 late: the group is sent batch 3's ends again, never batch 1's,
    # and the zombie learns its batch is acked already
    late = tpc.ack(stale_first)
    assert (late.state, late.metrics["acked_to_batch"]) == (S.ACKED, 3)
    assert source.acks == [newest_ends, newest_ends]


def test_an_ack_racing_a_newer_commit_leaves_the_group_at_the_newer_ends(
    tpc: TwoPhaseCommit, store: LedgerStore, source: RefusingSource, publisher: FakePublisher
) -> None:
    """Batch 1's ack is slow; meanwhile batch 2 is committed and acked by another process,
    whose group commit lands before batch 1's: batch 1's ack must not leave the group back."""
    other = coordinator(store, source, publisher)
    first = tpc.commit(tpc.pre_commit(*tpc.invoke(tpc.begin())))  # type: ignore[arg-type]
    real_ack = source.ack
    raced: list[bool] = []

    def slow_ack(ranges: Sequence[OffsetRange]) -> None:
        if not raced:  # batch 1's commit to the group is still on its way...
            raced.append(True)
            second = other.commit(other.pre_commit(*other.invoke(other.begin())))  # type: ignore[arg-type]
            other.ack(second)  # ...when batch 2's lands
        real_ack(ranges)

    source.ack = slow_ack  # type: ignore[method-assign]
    acked = tpc.ack(first)
    assert acked.state is S.ACKED
    ends = [r.end for r in source.acks[-1]]
    assert ends == [20, 20], source.acks
    assert {b.batch_id: b.state for b in store.batches()} == {1: S.ACKED, 2: S.ACKED}


def test_acking_an_older_batch_moves_the_group_to_the_newest_committed(
    tpc: TwoPhaseCommit, store: LedgerStore, source: RefusingSource
) -> None:
    source.refusing = True
    assert tpc.run_batch() is not None
    assert tpc.run_batch() is not None
    source.refusing = False
    acked = tpc.redrive(1)
    assert acked is not None and acked.state is S.ACKED
    assert source.acks == [[OffsetRange(TOPIC, p, 10, 20) for p in (0, 1)]]
    assert store.get(APP, 2).state is S.ACKED  # type: ignore[union-attr]


def test_a_refused_ack_is_retried_after_ack_retry_seconds_not_at_once(
    store: LedgerStore, source: RefusingSource, publisher: FakePublisher
) -> None:
    source.refusing = True
    patient = coordinator(store, source, publisher, ack_retry_seconds=3600)
    report = patient.run_batch()
    assert report is not None
    batch = store.get(APP, 1)
    assert batch is not None
    assert not patient.needs_redrive(batch)
    eager = coordinator(store, source, publisher, ack_retry_seconds=0.001)
    assert eager.needs_redrive(batch)


def test_a_voted_batch_of_a_dead_run_needs_a_redrive(
    tpc: TwoPhaseCommit, store: LedgerStore
) -> None:
    planned = plan_as(store, Owner(socket.gethostname(), dead_pid()), S.STAGED)
    prepared = store.transition(planned, S.PREPARED)
    assert tpc.needs_redrive(prepared)
    assert not tpc.needs_redrive(planned)  # not voted: abandoned, never re-driven


# -- the stuck sensor's decisions ----------------------------------------------------------


def batch(
    batch_id: int, state: BatchState, in_state_s: float, metrics: dict[str, Any] | None = None
) -> Batch:
    """A batch that entered `state` `in_state_s` seconds ago (every timestamp that far back)."""
    return a_batch(batch_id, state, in_state_s=in_state_s, metrics=metrics or {})


@pytest.mark.parametrize("state", [S.PLANNED, S.STAGED, S.PREPARED, S.COMMITTED])
def test_any_state_that_is_not_final_alerts_once_past_the_threshold(state: BatchState) -> None:
    old, young = batch(1, state, 600), batch(2, state, 10)
    first = decide_stuck({}, [old, young], {}, utcnow(), 300)
    assert [b.batch_id for b in first.stuck] == [1]
    assert first.open_after == {"pv/1": str(state)}
    again = decide_stuck(first.open_after, [old, young], {"pv/1": old}, utcnow(), 300)
    assert again.stuck == [] and again.resolved == []


def test_a_batch_resolves_when_it_leaves_the_state_it_was_alerted_in() -> None:
    opened = {"pv/1": "PLANNED"}
    staged = batch(1, S.STAGED, 0)
    moved = decide_stuck(opened, [staged], {"pv/1": staged}, utcnow(), 300)
    assert [(b.state, was) for b, was in moved.resolved] == [(S.STAGED, S.PLANNED)]
    assert moved.open_after == {}
    gone = decide_stuck(opened, [], {"pv/1": None}, utcnow(), 300)
    assert gone.resolved == [] and gone.open_after == {}


def test_a_refused_ack_does_not_alert_as_stuck_the_ack_alert_speaks_for_it() -> None:
    refused = batch(1, S.COMMITTED, 3600, {"ack_error": "busy", "ack_failures": 1})
    assert decide_stuck({}, [refused], {}, utcnow(), 300).stuck == []


def test_the_ack_alert_opens_once_at_the_threshold_and_resolves_once() -> None:
    assert decide_ack(False, 2, 3) == decide_ack(False, 0, 3)
    assert not decide_ack(False, 2, 3).alert
    opened = decide_ack(False, 3, 3)
    assert opened.alert and opened.open_after
    held = decide_ack(True, 5, 3)
    assert not held.alert and not held.resolve and held.open_after
    closed = decide_ack(True, 0, 3)
    assert closed.resolve and not closed.open_after


def test_the_cursor_of_the_former_prepared_only_sensor_is_read() -> None:
    assert Cursor.loads('["pv/3", "pv.backfill/1"]') == Cursor(
        {"pv/3": "PREPARED", "pv.backfill/1": "PREPARED"}
    )
    assert Cursor.loads(None) == Cursor()
    cursor = Cursor({"pv/4": "STAGED"}, ack_alert_open=True)
    assert Cursor.loads(cursor.dumps()) == cursor


# -- configuration -------------------------------------------------------------------------


def config_with(alerts: dict[str, Any], tmp_path: Path) -> Any:
    return parse_config(
        {
            "pipeline": "pv",
            "kafka": {"bootstrap_servers": "127.0.0.1:9", "topic": TOPIC},
            "delta": {"table_uri": str(tmp_path / "t"), "quarantine_uri": str(tmp_path / "q")},
            "alerts": alerts,
        }
    )


def test_stuck_after_seconds_and_its_former_name(tmp_path: Path) -> None:
    assert config_with({}, tmp_path).alerts.stuck_after_seconds == 300
    assert config_with({"stuck_after_seconds": 60}, tmp_path).alerts.stuck_after_seconds == 60
    former = config_with({"stuck_prepared_after_seconds": 90}, tmp_path)
    assert former.alerts.stuck_after_seconds == 90
    with pytest.raises(ConfigError, match="give stuck_after_seconds only"):
        config_with({"stuck_after_seconds": 1, "stuck_prepared_after_seconds": 2}, tmp_path)
    with pytest.raises(ConfigError, match=r"alerts\.ack_failures_before_alert"):
        config_with({"ack_failures_before_alert": 0}, tmp_path)


def test_a_blocked_pipeline_alerts_once_per_reason_and_resolves_once() -> None:
    """A changed topic stops planning with no batch in flight (invariant 10): the stuck
    sensor must say so once, again only if the reason changes, and resolve once."""
    opened = decide_blocked(None, "topic t: ids differ", known=True)
    assert (opened.alert, opened.resolve, opened.open_after) == (True, False, "topic t: ids differ")
    held = decide_blocked("topic t: ids differ", "topic t: ids differ", known=True)
    assert (held.alert, held.resolve) == (False, False)
    changed = decide_blocked("topic t: ids differ", "topic t: other ids", known=True)
    assert changed.alert and changed.open_after == "topic t: other ids"
    unknown = decide_blocked("topic t: ids differ", None, known=False)
    assert (unknown.alert, unknown.resolve, unknown.open_after) == (
        False,
        False,
        "topic t: ids differ",
    )
    closed = decide_blocked("topic t: ids differ", None, known=True)
    assert (closed.alert, closed.resolve, closed.open_after) == (False, True, None)
    assert decide_blocked(None, None, known=True) == decide_blocked(None, None, known=False)
    cursor = Cursor({}, blocked="topic t: ids differ")
    assert Cursor.loads(cursor.dumps()) == cursor
