"""The two-phase commit of one micro-batch, in the shape of Flink's TwoPhaseCommitSinkFunction.

`TwoPhaseCommit` owns the life of one batch:

    begin()               plan: fix the offset range of every partition       -> PLANNED
    invoke(batch)         stage: write files nobody can see yet                -> STAGED
    pre_commit(...)       the vote: record exactly those files, durably        -> PREPARED
    commit(batch)         publish them in one Delta transaction                -> COMMITTED
    abort(batch)          give up a batch that has not voted                   -> ABORTED
    next_batch()          what begin() would plan now, or why nothing, without planning

Before publishing, commit() checks that the vote's files are still on storage as voted; a
vote that lost files is never published but staged again over the same ranges as a new
attempt (invariant 11; ledger/coordinator/restage.py).

It is also the one entry for what its collaborators own, each a module of functions taking
the coordinator:

    ack(batch)            move the consumer group (advisory; a refusal is a warning) -> ACKED
                          (ledger/coordinator/acks.py)
    recover_and_commit()  on every start: finish what voted, abandon the rest, after
                          rebuilding a lost ledger from every output's log (invariant 12)
    abandon_dead()        abandon the batches that have not voted and whose owner is gone
    redrive(batch_id)     finish one voted batch under a new attempt
    needs_redrive(batch)  whether a voted batch is left with nobody finishing it
                          (these four: ledger/coordinator/recovery.py)
    may_be_alive(batch)   whether a batch's owner may still run (ledger/coordinator/liveness.py)

Planning on several topics is ledger/coordinator/topics.py; what the coordinator reports
(BatchReport, its alerts) is ledger/coordinator/reports.py. The edges (Kafka offsets, the
Spark stage job, the Delta tables) come in through the protocols of ledger/core/ports.py, so
the coordinator can be exercised with in-memory fakes and read alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ledger.coordinator import acks, liveness, recovery, restage, table_history
from ledger.coordinator import topics as topics_coordinator
from ledger.coordinator.crash import crashpoint
from ledger.coordinator.reports import BatchReport, publish_refused, stage_metrics
from ledger.core.batch import Batch, BatchKind
from ledger.core.errors import InconsistencyError, RefusedBatchError
from ledger.core.ports import (
    Incident,
    Ledger,
    NextBatch,
    OffsetSource,
    Publisher,
    StageOutput,
    Stager,
    TopicsSource,
)
from ledger.core.protocol import (
    BLOCKS_PLANNING,
    Available,
    BatchState,
    OffsetRange,
    Positions,
    check_batch_topic,
    check_ranges_readable,
    check_topic_identity,
    check_topic_steady,
    plan_ranges,
    worth_planning,
)


def _never(_batch: Batch) -> bool:
    return False


class TwoPhaseCommit:
    """Drives batches of one application id through the protocol, one at a time."""

    def __init__(
        self,
        store: Ledger,
        *,
        pipeline: str,
        app_id: str,
        source: OffsetSource | TopicsSource,
        stager: Stager,
        publisher: Publisher,
        max_records_per_partition: int,
        kind: BatchKind = BatchKind.LIVE,
        lease_seconds: float = 120.0,
        ack_retry_seconds: float = 120.0,
        starting_offsets: str = "earliest",
        log: Callable[[str], None] = lambda _msg: None,
        alert: Callable[[Incident], None] | None = None,
        max_restages: int = 2,
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
        self.ack_retry_seconds = ack_retry_seconds
        self.starting_offsets = starting_offsets
        self.log = log
        self.alert = alert or self._log_alert
        #: re-stages one commit call may do before it fails loudly (invariant 11)
        self.max_restages = max_restages
        #: topics new to the pipeline already found in no other pipeline's batches
        #: (ledger/coordinator/topics.py `refuse_other_writers_of_new_topics`)
        self.new_topics_cleared: set[str] = set()

    def _log_alert(self, incident: Incident) -> None:
        self.log(f"ALERT [{incident.kind}] {incident.title}: {incident.text}")

    # -- begin / invoke / preCommit / commit / abort -------------------------------------

    def begin(self, *, allow_empty: bool = False, batch_id: int | None = None) -> Batch | None:
        """Plan the next batch: fix every partition's range at one instant.

        Returns None when there is nothing new to read and `allow_empty` is False. With
        `batch_id`, the batch gets that id (it must be above every existing one), so an
        orchestrator can name the batch before it exists.
        """
        if topics_coordinator.reads_several_topics(self.source):
            batch = topics_coordinator.begin(self, allow_empty=allow_empty, batch_id=batch_id)
            if batch is not None:
                crashpoint("after_plan")
            return batch
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
        in_flight = self.store.batches(app_id=self.app_id, states=BLOCKS_PLANNING, limit=1)
        if in_flight:
            return NextBatch(None, in_flight=in_flight[0])
        if topics_coordinator.reads_several_topics(self.source):
            return topics_coordinator.next_batch(self)
        topic_id, available = self.read_topic()
        ranges = self._next_ranges(self.store.positions(self.app_id), available, topic_id)
        if ranges is None:
            return NextBatch(None)
        return NextBatch((self.store.last_batch_id(self.app_id) or 0) + 1, tuple(ranges))

    def check_topic(self) -> None:
        """Raise TopicChangedError if the stored positions were read from another topic
        incarnation than the one Kafka has now (invariant 10). Nothing can be planned until
        an operator records a decision, so a watcher calls this to make the stop heard."""
        if topics_coordinator.reads_several_topics(self.source):
            return topics_coordinator.check_topics(self)
        check_topic_identity(
            self.source.topic, self.store.positions(self.app_id), self.source.topic_id()
        )

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
        check: Callable[[Sequence[Batch]], None] | None = None,
    ) -> Batch:
        """Plan a batch over operator-chosen ranges (a backfill) instead of the next ones.

        `params` identify the request. `check(batches)` decides whether it is allowed
        (ledger/core/backfill.py); it runs inside the planning transaction, on every batch of the
        pipeline as that transaction reads them, so nothing is planned in between.
        The ranges are planned on each topic's current incarnation (invariant 10), every one
        still in Kafka (invariant 8).
        """
        topic_id: str | None = None
        topic_ids: dict[str, str] | None = None
        if topics_coordinator.reads_several_topics(self.source):
            topic_ids = topics_coordinator.read_fixed(self, ranges)
        else:
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
            check=check,
            topic_id=topic_id,
            topic_ids=topic_ids,
        )
        assert batch is not None
        crashpoint("after_plan")
        return batch

    def invoke(self, batch: Batch) -> tuple[Batch, StageOutput]:
        """Stage the batch; on success it is STAGED. Nothing is visible to readers yet."""
        output = self._stage(batch)
        batch = self.store.transition(batch, BatchState.STAGED, metrics=stage_metrics(output))
        crashpoint("after_stage")
        return batch, output

    def stage_anew(self, batch: Batch) -> tuple[Batch, StageOutput]:
        """Stage a STAGED batch again under this attempt (its earlier files were never voted,
        so they are ignored); it stays STAGED, with this stage's metrics."""
        output = self._stage(batch)
        return self.store.record_metrics(batch, stage_metrics(output)), output

    def _stage(self, batch: Batch) -> StageOutput:
        """Run the stager for this attempt, its ranges checked readable first (invariant 8);
        an output the stage refuses (invariants 13, 14) is never voted. The topic must be
        the incarnation the batch was planned on, before the read and still after it, or
        nothing is voted (invariant 10)."""
        several = topics_coordinator.reads_several_topics(self.source)
        if several:
            topics_coordinator.check_before_stage(self, batch)
        else:
            topic_id, available = self.read_topic()
            check_batch_topic(batch.label, self.source.topic, batch.topic_id, topic_id)
            check_ranges_readable(batch.ranges, available)
        crashpoint("before_stage")
        try:
            with liveness.heartbeat(self, batch):
                output = self.stager.stage(batch)
        except RefusedBatchError as exc:
            raise self._refuse(batch, exc) from exc
        if several:
            topics_coordinator.check_after_stage(self, batch)
        else:
            check_batch_topic(
                batch.label, self.source.topic, batch.topic_id, self.source.topic_id()
            )
        return output

    def pre_commit(self, batch: Batch, output: StageOutput) -> Batch:
        """The vote: one ledger transaction records the files, the schemas and PREPARED.

        From here the batch must commit (invariant 5), so a schema the tables cannot take
        (invariant 14), or a replace that would delete rows it does not put back (invariant
        1), is refused first and the batch abandoned instead.
        """
        try:
            self.publisher.check_schemas(output.schemas)
            self.publisher.check_replace(batch, output.files)
        except RefusedBatchError as exc:
            raise self._refuse(batch, exc) from exc
        batch = self.store.transition(
            batch, BatchState.PREPARED, files=output.files, schemas=output.schemas
        )
        crashpoint("after_prepare")
        return batch

    def commit(self, batch: Batch, *, recovering: bool = False) -> Batch:
        """Publish exactly the voted files; idempotent against the table's txn version.

        First every voted file must still be on storage with its voted size (invariant 11).
        If one is not, nothing of that vote is published: an alert goes out and the batch
        is staged again over the same ranges as a new attempt, votes, and is checked again;
        at most `max_restages` times in one call, then the call fails loudly (the next
        call tries again). Outputs that already hold the batch are not checked and get
        nothing (invariant 12).
        """
        if batch.state is not BatchState.PREPARED:
            raise InconsistencyError(
                f"batch {batch.label}: commit needs PREPARED, not {batch.state}"
            )
        table_history.refuse_before_commit(self, batch)
        batch, files, check = restage.checked_vote(self, batch)
        if batch.voted_once and check.already_committed:
            restage.check_same_split(self, batch, files, check)
        with liveness.heartbeat(self, batch):
            try:
                result = self.publisher.publish(batch, files)
                if not result.published:  # the data table held its id: whose batch was it?
                    table_history.refuse_another_ledgers_batch(self, batch)
            except InconsistencyError as exc:
                self.alert(publish_refused(self.pipeline, batch, exc))
                raise
        crashpoint("recovery_after_delta_commit" if recovering else "after_delta_commit")
        published = len(check.to_publish) if result.published else 0
        batch = self.store.transition(
            batch,
            BatchState.COMMITTED,
            table_version=result.table_version,
            metrics={
                **result.metrics,
                "files_staged": len(check.staged),
                "files_committed": published,
                "files_already_committed": len(check.staged) - published,
                "files_missing": batch.metrics.get("files_missing", 0),
            },
        )
        crashpoint("after_committed")
        return batch

    def abort(self, batch: Batch, reason: str) -> Batch:
        """Give up a batch that never voted; its range is planned again by the next begin."""
        return self.store.transition(batch, BatchState.ABORTED, error=reason)

    def _refuse(self, batch: Batch, exc: RefusedBatchError) -> RefusedBatchError:
        """Abandon a batch whose staged output must never be voted; the error to raise.

        Recorded as ABORTED with the reason, so the ledger and the alerts say why, and the
        coordinator does not stage the same refused output again and again. The next batch
        plans the same range; it commits once the transform is fixed. Not logged: the error
        carries the reason to whoever shows it (the CLI's one line, the Dagster op's
        failure), and logging it too said it twice.
        """
        reason = f"batch {batch.label} refused before the vote: {exc}"
        if batch.voted_once:
            # It voted once (invariant 5): it waits, its range held, for a transform that
            # stages it as it was first staged; never abandoned.
            return RefusedBatchError(
                f"{reason}; it voted once and is being staged again, so it is never abandoned: "
                "restore the transform it was first staged with, then run recover"
            )
        self.abort(batch, reason)
        return RefusedBatchError(reason)

    # -- the ack (ledger/coordinator/acks.py) ----------------------------------------------

    def ack(self, batch: Batch) -> Batch:
        """Move the consumer group to the newest published batch's ends and mark the
        COMMITTED batches up to that one ACKED; a refusal leaves `batch` COMMITTED, with
        the refusal in its metrics, and is a warning, not an error."""
        return acks.ack(self, batch)

    def refused_acks(self) -> list[Batch]:
        """COMMITTED batches whose ack was refused since the last one that succeeded, oldest
        first."""
        return acks.refused_acks(self)

    def ack_failures_in_a_row(self) -> int:
        """Acks refused since the last one that succeeded, across batches and attempts."""
        return acks.ack_failures_in_a_row(self)

    # -- recovery and rebuild (ledger/coordinator/recovery.py) ------------------------------

    def recover_and_commit(self, *, wait: bool = True) -> list[Batch]:
        """Finish every batch of this application id that voted, abandon every dead one that
        did not; with `wait`, BusyError while one that blocks planning may be alive."""
        return recovery.recover_and_commit(self, wait=wait)

    def abandon_dead(self, still_running: Callable[[Batch], bool] = _never) -> list[Batch]:
        """Abandon every batch that has not voted and whose attempt cannot be running any
        more (nor `still_running` says it is); returns them, now ABORTED."""
        return recovery.abandon_dead(self, still_running)

    def redrive(self, batch_id: int) -> Batch | None:
        """Finish one batch that voted, under a new attempt; None if it is not past the vote."""
        return recovery.redrive(self, batch_id)

    def needs_redrive(self, batch: Batch) -> bool:
        """Whether a voted batch is left with nobody finishing it (invariant 5)."""
        return recovery.needs_redrive(self, batch)

    def rebuild_from_log(self, *, history_required: bool = True) -> int:
        """Re-create committed batches the ledger lacks from the Delta log's commit info;
        returns how many."""
        return recovery.rebuild_from_log(self, history_required=history_required)

    # -- liveness (ledger/coordinator/liveness.py) ----------------------------------------

    def may_be_alive(self, batch: Batch) -> bool:
        """Whether the attempt that owns `batch` may still be running somewhere."""
        return liveness.may_be_alive(self, batch)

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
