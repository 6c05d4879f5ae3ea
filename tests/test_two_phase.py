"""The coordinator (ledger/coordinator/two_phase.py) against in-memory fakes of Kafka, Spark and
Delta,
with a real SQLite ledger. The tests with the real components live elsewhere."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from ledger.coordinator.two_phase import TwoPhaseCommit
from ledger.core.batch import Batch, BatchKind, StagedFile, utcnow
from ledger.core.errors import (
    BusyError,
    DataLossError,
    FencedError,
    InconsistencyError,
    RefusedBatchError,
)
from ledger.core.ports import StageOutput
from ledger.core.protocol import Available, BatchState, OffsetRange, Owner
from ledger.store.ledger_store import LedgerStore
from tests.fixtures.fakes import TOPIC, FakePublisher, FakeSource, FakeStager

S = BatchState
APP = "pageviews"


# -- fixtures and helpers -----------------------------------------------------------------


@pytest.fixture
def source() -> FakeSource:
    return FakeSource({0: Available(0, 25), 1: Available(5, 12)})


@pytest.fixture
def disk() -> dict[str, int]:
    """The storage the fake stager writes to and the fake publisher reads from."""
    return {}


@pytest.fixture
def stager(disk: dict[str, int]) -> FakeStager:
    return FakeStager(disk=disk)


@pytest.fixture
def publisher(disk: dict[str, int]) -> FakePublisher:
    return FakePublisher(disk=disk)


def coordinator(
    store: LedgerStore,
    source: FakeSource,
    stager: FakeStager,
    publisher: FakePublisher,
    **kw: Any,
) -> TwoPhaseCommit:
    kw.setdefault("max_records_per_partition", 10)
    kw.setdefault("app_id", APP)
    return TwoPhaseCommit(
        store,
        pipeline="pv",
        source=source,
        stager=stager,
        publisher=publisher,
        **kw,
    )


@pytest.fixture
def tpc(
    store: LedgerStore, source: FakeSource, stager: FakeStager, publisher: FakePublisher
) -> TwoPhaseCommit:
    return coordinator(store, source, stager, publisher)


def dead_pid() -> int:
    """A pid that belonged to a process that has exited and been reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    with pytest.raises(ProcessLookupError):
        os.kill(proc.pid, 0)
    return proc.pid


def plan_as(store: LedgerStore, owner: Owner, state: BatchState = S.PLANNED) -> Batch:
    """A batch planned (and maybe staged) by another process, which then went quiet."""
    batch = store.plan(
        pipeline="pv",
        app_id=APP,
        kind="live",
        owner=owner,
        ranges_for=lambda pos: [OffsetRange(TOPIC, 0, pos.get(0, 0), pos.get(0, 0) + 4)],
    )
    assert batch is not None
    if state is S.STAGED:
        batch = store.transition(batch, S.STAGED)
    assert batch.state is state
    return batch


def voted(tpc: TwoPhaseCommit) -> Batch:
    """Plan, stage and vote one batch, then stop as if the process died."""
    batch = tpc.begin()
    assert batch is not None
    batch, output = tpc.invoke(batch)
    return tpc.pre_commit(batch, output)


# -- the happy path -----------------------------------------------------------------------


