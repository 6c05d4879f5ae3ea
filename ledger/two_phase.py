"""The two-phase commit of one micro-batch, in the shape of Flink's TwoPhaseCommitSinkFunction.

    begin()               plan: fix the offset range of every partition       -> PLANNED
    invoke(batch)         stage: write files nobody can see yet                -> STAGED
    pre_commit(...)       the vote: record exactly those files, durably        -> PREPARED
    commit(batch)         publish them in one Delta transaction                -> COMMITTED
    ack(batch)            move the consumer group (advisory)                   -> ACKED
    abort(batch)          give up a batch that has not voted                   -> ABORTED
    recover_and_commit()  on every start: finish what voted, abandon the rest
    redrive(batch_id)     finish one voted batch under a new attempt
    next_batch()          what begin() would plan now, or why nothing, without planning

The edges (Kafka offsets, the Spark stage job, the Delta tables) come in through the small
protocols below, so this module can be exercised with in-memory fakes and read alone.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from ledger.batch import Batch, BatchKind, StagedFile, this_owner, utcnow
from ledger.crash import crashpoint
from ledger.decisions import Decision, DecisionKind, resume_command
from ledger.errors import BusyError, FencedError, InconsistencyError
from ledger.protocol import (
    ABANDONABLE,
    IN_FLIGHT,
    MUST_FINISH,
    Available,
    BatchState,
    OffsetRange,
    Positions,
    check_batch_topic,
    check_ranges_readable,
    check_topic_identity,
    check_topic_steady,
    owner_may_be_alive,
    plan_ranges,
    worth_planning,
)
from ledger.store import LedgerStore


@dataclass(frozen=True)
class StageOutput:
    """What one attempt wrote: the vote's input."""

    files: list[StagedFile]
    schemas: dict[str, str]
    records_read: int
    table_records: int
    quarantine_records: int
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class PublishResult:
    published: bool
    table_version: int


@dataclass(frozen=True)
class NextBatch:
    """What `begin()` would plan now, worked out without planning it.

    A batch is due when `batch_id` is set (with its `ranges`). Otherwise `in_flight` is the
    batch that must finish first (one batch at a time), or None when the topic holds nothing
    new (caught up).
    """

    batch_id: int | None
    ranges: tuple[OffsetRange, ...] = ()
    in_flight: Batch | None = None


class OffsetSource(Protocol):
    topic: str

    def available(self) -> Mapping[int, Available]:
        """Earliest and last stable offset of every partition, read now."""

    def topic_id(self) -> str:
        """Kafka's id of the topic's current incarnation (KIP-516), read now."""

    def ack(self, ranges: Sequence[OffsetRange]) -> None:
        """Move the consumer group to the ranges' ends (advisory)."""


class Stager(Protocol):
    def stage(self, batch: Batch) -> StageOutput:
        """Write the batch's output into folders unique to (batch id, attempt)."""


