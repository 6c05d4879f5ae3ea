"""Liveness is judged by the ledger database's clock (invariant 17), on a real SQLite file and a
real PostgreSQL database (`ledger_url`).

A batch's heartbeat is written by one host and judged by another: the run worker that stages
it, and the schedule tick or recovery that decides whether to abandon it. If each stamps and
compares with its own clock, a skew of minutes between the two makes a live attempt look dead
(it is abandoned mid-stage, over and over) or a dead one look alive (the pipeline waits for
it long past its lease). Here one "host" writes with its clock skewed, as its store would,
and another judges.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from jobs.wiring.pipeline import Pipeline
from ledger.coordinator.two_phase import TwoPhaseCommit
from ledger.core import batch as batch_module
from ledger.core.batch import Batch
from ledger.core.protocol import Available, BatchState, OffsetRange, Owner
from ledger.store.ledger_store import LedgerStore
from orchestration.health.stuck_sensor import evaluate_stuck
from resources.alerts.webhook import AlertsResource
from resources.config.loading import parse_config
from tests.fixtures.fakes import FakeSource, wired

APP = "pageviews"
TOPIC = "pageviews"
ELSEWHERE = Owner("another-host.invalid", 4242)
TEN_MINUTES = 600.0
_real_utcnow = batch_module.utcnow


def skew_clock(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """This process's clock runs `seconds` off from now on: every ledger and orchestration
    module that reads the local clock reads the skewed one."""

    def skewed() -> datetime:
        return _real_utcnow() + timedelta(seconds=seconds)

    modules = (
        "ledger.core.batch",
        "ledger.store.ledger_store",
        "ledger.coordinator.two_phase",
        "orchestration.health.stuck_sensor",
    )
    for module in modules:
        monkeypatch.setattr(f"{module}.utcnow", skewed, raising=False)


@pytest.fixture
def store(ledger_url: str) -> Iterator[LedgerStore]:
    ledger = LedgerStore(ledger_url)
    try:
        yield ledger
    finally:
        ledger.dispose()


def judge(store: LedgerStore, lease_seconds: float) -> TwoPhaseCommit:
    """The coordinator of the process that decides: a schedule tick, a recovery."""
    stager, publisher = wired()
    return TwoPhaseCommit(
        store,
        pipeline="pv",
        app_id=APP,
        source=FakeSource({0: Available(0, 100)}),
        stager=stager,
        publisher=publisher,
        max_records_per_partition=10,
        lease_seconds=lease_seconds,
    )


def plan_elsewhere(store: LedgerStore) -> Batch:
    """Batch 1, planned by a process on another host, which then renews its lease once."""
    batch = store.plan(
        pipeline="pv",
        app_id=APP,
        kind="live",
        owner=ELSEWHERE,
        ranges_for=lambda _positions: [OffsetRange(TOPIC, 0, 0, 10)],
    )
    assert batch is not None
    store.heartbeat(batch)
    return batch


def current(store: LedgerStore) -> Batch:
    found = store.get(APP, 1)
    assert found is not None
    return found


@pytest.mark.parametrize(
    ("writer_skew", "judge_skew"),
    [(-TEN_MINUTES, 0.0), (0.0, TEN_MINUTES)],
    ids=["writer-clock-behind", "judge-clock-ahead"],
)
def test_a_heartbeat_just_written_is_alive_whatever_the_two_hosts_clocks_say(
    store: LedgerStore, monkeypatch: pytest.MonkeyPatch, writer_skew: float, judge_skew: float
) -> None:
    with monkeypatch.context() as writer:
        skew_clock(writer, writer_skew)
        plan_elsewhere(store)
    skew_clock(monkeypatch, judge_skew)
    assert judge(store, lease_seconds=120).may_be_alive(current(store)), (
        "a heartbeat renewed a moment ago was judged older than the 120 s lease"
    )


@pytest.mark.parametrize(
    ("writer_skew", "judge_skew"),
    [(TEN_MINUTES, 0.0), (0.0, -TEN_MINUTES)],
    ids=["writer-clock-ahead", "judge-clock-behind"],
)
def test_a_silent_owner_is_dead_once_its_lease_ran_out_whatever_the_clocks_say(
    store: LedgerStore, monkeypatch: pytest.MonkeyPatch, writer_skew: float, judge_skew: float
) -> None:
    with monkeypatch.context() as writer:
        skew_clock(writer, writer_skew)
        plan_elsewhere(store)
    time.sleep(1.0)
    skew_clock(monkeypatch, judge_skew)
    assert not judge(store, lease_seconds=0.5).may_be_alive(current(store)), (
        "an owner silent for 1 s was still judged alive under a 0.5 s lease"
    )


def test_ledger_timestamps_come_from_the_database_clock(
    store: LedgerStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every timestamp the store writes is the database's, so every age compares like with
    like, whichever host wrote the row."""
    skew_clock(monkeypatch, -TEN_MINUTES)
    before = store.now()
    batch = plan_elsewhere(store)
    for target in (BatchState.STAGED, BatchState.PREPARED, BatchState.COMMITTED):
        batch = store.transition(batch, target, table_version=1)
    batch = store.takeover(batch)
    after = store.now()
    stamps = {
        "created_at": batch.created_at,
        "heartbeat_at": batch.heartbeat_at,
        "updated_at": batch.updated_at,
        "prepared_at": batch.prepared_at,
        "committed_at": batch.committed_at,
    }
    wrong = {k: v for k, v in stamps.items() if v is None or not before <= v <= after}
    assert not wrong, f"not within the database's [{before}, {after}]: {wrong}"


@pytest.mark.parametrize(
    ("writer_skew", "judge_skew"),
    [(-TEN_MINUTES, 0.0), (0.0, TEN_MINUTES)],
    ids=["writer-clock-behind", "judge-clock-ahead"],
)
def test_stuck_ages_are_measured_by_the_database_clock(
    ledger_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    writer_skew: float,
    judge_skew: float,
) -> None:
    """A batch that voted a moment ago is not stuck, whichever host's clock is off."""
    config = parse_config(
        {
            "pipeline": APP,
            "kafka": {"bootstrap_servers": "127.0.0.1:9", "topic": TOPIC},
            "delta": {"table_uri": str(tmp_path / "t"), "quarantine_uri": str(tmp_path / "q")},
            "ledger": {"url": ledger_url},
            "alerts": {"stuck_prepared_after_seconds": 300},
        }
    )
    with Pipeline(config) as pipeline:
        with monkeypatch.context() as writer:
            skew_clock(writer, writer_skew)
            batch = plan_elsewhere(pipeline.store)
            batch = pipeline.store.transition(batch, BatchState.STAGED)
            pipeline.store.transition(batch, BatchState.PREPARED)
        skew_clock(monkeypatch, judge_skew)
        sent: list[str] = []
        decision, _cursor = evaluate_stuck(pipeline, AlertsResource(), None, sent.append)
    assert decision.stuck == [], f"a batch that voted a moment ago was alerted: {sent}"
    assert sent == []