def test_run_batch_walks_every_state(
    tpc: TwoPhaseCommit,
    store: LedgerStore,
    source: FakeSource,
    stager: FakeStager,
    publisher: FakePublisher,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    moves: list[tuple[BatchState, BatchState]] = []
    original = store.transition

    def recording(batch: Batch, target: BatchState, **kw: Any) -> Batch:
        moved = original(batch, target, **kw)
        moves.append((batch.state, moved.state))
        return moved

    monkeypatch.setattr(store, "transition", recording)
    report = tpc.run_batch()
    assert report is not None
    assert moves == [
        (S.PLANNED, S.STAGED),
        (S.STAGED, S.PREPARED),
        (S.PREPARED, S.COMMITTED),
        (S.COMMITTED, S.ACKED),
    ]
    batch = report.batch
    assert (batch.batch_id, batch.state, batch.attempt) == (1, S.ACKED, 1)
    assert batch.ranges == (OffsetRange(TOPIC, 0, 0, 10), OffsetRange(TOPIC, 1, 5, 12))
    assert batch.table_version == 0
    assert batch.metrics["records_read"] == 17
    assert set(batch.metrics["phase_s"]) == {"plan", "stage", "prepare", "commit", "ack"}
    assert stager.staged == [(1, 1)]
    # exactly the voted files were published, once, and the group acked the batch's ranges
    voted_paths = [f.path for f in store.files(APP, 1)]
    assert voted_paths == [
        f"staging/{APP}/batch=1/attempt=1-{batch.token}/part-0.parquet",
        f"staging/{APP}/batch=1/attempt=1-{batch.token}/part-1.parquet",
    ]
    assert [(c["batch_id"], c["files"]) for c in publisher.commits] == [(1, voted_paths)]
    assert source.acks == [list(batch.ranges)]
    assert "batch 1 ACKED" in report.line()


def test_successive_batches_are_contiguous_until_caught_up(
    tpc: TwoPhaseCommit, store: LedgerStore, source: FakeSource, publisher: FakePublisher
) -> None:
    reports = []
    while (report := tpc.run_batch()) is not None:
        reports.append(report)
        assert len(reports) < 10
    assert [[str(r) for r in rep.batch.ranges] for rep in reports] == [
        ["pageviews-0[0,10)", "pageviews-1[5,12)"],
        ["pageviews-0[10,20)", "pageviews-1[12,12)"],
        ["pageviews-0[20,25)", "pageviews-1[12,12)"],
    ]
    assert publisher.published_ids() == [1, 2, 3]
    assert store.positions(APP) == {0: 25, 1: 12}
    # nothing new: no batch, unless an empty one is asked for
    assert tpc.begin() is None
    assert len(store.batches(app_id=APP)) == 3
    source.offsets[0] = Available(0, 26)
    report = tpc.run_batch()
    assert report is not None
    assert [str(r) for r in report.batch.ranges] == ["pageviews-0[25,26)", "pageviews-1[12,12)"]
    empty = tpc.run_batch(allow_empty=True)
    assert empty is not None
    assert empty.batch.span == 0
    assert empty.batch.state is S.ACKED


def test_backfill_kind_does_not_move_the_consumer_group(
    store: LedgerStore, source: FakeSource, stager: FakeStager, publisher: FakePublisher
) -> None:
    tpc = coordinator(store, source, stager, publisher, kind="backfill")
    report = tpc.run_batch()
    assert report is not None
    assert report.batch.state is S.ACKED
    assert report.batch.kind == "backfill"
    assert source.acks == []


def test_data_loss_before_plan_records_nothing(
    tpc: TwoPhaseCommit, store: LedgerStore, source: FakeSource
) -> None:
    assert tpc.run_batch() is not None
    source.offsets[0] = Available(15, 30)  # retention removed [10, 15)
    with pytest.raises(DataLossError, match=r"pageviews-0: offsets \[10, 15\)"):
        tpc.begin()
    assert [b.batch_id for b in store.batches(app_id=APP)] == [1]


def test_data_loss_before_stage_stages_nothing(
    tpc: TwoPhaseCommit, store: LedgerStore, source: FakeSource, stager: FakeStager
) -> None:
    batch = tpc.begin()
    assert batch is not None
    source.offsets[0] = Available(3, 25)
    with pytest.raises(DataLossError, match=r"\[0, 3\)"):
        tpc.invoke(batch)
    assert stager.staged == []
    assert store.get(APP, 1).state is S.PLANNED  # type: ignore[union-attr]


# -- recovery -----------------------------------------------------------------------------


def test_recover_commits_prepared_batch(
    tpc: TwoPhaseCommit,
    store: LedgerStore,
    source: FakeSource,
    stager: FakeStager,
    publisher: FakePublisher,
) -> None:
    batch = voted(tpc)
    files = store.files(APP, batch.batch_id)
    assert publisher.commits == []

    restarted = coordinator(store, source, stager, publisher)
    finished = restarted.recover_and_commit()
    assert [(b.batch_id, b.state, b.attempt) for b in finished] == [(1, S.ACKED, 2)]
    assert [(c["batch_id"], c["files"]) for c in publisher.commits] == [
        (1, [f.path for f in files])
    ]
    assert source.acks == [list(batch.ranges)]
    assert stager.staged == [(1, 1)]  # nothing was staged again
    # and nothing is left to recover
    assert restarted.recover_and_commit() == []
    assert publisher.published_ids() == [1]


def test_a_recovery_that_loses_the_takeover_race_leaves_the_batch_to_the_winner(
    tpc: TwoPhaseCommit,
    store: LedgerStore,
    source: FakeSource,
    stager: FakeStager,
    publisher: FakePublisher,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two starts recover the same dead batch at once (a continuous run's sweep and an
    `exactly backfill`, two Dagster runs): one takes it over, the other is fenced. The
    loser must not fail (a continuous run would end): the batch is the winner's to finish;
    a start that plans on its application id then waits for it (BusyError) as for any
    batch in flight."""
    voted(tpc)
    real = store.takeover

    def racing(batch: Batch, owner: Any = None) -> Batch:
        real(batch)  # another start takes it over first ...
        return real(batch)  # ... ours, on the copy read before: fenced

    monkeypatch.setattr(store, "takeover", racing)
    restarted = coordinator(store, source, stager, publisher)
    assert restarted.recover_and_commit(wait=False) == []
    left = store.get(APP, 1)
    assert left is not None and (left.state, left.attempt) == (S.PREPARED, 2)
    with pytest.raises(BusyError):
        restarted.recover_and_commit()
    assert publisher.commits == []
    monkeypatch.setattr(store, "takeover", real)
    finished = restarted.recover_and_commit()  # the winner died: the next start finishes it
    assert [(b.batch_id, b.state) for b in finished] == [(1, S.ACKED)]


def test_recover_acks_committed_batch_without_publishing(
    tpc: TwoPhaseCommit, store: LedgerStore, source: FakeSource, publisher: FakePublisher
) -> None:
    batch = tpc.commit(voted(tpc))
    assert batch.state is S.COMMITTED
    assert source.acks == []
    finished = tpc.recover_and_commit()
    assert [(b.batch_id, b.state) for b in finished] == [(1, S.ACKED)]
    assert publisher.published_ids() == [1]
    assert source.acks == [list(batch.ranges)]


def test_recover_after_delta_commit_before_ledger_commit_publishes_nothing_new(
    tpc: TwoPhaseCommit, store: LedgerStore, publisher: FakePublisher
) -> None:
    batch = voted(tpc)
    # the crash point "after_delta_commit": the table has the batch, the ledger says PREPARED
    publisher.publish(batch, store.files(APP, 1))
    assert publisher.published_ids() == [1]
    finished = tpc.recover_and_commit()
    assert [(b.batch_id, b.state) for b in finished] == [(1, S.ACKED)]
    assert publisher.published_ids() == [1]
    assert finished[0].table_version == 0


def test_commit_is_idempotent_against_the_table_version(
    tpc: TwoPhaseCommit, store: LedgerStore, publisher: FakePublisher
) -> None:
    first = voted(tpc)
    fresh = store.takeover(first)
    # two attempts drive the same voted batch: the table gets it once. The replaced attempt
    # is stopped by the ledger before it publishes (invariant 6); a publish that does happen
    # twice (recovery after `after_delta_commit`, or a race past that check) is made a
    # no-op by the table's version, tested on real Delta in tests/test_delta_commit.py
    tpc.commit(fresh)
    with pytest.raises(FencedError, match="it is COMMITTED at attempt 2"):
        tpc.commit(first)
    assert publisher.published_ids() == [1]


def test_commit_needs_prepared(tpc: TwoPhaseCommit, publisher: FakePublisher) -> None:
    batch = tpc.begin()
    assert batch is not None
    with pytest.raises(InconsistencyError, match="commit needs PREPARED, not PLANNED"):
        tpc.commit(batch)
    assert publisher.commits == []


@pytest.mark.parametrize("state", [S.PLANNED, S.STAGED])
def test_recover_aborts_batch_of_dead_owner_and_replans_its_range(
    tpc: TwoPhaseCommit,
    store: LedgerStore,
    publisher: FakePublisher,
    state: BatchState,
) -> None:
    batch = plan_as(store, Owner(socket.gethostname(), dead_pid()), state)
    finished = tpc.recover_and_commit()
    assert [(b.batch_id, b.state) for b in finished] == [(1, S.ABORTED)]
    assert "abandoned by recovery" in (finished[0].error or "")
    assert publisher.commits == []
    report = tpc.run_batch()
    assert report is not None
    assert report.batch.batch_id == 2
    assert report.batch.ranges[0].start == batch.ranges[0].start == 0


def test_an_owner_killed_and_not_yet_reaped_is_gone(
    tpc: TwoPhaseCommit, store: LedgerStore, publisher: FakePublisher
) -> None:
    """A supervisor that has not reaped its killed child leaves a zombie: kill(pid, 0)
    still succeeds, but nothing runs there, so its voted batch is finished at once."""
    child = subprocess.Popen(["sleep", "600"])
    try:
        theirs = store.takeover(voted(tpc), Owner(socket.gethostname(), child.pid))
        child.kill()
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child.pid}/stat").read_text().split(") ")[1][0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        finished = tpc.recover_and_commit()
        assert [(b.batch_id, b.state) for b in finished] == [(1, S.ACKED)]
        assert finished[0].attempt == theirs.attempt + 1
        assert publisher.published_ids() == [1]
    finally:
        child.kill()
        child.wait()


LINUX_PROCFS = Path("/proc/self/stat").exists()


def start_time(pid: int) -> int:
    """Field 22 of /proc/PID/stat: when the process started, in clock ticks since boot."""
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(") ")[2].split()[19])


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


@pytest.mark.skipif(not LINUX_PROCFS, reason="start times are read from Linux's /proc")
@pytest.mark.parametrize("state", [S.PLANNED, S.STAGED, S.PREPARED])
@pytest.mark.parametrize("reused", ["start time", "boot id"])
def test_an_owner_whose_pid_was_reused_is_gone(
    tpc: TwoPhaseCommit,
    store: LedgerStore,
    publisher: FakePublisher,
    state: BatchState,
    reused: str,
) -> None:
    """The owner died and the OS gave its pid to an unrelated process (here a live child,
    recorded with another start time, or as started in another boot): the pid answers, but
    the owner is gone. Its unvoted batch is abandoned, its voted one finished, at once;
    never waited for until the unrelated process exits (on this host no lease ends it)."""
    child = subprocess.Popen(["sleep", "600"])
    try:
        started, boot = start_time(child.pid), boot_id()
        if reused == "start time":
            owner = Owner(socket.gethostname(), child.pid, started=started - 1, boot=boot)
        else:
            owner = Owner(socket.gethostname(), child.pid, started=started, boot=boot[::-1])
        assert Owner.parse(str(owner)) == owner
        if state is S.PREPARED:
            theirs = store.takeover(voted(tpc), owner)
            finished = tpc.recover_and_commit()
            assert [(b.batch_id, b.state) for b in finished] == [(1, S.ACKED)]
            assert finished[0].attempt == theirs.attempt + 1
            assert publisher.published_ids() == [1]
        else:
            plan_as(store, owner, state)
            finished = tpc.recover_and_commit()
            assert [(b.batch_id, b.state) for b in finished] == [(1, S.ABORTED)]
            assert "abandoned by recovery" in (finished[0].error or "")
    finally:
        child.kill()
        child.wait()


@pytest.mark.skipif(not LINUX_PROCFS, reason="start times are read from Linux's /proc")
def test_an_owner_with_its_own_start_time_is_alive(
    tpc: TwoPhaseCommit, store: LedgerStore, publisher: FakePublisher
) -> None:
    """The same pid, start time and boot: the owner itself, still running; its vote is its
    own to finish."""
    child = subprocess.Popen(["sleep", "600"])
    try:
        owner = Owner(
            socket.gethostname(), child.pid, started=start_time(child.pid), boot=boot_id()
        )
        store.takeover(voted(tpc), owner)
        with pytest.raises(BusyError) as info:
            tpc.recover_and_commit()
        assert "PREPARED" in str(info.value)
        assert publisher.commits == []
    finally:
        child.kill()
        child.wait()


def test_an_owner_recorded_without_start_time_on_this_pid_is_this_process(
    tpc: TwoPhaseCommit, store: LedgerStore
) -> None:
    """A row written before owners carried start times (host:pid) keeps today's reading:
    this process's pid there is this process, whose earlier attempt is over."""
    plan_as(store, Owner(socket.gethostname(), os.getpid()), S.STAGED)
    finished = tpc.recover_and_commit()
    assert [(b.batch_id, b.state) for b in finished] == [(1, S.ABORTED)]


def test_recover_refuses_batch_of_live_owner(tpc: TwoPhaseCommit, store: LedgerStore) -> None:
    owner = Owner(socket.gethostname(), os.getppid())
    plan_as(store, owner, S.STAGED)
    with pytest.raises(BusyError) as info:
        tpc.recover_and_commit()
    assert str(owner) in str(info.value)
    assert "STAGED" in str(info.value)
    current = store.get(APP, 1)
    assert current is not None
    assert (current.state, current.attempt) == (S.STAGED, 1)


def test_recover_leaves_a_voted_batch_to_its_live_owner(
    tpc: TwoPhaseCommit, store: LedgerStore, publisher: FakePublisher
) -> None:
    """Two runs started at once: one voted and is about to commit when the other's recovery
    looks. Taking the batch over would be safe (fencing) but would fail the live run."""
    owner = Owner(socket.gethostname(), os.getppid())
    theirs = store.takeover(voted(tpc), owner)
    with pytest.raises(BusyError) as info:
        tpc.recover_and_commit()
    assert str(owner) in str(info.value) and "PREPARED" in str(info.value)
    assert publisher.commits == []
    current = store.get(APP, 1)
    assert current is not None and current.attempt == theirs.attempt
    theirs = tpc.commit(theirs)
    assert tpc.recover_and_commit() == []  # between its commit and its ack: still its own
    assert tpc.ack(theirs).state is S.ACKED
    assert publisher.published_ids() == [1]


def test_recover_uses_lease_for_owner_on_another_host(
    store: LedgerStore, source: FakeSource, stager: FakeStager, publisher: FakePublisher
) -> None:
    plan_as(store, Owner("some-other-host.invalid", 1))
    patient = coordinator(store, source, stager, publisher, lease_seconds=3600)
    with pytest.raises(BusyError):
        patient.recover_and_commit()
    time.sleep(0.05)
    impatient = coordinator(store, source, stager, publisher, lease_seconds=0.01)
    assert [b.state for b in impatient.recover_and_commit()] == [S.ABORTED]


def test_the_lease_is_renewed_while_the_commit_runs(
    store: LedgerStore,
    source: FakeSource,
    stager: FakeStager,
    publisher: FakePublisher,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A commit can take minutes (the store retried for up to 120 s): its lease must stay
    fresh, or a recovery on another host takes a live owner's batch over and fails it."""
    tpc = coordinator(store, source, stager, publisher, lease_seconds=0.2)
    batch = voted(tpc)
    beats = []
    publish = publisher.publish

    def slow(batch: Batch, files: Any) -> Any:
        for _ in range(4):
            current = store.get(APP, batch.batch_id)
            assert current is not None
            beats.append(current.heartbeat_at)
            time.sleep(0.15)
        return publish(batch, files)

    monkeypatch.setattr(publisher, "publish", slow)
    assert tpc.commit(batch).state is S.COMMITTED
    assert beats[-1] > beats[0]


def test_recover_finishes_prepared_before_anything_new(
    tpc: TwoPhaseCommit, store: LedgerStore, publisher: FakePublisher
) -> None:
    voted(tpc)
    with pytest.raises(BusyError):
        tpc.begin()
    tpc.recover_and_commit()
    report = tpc.run_batch()
    assert report is not None
    assert publisher.published_ids() == [1, 2]
    assert report.batch.ranges[0] == OffsetRange(TOPIC, 0, 10, 20)


# -- rebuilding the ledger from the Delta log ---------------------------------------------


def filled_table(
    source: FakeSource, stager: FakeStager, tmp_path: Path, batches: int
) -> FakePublisher:
    """A table that `batches` batches went into, through a ledger that is then lost."""
    publisher = FakePublisher(disk=stager.disk)
    lost = LedgerStore(f"sqlite:///{tmp_path}/lost.db")
    try:
        tpc = coordinator(lost, source, stager, publisher)
        for _ in range(batches):
            assert tpc.run_batch() is not None
    finally:
        lost.dispose()
    return publisher


def test_rebuild_from_log_recreates_committed_history(
    store: LedgerStore, source: FakeSource, stager: FakeStager, tmp_path: Path
) -> None:
    publisher = filled_table(source, stager, tmp_path, 3)
    tpc = coordinator(store, source, stager, publisher)
    assert tpc.rebuild_from_log() == 3
    assert tpc.rebuild_from_log() == 0
    rebuilt = sorted(store.batches(app_id=APP), key=lambda b: b.batch_id)
    assert [(b.batch_id, b.state) for b in rebuilt] == [(i, S.COMMITTED) for i in (1, 2, 3)]
    assert [b.table_version for b in rebuilt] == [0, 1, 2]
    assert [str(r) for r in rebuilt[2].ranges] == ["pageviews-0[20,25)", "pageviews-1[12,12)"]
    assert all(b.params.get("rebuilt_from_delta_log") for b in rebuilt)
    assert store.positions(APP) == {0: 25, 1: 12}
    # the next batch continues after the table's history: no duplicates
    source.offsets[0] = Available(0, 30)
    tpc.recover_and_commit()
    report = tpc.run_batch()
    assert report is not None
    assert report.batch.batch_id == 4
    assert [str(r) for r in report.batch.ranges] == ["pageviews-0[25,30)", "pageviews-1[12,12)"]
    assert publisher.published_ids() == [1, 2, 3, 4]


def test_rebuild_fills_only_missing_batches(
    store: LedgerStore, source: FakeSource, stager: FakeStager, tmp_path: Path
) -> None:
    publisher = filled_table(source, stager, tmp_path, 3)
    ranges = [OffsetRange(**r) for r in publisher.commits[0]["ranges"]]
    store.insert_committed(
        pipeline="pv",
        app_id=APP,
        kind="live",
        batch_id=1,
        ranges=ranges,
        table_version=0,
        committed_at=utcnow(),
    )
    known = store.get(APP, 1)
    assert known is not None
    store.transition(known, S.ACKED)
    tpc = coordinator(store, source, stager, publisher)
    assert tpc.rebuild_from_log() == 2
    states = {b.batch_id: b.state for b in store.batches(app_id=APP)}
    assert states == {1: S.ACKED, 2: S.COMMITTED, 3: S.COMMITTED}


def test_rebuild_refuses_when_newest_metadata_is_gone(
    store: LedgerStore, source: FakeSource, stager: FakeStager, tmp_path: Path
) -> None:
    publisher = filled_table(source, stager, tmp_path, 3)
    publisher.drop_metadata_of = {3}
    tpc = coordinator(store, source, stager, publisher)
    with pytest.raises(InconsistencyError) as info:
        tpc.rebuild_from_log()
    assert f"{APP}/3" in str(info.value)
    assert "no longer in the Delta log" in str(info.value)
    assert store.batches() == []
    with pytest.raises(InconsistencyError):
        tpc.recover_and_commit()
    assert store.batches() == []


def test_backfill_history_the_log_lost_refuses_backfills_only(
    store: LedgerStore, source: FakeSource, stager: FakeStager, tmp_path: Path
) -> None:
    """Every start rebuilds both application ids of a lost ledger. Backfill batches whose
    commit info log retention removed are needed only to check the next backfill's ranges,
    so they refuse a backfill start, not a live one: the live pipeline's positions do not
    depend on them, and a live start rebuilds what the log still has. A live history the
    log lost refuses every start, a backfill's too (a fill's checks need its positions)."""
    publisher = filled_table(source, stager, tmp_path, 3)
    publisher.drop_metadata_of = {3}
    backfills = coordinator(store, source, stager, publisher, kind=BatchKind.BACKFILL)
    backfills.recover_and_commit(wait=False)  # a live start recovering it: no refusal
    assert {b.batch_id for b in store.batches()} == {1, 2}  # what the log still has
    with pytest.raises(InconsistencyError, match="no longer in the Delta log"):
        backfills.recover_and_commit()  # a backfill start
    live = coordinator(store, source, stager, publisher)
    with pytest.raises(InconsistencyError, match="no longer in the Delta log"):
        live.recover_and_commit(wait=False)


def test_rebuild_refuses_a_ledger_older_than_the_table(
    store: LedgerStore, source: FakeSource, stager: FakeStager, tmp_path: Path
) -> None:
    publisher = filled_table(source, stager, tmp_path, 1)
    plan_as(store, Owner(socket.gethostname(), dead_pid()))  # batch 1, never voted here
    tpc = coordinator(store, source, stager, publisher)
    with pytest.raises(InconsistencyError, match="ledger has it PLANNED"):
        tpc.recover_and_commit()


def test_rebuild_with_empty_table_does_nothing(tpc: TwoPhaseCommit, store: LedgerStore) -> None:
    assert tpc.rebuild_from_log() == 0
    assert store.batches() == []


# -- fencing ------------------------------------------------------------------------------


def test_fenced_attempt_cannot_stage_or_vote(
    tpc: TwoPhaseCommit, store: LedgerStore, publisher: FakePublisher
) -> None:
    planned = tpc.begin()
    assert planned is not None
    store.takeover(planned, Owner("rescuer", 1))
    with pytest.raises(FencedError, match="it is PLANNED at attempt 2"):
        tpc.invoke(planned)

    current = store.get(APP, 1)
    assert current is not None
    staged, output = tpc.invoke(current)  # the rescuer (attempt 2) stages
    assert staged.attempt == 2
    zombie_output = StageOutput(
        files=[StagedFile("table", "staging/batch=1/attempt=1/zombie.parquet", 1, 1, 0, "{}")],
        schemas={},
        records_read=1,
        table_records=1,
        quarantine_records=0,
    )
    stale_staged = store.takeover(staged, Owner("rescuer-2", 2))
    with pytest.raises(FencedError, match="it is STAGED at attempt 3"):
        tpc.pre_commit(staged, zombie_output)
    assert store.files(APP, 1) == []
    # the live attempt votes its own files; only those are ever published
    prepared = tpc.pre_commit(stale_staged, output)
    committed = tpc.commit(prepared)
    assert committed.state is S.COMMITTED
    assert publisher.commits[0]["files"] == [f.path for f in output.files]
    assert all("attempt=2" in p for p in publisher.commits[0]["files"])


def test_fenced_attempt_cannot_commit(
    tpc: TwoPhaseCommit, store: LedgerStore, publisher: FakePublisher
) -> None:
    stale = voted(tpc)
    rescued = store.takeover(stale, Owner("rescuer", 1))
    with pytest.raises(FencedError, match="it is PREPARED at attempt 2"):
        tpc.commit(stale)
    assert publisher.commits == []  # the zombie learnt it was fenced before publishing
    current = store.get(APP, 1)
    assert current is not None
    assert (current.state, current.attempt) == (S.PREPARED, 2)
    # the rescuer finishes it; the table holds the batch once
    assert tpc.commit(rescued).state is S.COMMITTED
    assert publisher.published_ids() == [1]


def test_heartbeat_fences_a_staging_attempt(
    store: LedgerStore, source: FakeSource, publisher: FakePublisher
) -> None:
    def taken_over_while_staging(batch: Batch) -> None:
        store.takeover(batch, Owner("rescuer", 1))
        time.sleep(0.2)  # several heartbeats at lease/4 = 0.02 s

    stager = FakeStager(during=taken_over_while_staging)
    tpc = coordinator(store, source, stager, publisher, lease_seconds=0.08)
    batch = tpc.begin()
    assert batch is not None
    with pytest.raises(FencedError, match="heartbeat refused"):
        tpc.invoke(batch)
    current = store.get(APP, 1)
    assert current is not None
    assert (current.state, current.attempt) == (S.PLANNED, 2)


# -- what an orchestrator asks: re-drive one batch, and what the next batch would be -------


def test_redrive_commits_a_prepared_batch_under_a_new_attempt(
    tpc: TwoPhaseCommit, source: FakeSource, publisher: FakePublisher
) -> None:
    prepared = voted(tpc)
    done = tpc.redrive(prepared.batch_id)
    assert done is not None
    assert (done.batch_id, done.state, done.attempt) == (1, S.ACKED, 2)
    assert publisher.published_ids() == [1]
    assert source.acks == [list(prepared.ranges)]
    # finished now: a second re-drive touches nothing
    assert tpc.redrive(prepared.batch_id) is None
    assert publisher.published_ids() == [1]
    assert len(source.acks) == 1


def test_redrive_acks_a_committed_batch_without_publishing_again(
    tpc: TwoPhaseCommit, source: FakeSource, publisher: FakePublisher
) -> None:
    committed = tpc.commit(voted(tpc))
    done = tpc.redrive(committed.batch_id)
    assert done is not None
    assert (done.state, done.attempt) == (S.ACKED, 2)
    assert publisher.published_ids() == [1]
    assert source.acks == [list(committed.ranges)]


@pytest.mark.parametrize("state", [S.PLANNED, S.STAGED])
def test_redrive_leaves_batches_that_have_not_voted_alone(
    tpc: TwoPhaseCommit, store: LedgerStore, publisher: FakePublisher, state: BatchState
) -> None:
    batch = plan_as(store, Owner("elsewhere", 1), state)
    assert tpc.redrive(batch.batch_id) is None
    assert tpc.redrive(99) is None  # no such batch
    current = store.get(APP, batch.batch_id)
    assert current is not None
    assert (current.state, current.attempt) == (state, 1)
    assert publisher.commits == []


def test_next_batch_names_what_begin_then_plans(
    tpc: TwoPhaseCommit, store: LedgerStore, source: FakeSource
) -> None:
    due = tpc.next_batch()
    assert due.batch_id == 1 and due.in_flight is None
    assert due.ranges == (OffsetRange(TOPIC, 0, 0, 10), OffsetRange(TOPIC, 1, 5, 12))
    assert store.batches(app_id=APP) == []  # asking plans nothing
    planned = tpc.begin(batch_id=due.batch_id)
    assert planned is not None
    assert (planned.batch_id, planned.ranges) == (due.batch_id, due.ranges)


def test_next_batch_waits_for_the_batch_in_flight(tpc: TwoPhaseCommit, store: LedgerStore) -> None:
    prepared = voted(tpc)
    waiting = tpc.next_batch()
    assert waiting.batch_id is None and waiting.ranges == ()
    assert waiting.in_flight is not None
    assert (waiting.in_flight.batch_id, waiting.in_flight.state) == (1, S.PREPARED)
    tpc.redrive(prepared.batch_id)
    assert tpc.next_batch().batch_id == 2


def test_next_batch_is_none_when_caught_up(tpc: TwoPhaseCommit, source: FakeSource) -> None:
    while tpc.run_batch() is not None:
        pass
    caught_up = tpc.next_batch()
    assert (caught_up.batch_id, caught_up.ranges, caught_up.in_flight) == (None, (), None)
    assert tpc.begin() is None  # begin agrees
    source.offsets[1] = Available(5, 13)
    due = tpc.next_batch()
    assert due.batch_id == 4
    assert [str(r) for r in due.ranges] == ["pageviews-0[25,25)", "pageviews-1[12,13)"]


def test_next_batch_pins_new_partitions_when_starting_from_latest(
    store: LedgerStore, source: FakeSource, stager: FakeStager, publisher: FakePublisher
) -> None:
    tpc = coordinator(store, source, stager, publisher, starting_offsets="latest")
    due = tpc.next_batch()  # nothing to read, but the start must be pinned: worth a batch
    assert due.batch_id == 1
    assert [str(r) for r in due.ranges] == ["pageviews-0[25,25)", "pageviews-1[12,12)"]
    assert tpc.run_batch() is not None
    assert tpc.next_batch().batch_id is None


# -- invariant 11: a vote whose staged files vanished is re-staged, never published --------


def alerting(
    store: LedgerStore, source: FakeSource, stager: FakeStager, publisher: FakePublisher
) -> tuple[TwoPhaseCommit, list[str]]:
    """A restarted coordinator whose log (where alerts go by default) is recorded."""
    said: list[str] = []
    return coordinator(store, source, stager, publisher, log=said.append), said


def test_recovery_restages_a_vote_whose_staged_file_vanished(
    tpc: TwoPhaseCommit,
    store: LedgerStore,
    source: FakeSource,
    stager: FakeStager,
    publisher: FakePublisher,
    disk: dict[str, int],
) -> None:
    prepared = voted(tpc)
    broken_vote = [f.path for f in store.files(APP, 1)]
    del disk[broken_vote[0]]  # a lifecycle rule, a VACUUM or an operator removed it

    restarted, said = alerting(store, source, stager, publisher)
    finished = restarted.recover_and_commit()

    # nothing of the broken vote was published; the batch was staged again and committed
    assert [c["files"] for c in publisher.commits] == [[f.path for f in store.files(APP, 1)]]
    assert not set(broken_vote) & set(publisher.commits[0]["files"])
    assert [(b.batch_id, b.state) for b in finished] == [(1, S.ACKED)]
    done = finished[0]
    # same batch id and ranges; attempt 2 was the takeover, attempt 3 the re-stage
    assert (done.ranges, done.attempt) == (prepared.ranges, 3)
    assert stager.staged == [(1, 1), (1, 3)]
    assert all("attempt=3" in f.path for f in store.files(APP, 1))
    assert store.positions(APP) == {0: 10, 1: 12}
    assert {k: done.metrics[k] for k in COUNTS} == {
        "files_staged": 2,
        "files_committed": 2,
        "files_already_committed": 0,
        "files_missing": 1,
    }
    assert done.metrics["restage"]["count"] == 1
    assert done.metrics["restage"]["missing"] == [f"table/{broken_vote[0]}"]
    assert broken_vote[0] in (done.error or "")
    alerts = [line for line in said if line.startswith("ALERT [staged_files_missing]")]
    assert len(alerts) == 1 and broken_vote[0] in alerts[0]


COUNTS = ("files_staged", "files_committed", "files_already_committed", "files_missing")


def test_a_file_of_another_size_counts_as_missing(
    tpc: TwoPhaseCommit, store: LedgerStore, publisher: FakePublisher, disk: dict[str, int]
) -> None:
    voted(tpc)
    truncated = store.files(APP, 1)[1]
    disk[truncated.path] = truncated.size - 1
    done = tpc.recover_and_commit()[0]
    assert done.state is S.ACKED and done.metrics["files_missing"] == 1
    assert truncated.path not in publisher.commits[0]["files"]


def test_an_intact_vote_is_committed_as_voted_with_its_counts(
    tpc: TwoPhaseCommit, store: LedgerStore, stager: FakeStager
) -> None:
    report = tpc.run_batch()
    assert report is not None
    assert {k: report.batch.metrics[k] for k in COUNTS} == {
        "files_staged": 2,
        "files_committed": 2,
        "files_already_committed": 0,
        "files_missing": 0,
    }
    assert "restage" not in report.batch.metrics
    assert stager.staged == [(1, 1)]


def test_an_output_that_already_holds_the_batch_is_not_checked(
    store: LedgerStore,
    source: FakeSource,
    disk: dict[str, int],
    publisher: FakePublisher,
) -> None:
    stager = FakeStager(disk=disk, outputs=("table", "quarantine"))
    tpc = coordinator(store, source, stager, publisher)
    voted(tpc)
    # the quarantine was published before a crash (between the two commits), then its
    # staged files were cleaned up: they are the quarantine's now, not missing
    publisher.hold(APP, "quarantine", 1)
    for f in store.files(APP, 1):
        if f.target == "quarantine":
            del disk[f.path]
    done = tpc.recover_and_commit()[0]
    assert done.state is S.ACKED
    assert stager.staged == [(1, 1)]  # no re-stage
    assert {k: done.metrics[k] for k in COUNTS} == {
        "files_staged": 4,
        "files_committed": 2,
        "files_already_committed": 2,
        "files_missing": 0,
    }
    assert all(p.startswith("staging/") for p in publisher.commits[0]["files"])


class ForgetfulDisk(dict):
    """Storage where every staged file is gone by the time anyone looks."""

    def __setitem__(self, key: str, value: int) -> None:
        pass


def test_restages_are_bounded_and_then_fail_loudly(store: LedgerStore, source: FakeSource) -> None:
    disk = ForgetfulDisk()
    stager, publisher = FakeStager(disk=disk), FakePublisher(disk=disk)
    tpc, said = alerting(store, source, stager, publisher)
    with pytest.raises(InconsistencyError, match=r"pageviews/1 .*vanished again after 2 re-st"):
        tpc.run_batch()
    assert publisher.commits == []
    batch = store.get(APP, 1)
    assert batch is not None and batch.state is S.PREPARED
    assert stager.staged == [(1, 1), (1, 2), (1, 3)]
    assert batch.metrics["restage"]["count"] == 2
    assert len([line for line in said if "ALERT [staged_files_missing]" in line]) == 3
    # the next start tries again (the operator fixed the storage meanwhile)
    stager.disk = publisher.disk = {}
    done = coordinator(store, source, stager, publisher).recover_and_commit()
    assert [(b.state, b.attempt) for b in done] == [(S.ACKED, 5)]
    assert publisher.published_ids() == [1]


def test_a_restage_whose_offsets_left_kafka_fails_loudly_and_is_never_abandoned(
    tpc: TwoPhaseCommit,
    store: LedgerStore,
    source: FakeSource,
    stager: FakeStager,
    publisher: FakePublisher,
    disk: dict[str, int],
) -> None:
    voted(tpc)
    disk.clear()
    source.offsets[0] = Available(3, 25)  # retention removed [0, 3) before the re-stage
    for _ in range(2):  # every start fails loudly, and abandons nothing
        with pytest.raises(DataLossError, match=r"pageviews-0\[0,10\): offsets \[0, 3\)"):
            coordinator(store, source, stager, publisher).recover_and_commit()
        batch = store.get(APP, 1)
        assert batch is not None and batch.state is S.PLANNED and "restage" in batch.metrics
    assert publisher.commits == []
    with pytest.raises(BusyError):
        tpc.begin()  # its range stays held: nothing is planned past it
    with pytest.raises(InconsistencyError, match="voted once"):
        tpc.abort(batch, "operator")
    assert store.positions(APP) == {0: 10, 1: 12}


def test_a_voted_batch_a_start_cannot_finish_is_one_line_naming_the_outputs_holding_it(
    tpc: TwoPhaseCommit,
    store: LedgerStore,
    source: FakeSource,
    stager: FakeStager,
    publisher: FakePublisher,
    disk: dict[str, int],
) -> None:
    """Invariant 12: until a voted batch is finished, the outputs that hold it disagree with
    those that do not. A start that cannot finish it (here its re-stage: the files vanished
    and Kafka's retention took the first offsets) refuses, of the error's own kind, naming
    the batch and the outputs that hold it; a re-drive says the same."""
    prepared = voted(tpc)
    disk.clear()
    publisher.hold(APP, "quarantine", 1)  # the quarantine was published, the table not
    source.offsets[0] = Available(3, 25)
    with pytest.raises(DataLossError) as info:
        coordinator(store, source, stager, publisher).recover_and_commit()
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith("voted batch pageviews/1 cannot be finished: ")
    assert "offsets [0, 3)" in text  # the cause, as Kafka's retention left it
    assert "quarantine hold(s) it and the other outputs do not" in text
    with pytest.raises(DataLossError, match="quarantine hold"):
        tpc.redrive(prepared.batch_id)
    del publisher.versions[APP, "quarantine"]
    with pytest.raises(DataLossError, match="no output holds it yet"):
        tpc.redrive(prepared.batch_id)

    def unreadable(_batch: Batch) -> set[str]:
        raise OSError("the store is gone too")

    publisher.outputs_holding = unreadable  # type: ignore[method-assign]
    with pytest.raises(DataLossError, match="which outputs hold it could not be read"):
        tpc.redrive(prepared.batch_id)


def test_redrive_finishes_a_restaging_batch_whose_run_died(
    tpc: TwoPhaseCommit,
    store: LedgerStore,
    source: FakeSource,
    stager: FakeStager,
    publisher: FakePublisher,
    disk: dict[str, int],
) -> None:
    prepared = voted(tpc)
    disk.clear()
    source.offsets[0] = Available(3, 25)
    with pytest.raises(DataLossError):
        tpc.redrive(prepared.batch_id)
    source.offsets[0] = Available(0, 25)  # say the operator restored the offsets
    done = tpc.redrive(prepared.batch_id)
    assert done is not None and done.state is S.ACKED
    assert publisher.published_ids() == [1]
    assert [OffsetRange(**r) for r in publisher.commits[0]["ranges"]] == list(prepared.ranges)
    assert all(f"attempt={done.attempt}" in p for p in publisher.commits[0]["files"])


def test_a_batch_that_voted_once_is_never_abandoned_as_dead_but_redriven(
    tpc: TwoPhaseCommit,
    store: LedgerStore,
    source: FakeSource,
    disk: dict[str, int],
) -> None:
    """abandon_dead (the Dagster schedule and re-drive sensor) abandons dead batches that
    never voted; one sent back to be staged again voted once (invariant 5): the sensor must
    re-drive it instead."""
    voted(tpc)
    disk.clear()
    source.offsets[0] = Available(3, 25)
    with pytest.raises(DataLossError):
        tpc.recover_and_commit()  # its re-stage fails: PLANNED, voted once, owner gone
    batch = store.get(APP, 1)
    assert batch is not None and batch.state is S.PLANNED and batch.voted_once
    assert tpc.abandon_dead() == []
    batch = store.get(APP, 1)
    assert batch is not None and batch.state is S.PLANNED
    assert tpc.needs_redrive(batch)


def test_a_refused_restage_leaves_the_batch_to_finish_never_aborted(
    tpc: TwoPhaseCommit, store: LedgerStore, stager: FakeStager, disk: dict[str, int]
) -> None:
    """A transform changed between a vote and its re-stage may be refused (invariants 13,
    14): the batch voted once, so it waits for the old transform; it is not abandoned."""
    voted(tpc)
    disk.clear()

    def refuse(_batch: Batch) -> None:
        raise RefusedBatchError("column 'x' changed type from int to string")

    stager.during = refuse
    with pytest.raises(RefusedBatchError, match="never abandoned: restore the transform"):
        tpc.recover_and_commit()
    batch = store.get(APP, 1)
    assert batch is not None and batch.state is S.PLANNED and batch.voted_once


def test_the_alert_hook_gets_the_missing_files(
    tpc: TwoPhaseCommit,
    store: LedgerStore,
    source: FakeSource,
    stager: FakeStager,
    publisher: FakePublisher,
    disk: dict[str, int],
) -> None:
    voted(tpc)
    lost = store.files(APP, 1)[0]
    del disk[lost.path]
    got: list[Any] = []
    coordinator(store, source, stager, publisher, alert=got.append).recover_and_commit()
    (alert,) = got
    assert alert.kind == "staged_files_missing"
    assert alert.details["batch_id"] == 1 and alert.details["app_id"] == APP
    assert alert.details["missing"] == [f"table/{lost.path}"]
    assert "re-stag" in alert.text


def test_a_publish_refused_as_out_of_order_alerts_and_leaves_the_batch_prepared(
    tpc: TwoPhaseCommit,
    store: LedgerStore,
    source: FakeSource,
    stager: FakeStager,
    publisher: FakePublisher,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An output that refuses the batch (a PostgreSQL output's compare-and-set: out of order,
    resources/postgres/apply.py) is a protocol violation: the pipeline stops with an alert and the
    batch waits PREPARED, never skipped."""
    voted(tpc)

    def refuse(batch: Batch, files: Any) -> Any:
        raise InconsistencyError("postgres output views: out of order: holds batch none")

    monkeypatch.setattr(publisher, "publish", refuse)
    got: list[Any] = []
    with pytest.raises(InconsistencyError, match="out of order"):
        coordinator(store, source, stager, publisher, alert=got.append).recover_and_commit()
    (alert,) = got
    assert alert.kind == "publish_refused"
    assert alert.details["batch_id"] == 1 and "out of order" in alert.text
    batch = store.get(APP, 1)
    assert batch is not None and batch.state is S.PREPARED


@pytest.mark.parametrize("held_rows", [9, 8])
def test_a_restage_must_split_records_as_the_output_that_holds_the_batch_did(
    store: LedgerStore,
    source: FakeSource,
    disk: dict[str, int],
    publisher: FakePublisher,
    held_rows: int,
) -> None:
    stager = FakeStager(disk=disk, outputs=("table", "quarantine"))
    tpc = coordinator(store, source, stager, publisher)
    voted(tpc)
    # a crash between the commits: the quarantine holds the batch's 9 rows (the fake stager
    # quarantines the odd offsets of [0, 10) and [5, 12)); then a table
    # file of the vote is lost, so the batch is staged again, and the quarantine part of the
    # new stage must be what the quarantine holds, or the table would get a different split
    publisher.hold(APP, "quarantine", 1)
    publisher.rows["quarantine"] = held_rows
    del disk[next(f.path for f in store.files(APP, 1) if f.target == "table")]
    if held_rows == 9:
        assert tpc.recover_and_commit()[0].state is S.ACKED
        assert all(p.startswith("staging/") for p in publisher.commits[0]["files"])
        return
    with pytest.raises(InconsistencyError, match=r"quarantine holds 8 .* staged 9"):
        tpc.recover_and_commit()
    assert publisher.commits == []
    batch = store.get(APP, 1)
    assert batch is not None and batch.state is S.PREPARED