class Publisher(Protocol):
    def committed_version(self, app_id: str) -> int | None:
        """The newest batch id the tables hold for `app_id`."""

    def publish(self, batch: Batch, files: Sequence[StagedFile]) -> PublishResult:
        """Publish exactly `files` with the app transaction (app id, batch id); idempotent."""

    def committed_batches(self, app_id: str) -> list[dict[str, Any]]:
        """Commit metadata of every batch of `app_id` still in the table's log."""

    def rows_reach(self, topic: str) -> dict[int, int]:
        """Per partition, one past the highest offset of `topic` in the published rows."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class TwoPhaseCommit:
    """Drives batches of one application id through the protocol, one at a time."""

    def __init__(
        self,
        store: LedgerStore,
        *,
        pipeline: str,
        app_id: str,
        source: OffsetSource,
        stager: Stager,
        publisher: Publisher,
        max_records_per_partition: int,
        kind: BatchKind = BatchKind.LIVE,
        lease_seconds: float = 120.0,
        starting_offsets: str = "earliest",
        log: Callable[[str], None] = lambda _msg: None,
    ) -> None:
        self.store = store
        self.pipeline = pipeline
        self.app_id = app_id
        self.kind = kind
        self.source = source
        self.stager = stager
        self.publisher = publisher
        self.max_records_per_partition = max_records_per_partition
        self.lease_seconds = lease_seconds
        self.starting_offsets = starting_offsets
        self.log = log

    # -- begin / invoke / preCommit / commit / abort -------------------------------------

    def begin(self, *, allow_empty: bool = False, batch_id: int | None = None) -> Batch | None:
        """Plan the next batch: fix every partition's range at one instant.

        Returns None when there is nothing new to read and `allow_empty` is False. With
        `batch_id`, the batch gets that id (it must be above every existing one), so an
        orchestrator can name the batch before it exists.
        """
        topic_id, available = self.read_topic()

        def ranges_for(positions: Positions) -> list[OffsetRange] | None:
            return self._next_ranges(positions, available, topic_id, allow_empty=allow_empty)

        batch = self.store.plan(
            pipeline=self.pipeline,
            app_id=self.app_id,
            kind=self.kind,
            ranges_for=ranges_for,
            batch_id=batch_id,
            topic_id=topic_id,
        )
        if batch is not None:
            crashpoint("after_plan")
        return batch

    def next_batch(self) -> NextBatch:
        """What `begin()` would plan now, without planning it.

        For an orchestrator that names a batch (a partition, a run) before the run plans it.
        It decides with the same rule as `begin()`, so the two cannot disagree about whether
        a batch is due; a batch planned meanwhile by someone else makes `begin(batch_id=...)`
        refuse the stale id instead.
        """
        in_flight = self.store.batches(app_id=self.app_id, states=IN_FLIGHT, limit=1)
        if in_flight:
            return NextBatch(None, in_flight=in_flight[0])
        topic_id, available = self.read_topic()
        ranges = self._next_ranges(self.store.positions(self.app_id), available, topic_id)
        if ranges is None:
            return NextBatch(None)
        return NextBatch((self.store.last_batch_id(self.app_id) or 0) + 1, tuple(ranges))

    def read_topic(self) -> tuple[str, Mapping[int, Available]]:
        """The topic's id and its partitions' offsets, read at one instant: the id is read
        before and after the offsets, and a change in between refuses (invariant 10)."""
        before = self.source.topic_id()
        available = self.source.available()
        check_topic_steady(self.source.topic, before, self.source.topic_id())
        return before, available

    def _next_ranges(
        self,
        positions: Positions,
        available: Mapping[int, Available],
        topic_id: str,
        *,
        allow_empty: bool = False,
    ) -> list[OffsetRange] | None:
        """The next batch's ranges from `positions`, or None when they are not worth a batch.

        Positions read from another topic incarnation than `topic_id` are refused before
        anything is planned on them (invariant 10).
        """
        check_topic_identity(self.source.topic, positions, topic_id)
        ranges = plan_ranges(
            self.source.topic,
            positions,
            available,
            self.max_records_per_partition,
            self.starting_offsets,
        )
        if allow_empty or worth_planning(ranges, positions, self.starting_offsets):
            return ranges
        return None

    def begin_fixed(
        self,
        ranges: Sequence[OffsetRange],
        params: Mapping[str, Any],
        *,
        batch_id: int | None = None,
    ) -> Batch:
        """Plan a batch over operator-chosen ranges (a backfill) instead of the next ones.

        `params` identify the request; the caller checks it is allowed (ledger/backfill.py).
        The ranges are planned on the topic's current incarnation (invariant 10).
        """
        topic_id, available = self.read_topic()
        check_ranges_readable(ranges, available)
        batch = self.store.plan(
            pipeline=self.pipeline,
            app_id=self.app_id,
            kind=self.kind,
            ranges_for=lambda _positions: list(ranges),
            params=params,
            batch_id=batch_id,
            contiguous=False,
            topic_id=topic_id,
        )
        assert batch is not None
        crashpoint("after_plan")
        return batch

    def invoke(self, batch: Batch) -> tuple[Batch, StageOutput]:
        """Stage the batch; on success it is STAGED. Nothing is visible to readers yet.

        The topic must be the incarnation the batch was planned on, before the read and
        still after it, or nothing is voted (invariant 10).
        """
        topic_id, available = self.read_topic()
        check_batch_topic(batch.label, self.source.topic, batch.topic_id, topic_id)
        check_ranges_readable(batch.ranges, available)
        with self._heartbeat(batch):
            output = self.stager.stage(batch)
        check_batch_topic(batch.label, self.source.topic, batch.topic_id, self.source.topic_id())
        batch = self.store.transition(
            batch,
            BatchState.STAGED,
            metrics={
                "records_read": output.records_read,
                "table_records": output.table_records,
                "quarantine_records": output.quarantine_records,
                "files": len(output.files),
                "stage_detail_s": output.seconds,
            },
        )
        crashpoint("after_stage")
        return batch, output

    def pre_commit(self, batch: Batch, output: StageOutput) -> Batch:
        """The vote: one ledger transaction records the files, the schemas and PREPARED.

        From here the batch must commit (invariant 5).
        """
        batch = self.store.transition(
            batch, BatchState.PREPARED, files=output.files, schemas=output.schemas
        )
        crashpoint("after_prepare")
        return batch

    def commit(self, batch: Batch, *, recovering: bool = False) -> Batch:
        """Publish exactly the voted files; idempotent against the table's txn version."""
        if batch.state is not BatchState.PREPARED:
            raise InconsistencyError(
                f"batch {batch.label}: commit needs PREPARED, not {batch.state}"
            )
        self.store.require_current(batch)
        files = self.store.files(batch.app_id, batch.batch_id)
        result = self.publisher.publish(batch, files)
        crashpoint("recovery_after_delta_commit" if recovering else "after_delta_commit")
        batch = self.store.transition(
            batch, BatchState.COMMITTED, table_version=result.table_version
        )
        crashpoint("after_committed")
        return batch

    def ack(self, batch: Batch) -> Batch:
        """Move the consumer group to the batch's end offsets, then mark it ACKED.

        Advisory: the table and the ledger, never the group, decide what comes next.
        """
        if self.kind == BatchKind.LIVE:
            self.source.ack(batch.ranges)
        return self.store.transition(batch, BatchState.ACKED)

    def abort(self, batch: Batch, reason: str) -> Batch:
        """Give up a batch that never voted; its range is planned again by the next begin."""
        return self.store.transition(batch, BatchState.ABORTED, error=reason)

    # -- recovery -----------------------------------------------------------------------

    def recover_and_commit(self) -> list[Batch]:
        """Finish every batch that voted, abandon every dead one that did not.

        Runs before anything new is planned (invariant 5). Rebuilds missing committed
        history from the Delta log first (invariant 7). Raises BusyError if a batch that
        has not voted belongs to an attempt that may still be alive.
        """
        self.rebuild_from_log()
        finished = []
        pending = self.store.batches(app_id=self.app_id, states=IN_FLIGHT)
        for batch in sorted(pending, key=lambda b: b.batch_id):
            if batch.state in ABANDONABLE:
                if self.may_be_alive(batch):
                    raise BusyError(
                        f"batch {batch.label} is {batch.state} and its owner {batch.owner} "
                        "may still be running; try again when it finishes"
                    )
                self.log(f"abandoning batch {batch.label} ({batch.state}, owner gone)")
                finished.append(self.abort(batch, f"abandoned by recovery: {batch.owner} is gone"))
                continue
            finished.append(self._finish_voted(batch))
        return finished

    def redrive(self, batch_id: int) -> Batch | None:
        """Finish one batch that voted, under a new attempt; None if it is not past the vote.

        For an orchestrator that re-drives a batch whose run died (invariant 5) without
        recovering everything else: only PREPARED or COMMITTED batches are touched.
        """
        batch = self.store.get(self.app_id, batch_id)
        if batch is None or batch.state not in MUST_FINISH:
            return None
        return self._finish_voted(batch)

    def _finish_voted(self, batch: Batch) -> Batch:
        """Take the batch over (fencing its old attempt), publish it if it is still PREPARED,
        and ack it; recovery and re-drive both finish voted batches here."""
        batch = self.store.takeover(batch)
        self.log(f"re-driving batch {batch.label} from {batch.state}")
        if batch.state is BatchState.PREPARED:
            batch = self.commit(batch, recovering=True)
        return self.ack(batch)

    def rebuild_from_log(self) -> int:
        """Re-create committed batches the ledger lacks from the Delta log's commit info.

        Returns how many were re-created. Refuses (loudly) when the table's newest batch is
        not in the log any more, because positions could then not be known.
        """
        version = self.publisher.committed_version(self.app_id)
        if version is None:
            return 0
        known = self.store.get(self.app_id, version)
        if known is not None:
            if known.state in ABANDONABLE or known.state is BatchState.ABORTED:
                raise InconsistencyError(
                    f"the Delta table holds batch {self.app_id}/{version}, but the ledger has "
                    f"it {known.state}: the ledger is older than the table (restored from a "
                    "backup?); move the ledger aside to rebuild it from the Delta log"
                )
            return 0
        entries = self.publisher.committed_batches(self.app_id)
        if not any(e["batch_id"] == version for e in entries) and not self._resumed(version):
            raise InconsistencyError(
                f"the Delta table holds batch {self.app_id}/{version}, but its commit info is no "
                "longer in the Delta log (log retention?): offsets cannot be rebuilt; if the "
                "table's rows are complete, state where each partition continues (one past its "
                "highest offset in the table): "
                + resume_command(
                    self.publisher.rows_reach(self.source.topic), sorted(self.source.available())
                )
            )
        rebuilt = 0
        for entry in entries:
            if self.store.get(self.app_id, entry["batch_id"]) is not None:
                continue
            ranges = [OffsetRange.from_dict(r) for r in entry["ranges"]]
            decisions = [Decision.from_dict(d) for d in entry.get("decisions") or ()]
            for decision in decisions:
                self.store.insert_decision(decision)
            rebuilt += self.store.insert_committed(
                pipeline=self.pipeline,
                app_id=self.app_id,
                kind=BatchKind(entry.get("kind", self.kind)),
                batch_id=entry["batch_id"],
                ranges=ranges,
                table_version=entry.get("table_version"),
                committed_at=utcnow(),
                params=entry.get("params"),
                topic_id=entry.get("topic_id"),
                decisions=decisions,
            )
        self.log(f"rebuilt {rebuilt} committed batches of {self.app_id} from the Delta log")
        return rebuilt

    def _resumed(self, version: int) -> bool:
        """Whether an operator stated where to continue past the table's `version` when its
        commit info was gone (a resume-at decision, invariant 15)."""
        return any(
            d.kind is DecisionKind.RESUME_AT and d.after_batch_id >= version
            for d in self.store.decisions(app_id=self.app_id)
        )

    def may_be_alive(self, batch: Batch) -> bool:
        """Whether the attempt that owns `batch` may still be running somewhere."""
        me = this_owner()
        if batch.owner == me:
            return False
        age = (utcnow() - batch.heartbeat_at).total_seconds()
        return owner_may_be_alive(
            batch.owner,
            age,
            self.lease_seconds,
            socket.gethostname(),
            batch.owner.host == me.host and _pid_alive(batch.owner.pid),
        )

    @contextmanager
    def _heartbeat(self, batch: Batch) -> Iterator[None]:
        """Keep the attempt's lease fresh while it stages, so others do not abandon it."""
        stop = threading.Event()
        fenced: list[FencedError] = []

        def beat() -> None:
            while not stop.wait(self.lease_seconds / 4):
                try:
                    self.store.heartbeat(batch)
                except FencedError as exc:
                    fenced.append(exc)
                    return
                except Exception as exc:
                    self.log(f"heartbeat for {batch.label} failed: {exc}")

        thread = threading.Thread(target=beat, name=f"heartbeat-{batch.batch_id}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
        if fenced:
            raise fenced[0]

    # -- one whole batch ----------------------------------------------------------------

    def run_batch(self, *, allow_empty: bool = False) -> BatchReport | None:
        """Plan, stage, prepare, commit and ack one batch; None if there was nothing to do."""
        t = time.perf_counter()
        batch = self.begin(allow_empty=allow_empty)
        if batch is None:
            return None
        return self.finish(batch, {"plan": time.perf_counter() - t})

    def finish(self, batch: Batch, timings: dict[str, float] | None = None) -> BatchReport:
        """Stage, prepare, commit and ack a planned batch."""
        timings = dict(timings or {})
        t = time.perf_counter()
        batch, output = self.invoke(batch)
        timings["stage"] = time.perf_counter() - t
        t = time.perf_counter()
        batch = self.pre_commit(batch, output)
        timings["prepare"] = time.perf_counter() - t
        t = time.perf_counter()
        batch = self.commit(batch)
        timings["commit"] = time.perf_counter() - t
        t = time.perf_counter()
        batch = self.ack(batch)
        timings["ack"] = time.perf_counter() - t
        batch = self.store.record_metrics(batch, {"phase_s": timings})
        return BatchReport(batch, output, timings)


@dataclass(frozen=True)
class BatchReport:
    batch: Batch
    output: StageOutput
    seconds: dict[str, float]

    def line(self) -> str:
        ranges = " ".join(str(r) for r in self.batch.ranges if r.span) or "(empty)"
        phases = " ".join(f"{k}={v:.2f}s" for k, v in self.seconds.items())
        return (
            f"batch {self.batch.batch_id} {self.batch.state}: {ranges} "
            f"records={self.output.records_read} table={self.output.table_records} "
            f"quarantine={self.output.quarantine_records} files={len(self.output.files)} "
            f"{phases}"
        )
