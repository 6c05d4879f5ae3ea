"""The two-phase commit of one micro-batch, in the shape of Flink's TwoPhaseCommitSinkFunction.

    begin()               plan: fix the offset range of every partition       -> PLANNED
    invoke(batch)         stage: write files nobody can see yet                -> STAGED
    pre_commit(...)       the vote: record exactly those files, durably        -> PREPARED
    commit(batch)         publish them in one Delta transaction                -> COMMITTED
    ack(batch)            move the consumer group (advisory; a refusal is a warning) -> ACKED
    abort(batch)          give up a batch that has not voted                   -> ABORTED
    recover_and_commit()  on every start: finish what voted, abandon the rest
    abandon_dead()        abandon the batches that have not voted and whose owner is gone
    redrive(batch_id)     finish one voted batch under a new attempt
    needs_redrive(batch)  whether a voted batch is left with nobody finishing it
    next_batch()          what begin() would plan now, or why nothing, without planning

Before publishing, commit() checks that the vote's files are still on storage as voted; a
vote that lost files is never published but staged again over the same ranges as a new
attempt (invariant 11). Recovery rebuilds a lost ledger from every output's log (invariant
12).

The edges (Kafka offsets, the Spark stage job, the Delta tables) come in through the small
protocols below, so this module can be exercised with in-memory fakes and read alone.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from ledger import topics_coordinator
from ledger.batch import RESTAGE, Batch, BatchKind, StagedFile, this_owner
from ledger.crash import crashpoint
from ledger.decisions import Decision, DecisionKind, resume_command
from ledger.errors import (
    BusyError,
    ExactlyError,
    FencedError,
    InconsistencyError,
    RefusedBatchError,
)
from ledger.process import running
from ledger.protocol import (
    ABANDONABLE,
    BLOCKS_PLANNING,
    MUST_FINISH,
    PUBLISHED,
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
from ledger.vote_check import VoteCheck, check_vote, describe


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
    #: what the publisher wants kept in the batch's metrics (each derived output's
    #: MERGE: applied, version, rows), recorded with COMMITTED
    metrics: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NextBatch:
    """What `begin()` would plan now, worked out without planning it.

    A batch is due when `batch_id` is set (with its `ranges`). Otherwise `in_flight` is the
    batch that must be published first (one batch at a time; BLOCKS_PLANNING), or None when
    the topic holds nothing new (caught up).
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
        """The newest batch id any output holds for `app_id`."""

    def publish(self, batch: Batch, files: Sequence[StagedFile]) -> PublishResult:
        """Publish exactly `files` with the app transaction (app id, batch id); idempotent
        per output: an output that already holds the batch gets nothing (invariant 12)."""

    def committed_batches(self, app_id: str) -> list[dict[str, Any]]:
        """Commit metadata of every batch of `app_id` still in any output's log, one entry
        per batch. An entry whose `complete` is False is held by some outputs and not by the
        last one published (a crash between the commits); missing means True."""

    def outputs_holding(self, batch: Batch) -> set[str]:
        """The outputs (StagedFile.target) whose app-transaction version for the batch's
        application id is at or past its batch id: they hold the batch already."""

    def file_size(self, target: str, path: str) -> int | None:
        """The size of a staged file of output `target` (path relative to the output's
        root) on storage now; None when it does not exist."""

    def rows_held(self, batch: Batch, target: str) -> int | None:
        """How many rows of output `target` have coordinates in the batch's ranges; None
        for an output whose rows are not the batch's records (a derived output's groups)."""

    def check_schemas(self, schemas: Mapping[str, str]) -> None:
        """Raise RefusedBatchError if a table cannot take its staged schema (invariant 14)."""

    def rows_reach(self, topic: str) -> dict[int, int]:
        """Per partition, one past the highest offset of `topic` in the published rows: the
        resume-at hint when the log no longer holds the newest batch (`rebuild_from_log`)."""


@dataclass(frozen=True)
class Incident:
    """Something operators must hear about. The coordinator has no sinks of its own: its
    `alert` hook delivers it (the pipeline's alert sinks, jobs/pipeline.py; or the log)."""

    kind: str
    title: str
    text: str
    details: Mapping[str, Any] = field(default_factory=dict)


def _never(_batch: Batch) -> bool:
    return False


class TwoPhaseCommit:
    """Drives batches of one application id through the protocol, one at a time."""

    def __init__(
        self,
        store: LedgerStore,
        *,
        pipeline: str,
        app_id: str,
        source: OffsetSource | topics_coordinator.TopicsSource,
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
        (ledger/backfill.py); it runs inside the planning transaction, on every batch of the
        pipeline as that transaction reads them, so nothing is planned in between.
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
            check=check,
            topic_id=topic_id,
        )
        assert batch is not None
        crashpoint("after_plan")
        return batch

    def invoke(self, batch: Batch) -> tuple[Batch, StageOutput]:
        """Stage the batch; on success it is STAGED. Nothing is visible to readers yet."""
        output = self._stage(batch)
        batch = self.store.transition(batch, BatchState.STAGED, metrics=_stage_metrics(output))
        crashpoint("after_stage")
        return batch, output

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
            with self._heartbeat(batch):
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
        is refused first (invariant 14) and the batch abandoned instead.
        """
        try:
            self.publisher.check_schemas(output.schemas)
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
        restages = 0
        while True:
            self.store.require_current(batch)
            files = self.store.files(batch.app_id, batch.batch_id)
            check = self.check_vote(batch, files)
            if not check.missing:
                break
            if restages >= self.max_restages:
                self._alert_missing(batch, check, restaging=False)
                raise InconsistencyError(
                    f"batch {batch.label}: voted files vanished again after {restages} "
                    f"re-stages in a row ({', '.join(describe(check.missing, 3))}): something "
                    "deletes staged files before they are committed (a storage lifecycle rule "
                    "or a VACUUM of the staging folders?); stop it, then run recover"
                )
            batch = self._restage(batch, check)
            restages += 1
        if batch.voted_once and check.already_committed:
            self.check_same_split(batch, files, check)
        with self._heartbeat(batch):
            try:
                result = self.publisher.publish(batch, files)
            except InconsistencyError as exc:
                self._alert_refused(batch, exc)
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

    def check_vote(self, batch: Batch, files: Sequence[StagedFile]) -> VoteCheck:
        """Which voted files are missing or changed on storage, skipping outputs that
        already hold the batch (invariant 11)."""
        return check_vote(files, self.publisher.outputs_holding(batch), self.publisher.file_size)

    def check_same_split(self, batch: Batch, files: Sequence[StagedFile], check: VoteCheck) -> None:
        """A batch staged again while some outputs already hold it (a crash between the
        commits) publishes only to the others, so the new stage must have split the
        records as the first did: per output that holds the batch, as many records as it
        holds in the batch's ranges. A transform changed in between (or one that is not
        deterministic) would otherwise put a record in two outputs or in none (invariant
        1). Counts, not coordinates: an exchange of records between outputs passes. An
        output whose rows are not records (a derived output: `rows_held` is None) cannot be
        counted back; the data table's count is its guard when the data table holds the
        batch (docs/derived-tables.md: a partial fingerprint is the planned check)."""
        for target in sorted({f.target for f in check.already_committed}):
            staged = sum(f.records for f in files if f.target == target)
            held = self.publisher.rows_held(batch, target)
            if held is not None and staged != held:
                raise InconsistencyError(
                    f"batch {batch.label}: the {target} holds {held} rows of its ranges from "
                    f"an earlier attempt, but the batch was staged again and staged {staged} "
                    f"{target} rows: the transform splits these records differently now "
                    "(changed since the first attempt?); publishing would duplicate or lose "
                    "records. Run recover with the transform the batch was first staged with"
                )

    def _restage(self, batch: Batch, check: VoteCheck) -> Batch:
        """Send a vote that lost files back to PLANNED (a new attempt, its file rows gone,
        why recorded), then stage and vote again over the same ranges: the PREPARED batch
        of the new attempt. The old vote's files are orphans, never published."""
        self._alert_missing(batch, check, restaging=True)
        missing = describe(check.missing)
        count = batch.metrics.get(RESTAGE, {}).get("count", 0) + 1
        planned = self.store.restage(
            batch,
            reason=(
                f"re-staged as attempt {batch.attempt + 1}: {len(check.missing)} voted file(s) "
                f"were missing or of another size before the commit: {', '.join(missing)}"
            ),
            metrics={
                RESTAGE: {
                    "count": count,
                    "missing": missing,
                    "outputs_holding": sorted({f.target for f in check.already_committed}),
                },
                "files_missing": batch.metrics.get("files_missing", 0) + len(check.missing),
            },
        )
        self.log(f"re-staging batch {planned.label} over {_ranges_text(planned)}")
        staged, output = self.invoke(planned)
        return self.pre_commit(staged, output)

    def _alert_refused(self, batch: Batch, exc: InconsistencyError) -> None:
        """Tell operators an output refused the batch at publish (a PostgreSQL output's
        compare-and-set found it out of order, a schema no output can take): a protocol
        violation or an operator's fix to make; the batch waits PREPARED, never skipped
        (invariant 5), and the pipeline stops on the error."""
        self.alert(
            Incident(
                kind="publish_refused",
                title=f"{self.pipeline}: batch {batch.batch_id} refused at publish",
                text=f"batch {batch.label} ({_ranges_text(batch)}) was not published: {exc}",
                details={
                    "app_id": batch.app_id,
                    "batch_id": batch.batch_id,
                    "attempt": batch.attempt,
                    "error": str(exc),
                },
            )
        )

    def _alert_missing(self, batch: Batch, check: VoteCheck, *, restaging: bool) -> None:
        """Tell operators a vote lost files: it is a storage problem someone must fix."""
        what = (
            "nothing of that vote is published; the batch is re-staged over the same ranges "
            "as a new attempt"
            if restaging
            else f"it was re-staged {self.max_restages} times and lost files every time; "
            "the commit stops here and the batch waits (its range is held)"
        )
        missing = describe(check.missing)
        self.alert(
            Incident(
                kind="staged_files_missing",
                title=f"{self.pipeline}: batch {batch.batch_id} lost staged files",
                text=(
                    f"batch {batch.label} ({_ranges_text(batch)}) voted files that are gone or "
                    f"changed before its commit: {', '.join(missing)}"
                    f"{' ...' if len(check.missing) > len(missing) else ''}; {what}"
                ),
                details={
                    "app_id": batch.app_id,
                    "batch_id": batch.batch_id,
                    "attempt": batch.attempt,
                    "missing": missing,
                    "files_missing": len(check.missing),
                    "restaging": restaging,
                },
            )
        )

    def ack(self, batch: Batch) -> Batch:
        """Move the consumer group to the newest published batch's ends, then mark every
        COMMITTED batch up to that one ACKED.

        Advisory: the table and the ledger, never the group, decide what comes next. So a
        group that refuses the commit (it has active members, an ACL is missing) is a warning,
        not an error: the batch stays COMMITTED, complete, with the refusal in its metrics
        (`ack_error`, `ack_failures`, `ack_failures_in_a_row`), planning goes on (COMMITTED
        does not block it), and the next ack that succeeds catches the group up. The group is
        moved to the newest batch the tables hold, never to `batch`'s own ends, so an old batch
        acked late (a zombie, a slow re-drive) never moves it backwards (invariant 16).
        """
        if self.kind != BatchKind.LIVE:
            return self.store.transition(batch, BatchState.ACKED)
        try:
            through = self._ack_newest(batch)
        except Exception as exc:  # advisory: whatever refused it, the batch is complete
            return self._ack_refused(batch, exc)
        acked = self._mark_acked(batch, through)
        self._catch_up_acks(through)
        return acked

    def _ack_newest(self, batch: Batch, rounds: int = 5) -> int:
        """Move the group to the newest published batch's ends; returns that batch's id.

        After each commit to the group the ledger is read again: if a newer batch was
        published meanwhile, its committer's ack may have reached Kafka before ours, and ours
        would have moved the group back, so the newer ends are committed again. Once a read
        finds nothing newer, any later batch is acked by its committer after ours completed.
        """
        newest = self._newest_published(batch)
        for _ in range(rounds):
            self.source.ack(newest.ranges)
            again = self._newest_published(newest)
            if again.batch_id == newest.batch_id:
                break
            newest = again
        return newest.batch_id

    def _mark_acked(self, batch: Batch, through: int) -> Batch:
        """Move `batch` to ACKED; if a later batch's ack caught it up first, that is the same
        outcome, not a fencing to report."""
        try:
            return self.store.transition(
                batch, BatchState.ACKED, metrics={"acked_to_batch": through}
            )
        except FencedError:
            current = self.store.get(batch.app_id, batch.batch_id)
            if current is None or current.state is not BatchState.ACKED:
                raise
            return current

    def _newest_published(self, batch: Batch) -> Batch:
        """The newest batch of this application id the tables hold (`batch` itself unless a
        later one was committed meanwhile): where the group belongs."""
        newest = self.store.batches(app_id=self.app_id, states=PUBLISHED, limit=1)
        return newest[0] if newest and newest[0].batch_id > batch.batch_id else batch

    def _catch_up_acks(self, through: int) -> None:
        """Mark the COMMITTED batches up to `through` ACKED: the group now points past them."""
        for older in self.store.batches(app_id=self.app_id, states=[BatchState.COMMITTED]):
            if older.batch_id > through:
                continue
            try:
                self.store.transition(older, BatchState.ACKED, metrics={"acked_to_batch": through})
            except FencedError:
                continue  # another attempt acked it meanwhile

    def _ack_refused(self, batch: Batch, exc: Exception) -> Batch:
        """Record a refused ack on the batch (it stays COMMITTED) and warn."""
        in_a_row = self.ack_failures_in_a_row() + 1
        refused = self.store.record_metrics(
            batch,
            {
                "ack_error": str(exc),
                "ack_failures": int(batch.metrics.get("ack_failures", 0)) + 1,
                "ack_failures_in_a_row": in_a_row,
            },
        )
        self.log(
            f"warning: batch {batch.label} is committed, but the consumer group was not moved "
            f"({in_a_row} refused in a row): {exc}. The batch is complete and the next batch "
            "runs; the next ack that succeeds catches the group up."
        )
        return refused

    def refused_acks(self) -> list[Batch]:
        """COMMITTED batches whose ack was refused since the last one that succeeded (a
        success acks every batch up to the newest), oldest first."""
        committed = self.store.batches(app_id=self.app_id, states=[BatchState.COMMITTED])
        return sorted((b for b in committed if "ack_error" in b.metrics), key=lambda b: b.batch_id)

    def ack_failures_in_a_row(self) -> int:
        """Acks refused since the last one that succeeded, across batches and attempts."""
        return sum(int(b.metrics.get("ack_failures", 0)) for b in self.refused_acks())

    def abort(self, batch: Batch, reason: str) -> Batch:
        """Give up a batch that never voted; its range is planned again by the next begin."""
        return self.store.transition(batch, BatchState.ABORTED, error=reason)

    def _refuse(self, batch: Batch, exc: RefusedBatchError) -> RefusedBatchError:
        """Abandon a batch whose staged output must never be voted; the error to raise.

        Recorded as ABORTED with the reason, so the ledger and the alerts say why, and the
        coordinator does not stage the same refused output again and again. The next batch
        plans the same range; it commits once the transform is fixed.
        """
        reason = f"batch {batch.label} refused before the vote: {exc}"
        self.log(reason)
        if batch.voted_once:
            # It voted once (invariant 5): it waits, its range held, for a transform that
            # stages it as it was first staged; never abandoned.
            return RefusedBatchError(
                f"{reason}; it voted once and is being staged again, so it is never abandoned: "
                "restore the transform it was first staged with, then run recover"
            )
        self.abort(batch, reason)
        return RefusedBatchError(reason)

    # -- recovery -----------------------------------------------------------------------

    def recover_and_commit(self, *, wait: bool = True) -> list[Batch]:
        """Finish every batch of this application id that voted, abandon every dead one that
        did not.

        Runs before anything new is planned (invariant 5). Rebuilds missing committed
        history from the Delta log first (invariant 7). With `wait`, raises BusyError if a
        batch that has not voted, or a PREPARED one, belongs to an attempt that may still
        be alive: the caller is about to plan on this application id and must wait for it.
        Without, such batches are left to their owners: a caller planning on the other
        application id (jobs/pipeline.py `Pipeline.recover`) has nothing to wait for.

        A voted batch whose owner may still be running is its owner's to finish: two runs
        started at once, one between its vote and its ack when the other's recovery looks.
        Taking it over would be safe (the owner is fenced at its next transition) but would
        fail a healthy run. So recovery takes over only voted batches whose owner is gone,
        and a COMMITTED one whose ack was refused (its owner has moved on; the ack is
        retried here). A COMMITTED batch of a live owner does not block planning and is
        left alone; a PREPARED one does, so it is BusyError: wait for it to finish.
        """
        self.rebuild_from_log(history_required=wait or self.kind is BatchKind.LIVE)
        finished = []
        voted = self.store.batches(app_id=self.app_id, states=MUST_FINISH | ABANDONABLE)
        for stale in sorted(voted, key=lambda b: b.batch_id):
            batch = self.store.get(self.app_id, stale.batch_id)
            if batch is None:
                continue
            try:
                if batch.state in ABANDONABLE:
                    if batch.voted_once and not self.may_be_alive(batch):
                        with self._finishing(batch):
                            finished.append(self._finish_restaging(batch))
                    continue  # the others are abandoned below, if their owner is gone
                if batch.state not in MUST_FINISH:
                    continue  # an earlier batch's ack caught it up
                if self.may_be_alive(batch) and "ack_error" not in batch.metrics:
                    continue  # its owner is finishing it (a PREPARED one is BusyError below)
                with self._finishing(batch):
                    finished.append(self._finish_voted(batch))
            except FencedError:
                # another start took it over first (two recoveries at once): it is the
                # winner's to finish; with `wait`, BusyError below waits for it
                self.log(f"batch {batch.label} was taken over by another start; left to it")
        finished.extend(self.abandon_dead())
        if not wait:
            return finished
        waiting = ABANDONABLE | {BatchState.PREPARED}
        for batch in self.store.batches(app_id=self.app_id, states=waiting):
            raise BusyError(
                f"batch {batch.label} is {batch.state} and its owner {batch.owner} "
                "may still be running; try again when it finishes"
            )
        return finished

    def abandon_dead(self, still_running: Callable[[Batch], bool] = _never) -> list[Batch]:
        """Abandon every batch of this application id that has not voted and whose attempt
        cannot be running any more; returns them, now ABORTED.

        Dead means: the owner process is gone (same host), or silent past its lease by the
        database's clock (another host; invariant 17), and `still_running` (what an
        orchestrator knows, e.g. that a Dagster run of the batch is still alive and may
        continue it) does not say otherwise. Invariant 5 allows it (nothing voted); the next
        batch plans the same ranges again (invariant 16: a dead run never stops the pipeline).
        Batches that may be alive are left alone; one that moves on meanwhile is skipped.
        """
        abandoned = []
        for batch in sorted(
            self.store.batches(app_id=self.app_id, states=ABANDONABLE), key=lambda b: b.batch_id
        ):
            if batch.voted_once:
                continue  # never abandoned (invariant 5): redrive() stages it again
            if self.may_be_alive(batch) or still_running(batch):
                continue
            self.log(f"abandoning batch {batch.label} ({batch.state}, owner gone)")
            try:
                abandoned.append(self.abort(batch, f"abandoned by recovery: {batch.owner} is gone"))
            except FencedError:
                continue  # its owner moved it on after all, or another recovery was first
        return abandoned

    def redrive(self, batch_id: int) -> Batch | None:
        """Finish one batch that voted, under a new attempt; None if it is not past the vote.

        For an orchestrator that re-drives a batch whose run died (invariant 5) without
        recovering everything else: only PREPARED or COMMITTED batches are touched.
        """
        batch = self.store.get(self.app_id, batch_id)
        if batch is None:
            return None
        if batch.state in MUST_FINISH:
            with self._finishing(batch):
                return self._finish_voted(batch)
        if batch.voted_once and batch.state in ABANDONABLE and not self.may_be_alive(batch):
            with self._finishing(batch):
                return self._finish_restaging(batch)
        return None

    @contextmanager
    def _finishing(self, batch: Batch) -> Iterator[None]:
        """Say, when a voted batch cannot be finished now, which outputs hold it.

        A voted batch is published output by output, the raw table last (invariant 12), so
        until it is finished the outputs that hold it disagree with those that do not: an
        aggregate may count records the raw table lacks. The start must not go on as if
        nothing were wrong, so the error (its kind kept: Kafka's retention, an unreachable
        store, a refused commit) is raised again with the batch and the outputs holding it,
        as one line; the batch stays as it is, never abandoned (invariant 5), for the next
        start to finish. A batch another attempt took over (FencedError) or that is busy
        is not this start's to explain.
        """
        try:
            yield
        except (FencedError, BusyError):
            raise
        except ExactlyError as exc:
            try:
                holding: set[str] | None = self.publisher.outputs_holding(batch)
            except Exception:  # the store that failed the batch may fail this read too
                holding = None
            raise _unfinished(exc, batch, holding) from exc

    def needs_redrive(self, batch: Batch) -> bool:
        """Whether a voted batch is left with nobody finishing it (invariant 5).

        Its attempt cannot be alive any more; and a COMMITTED batch whose ack was refused is
        retried only once `ack_retry_seconds` passed since its last attempt (by the
        database's clock): the batch is complete and the group advisory, so a group that
        keeps refusing is retried, not hammered by a run per sensor evaluation.
        """
        if self.may_be_alive(batch):
            return False
        if batch.voted_once and batch.state in ABANDONABLE:
            return True  # a vote sent back to be staged again, whose attempt died
        if batch.state not in MUST_FINISH:
            return False
        if batch.state is BatchState.COMMITTED and "ack_error" in batch.metrics:
            since = (self.store.now() - batch.heartbeat_at).total_seconds()
            return since >= self.ack_retry_seconds
        return True

    def _finish_voted(self, batch: Batch) -> Batch:
        """Take the batch over (fencing its old attempt), publish it if it is still PREPARED,
        and ack it; recovery and re-drive both finish voted batches here."""
        batch = self.store.takeover(batch)
        self.log(f"re-driving batch {batch.label} from {batch.state}")
        if batch.state is BatchState.PREPARED:
            batch = self.commit(batch, recovering=True)
        return self.ack(batch)

    def _finish_restaging(self, batch: Batch) -> Batch:
        """Take over a batch that voted once and went back to be staged again (invariant
        11), or that a rebuild found in some outputs only (invariant 12), whose attempt
        died: stage it over its ranges under a new attempt, vote, commit and ack. It is
        never abandoned (invariant 5); if its ranges left Kafka this fails loudly
        (DataLossError) and the batch stays as it is, to be finished later."""
        batch = self.store.takeover(batch)
        self.log(f"re-staging batch {batch.label} from {batch.state} over {_ranges_text(batch)}")
        if batch.state is BatchState.PLANNED:
            batch, output = self.invoke(batch)
        else:  # STAGED by a dead attempt, whose files were never voted: stage anew
            output = self._stage(batch)
            batch = self.store.record_metrics(batch, _stage_metrics(output))
        return self.ack(self.commit(self.pre_commit(batch, output), recovering=True))

    def rebuild_from_log(self, *, history_required: bool = True) -> int:
        """Re-create committed batches the ledger lacks from the Delta log's commit info.

        Reads every output's log (invariant 12): a batch some outputs hold and others not
        (a crash between the commits) is finished work, never planned again; it is
        re-created as a batch to be staged again over its ranges and published to the
        outputs that lack it (each output is idempotent by its own txn version).

        Returns how many were re-created. Refuses (loudly) when the newest batch is not in
        the log any more, because positions could then not be known; unless not
        `history_required`: a live start rebuilding the backfills' application id needs
        only what the logs still have (an unfinished backfill is recent, its commit info
        there), while the next backfill's range checks need it all and refuse then.
        """
        version = self.publisher.committed_version(self.app_id)
        if version is None:
            return 0
        known = self.store.get(self.app_id, version)
        if known is not None:
            stale = known.state in ABANDONABLE and not known.voted_once
            if stale or known.state is BatchState.ABORTED:
                raise InconsistencyError(
                    f"the Delta table holds batch {self.app_id}/{version}, but the ledger has "
                    f"it {known.state}: the ledger is older than the table (restored from a "
                    "backup?); move the ledger aside to rebuild it from the Delta log"
                )
            return 0
        entries = self.publisher.committed_batches(self.app_id)
        gone = not any(e["batch_id"] == version for e in entries)
        if gone and not history_required:
            self.log(
                f"batches of {self.app_id} through {version} are no longer all in the Delta "
                "log (log retention?): rebuilt what it has; a backfill start will refuse"
            )
        elif gone and not self._resumed(version):
            raise InconsistencyError(
                f"the Delta table holds batch {self.app_id}/{version}, but its commit info is no "
                "longer in the Delta log (log retention?): offsets cannot be rebuilt; if the "
                "table's rows are complete, state where each partition continues (one past its "
                "highest offset in the table): " + self._resume_hint()
            )
        rebuilt = 0
        for entry in entries:
            if self.store.get(self.app_id, entry["batch_id"]) is not None:
                continue
            ranges = [OffsetRange.from_dict(r) for r in entry["ranges"]]
            decisions = [Decision.from_dict(d) for d in entry.get("decisions") or ()]
            for decision in decisions:
                self.store.insert_decision(decision)
            if not entry.get("complete", True):
                rebuilt += self._insert_unfinished(entry, ranges, decisions)
                continue
            rebuilt += self.store.insert_committed(
                pipeline=self.pipeline,
                app_id=self.app_id,
                kind=BatchKind(entry.get("kind", self.kind)),
                batch_id=entry["batch_id"],
                ranges=ranges,
                table_version=entry.get("table_version"),
                params=entry.get("params"),
                topic_id=entry.get("topic_ids") or entry.get("topic_id"),
                decisions=decisions,
            )
        self.log(f"rebuilt {rebuilt} committed batches of {self.app_id} from the Delta log")
        return rebuilt

    def _resume_hint(self) -> str:
        """The resume-at command with the table's reach filled in; resume-at is built for
        one topic, so a pipeline on several topics is told that instead."""
        if topics_coordinator.reads_several_topics(self.source):
            return (
                "exactly skip resume-at is built for one topic only, and this pipeline reads "
                "several: restore the ledger from a backup"
            )
        return resume_command(
            self.publisher.rows_reach(self.source.topic), sorted(self.source.available())
        )

    def _insert_unfinished(
        self, entry: Mapping[str, Any], ranges: list[OffsetRange], decisions: list[Decision]
    ) -> bool:
        """Re-create a batch that some outputs hold and others not as one to be staged
        again over its ranges and finished (invariant 12)."""
        holding = sorted(entry.get("outputs", []))
        batch_id = int(entry["batch_id"])
        self.log(f"batch {self.app_id}/{batch_id} is in {holding} only: it will be re-staged")
        return self.store.insert_unfinished(
            pipeline=self.pipeline,
            app_id=self.app_id,
            kind=BatchKind(entry.get("kind", self.kind)),
            batch_id=batch_id,
            ranges=ranges,
            params=entry.get("params"),
            reason=(
                f"rebuilt from the Delta logs: {', '.join(holding)} hold(s) batch {batch_id}, "
                "the other outputs not; it is staged again over its ranges to finish it"
            ),
            metrics={RESTAGE: {"count": 0, "missing": [], "outputs_holding": holding}},
            topic_id=entry.get("topic_ids") or entry.get("topic_id"),
            decisions=decisions,
        )

    def _resumed(self, version: int) -> bool:
        """Whether an operator stated where to continue past the table's `version` when its
        commit info was gone (a resume-at decision, invariant 15)."""
        return any(
            d.kind is DecisionKind.RESUME_AT and d.after_batch_id >= version
            for d in self.store.decisions(app_id=self.app_id)
        )

    def may_be_alive(self, batch: Batch) -> bool:
        """Whether the attempt that owns `batch` may still be running somewhere.

        The heartbeat's age is the database's now minus the heartbeat the database stamped
        (invariant 17): the owner's clock and ours are never compared.
        """
        me = this_owner()
        if batch.owner.same_process(me):
            return False
        age = (self.store.now() - batch.heartbeat_at).total_seconds()
        return owner_may_be_alive(
            batch.owner,
            age,
            self.lease_seconds,
            socket.gethostname(),
            batch.owner.host == me.host and running(batch.owner),
        )

    @contextmanager
    def _heartbeat(self, batch: Batch) -> Iterator[None]:
        """Keep the attempt's lease fresh while it stages or publishes (either can take
        minutes), so recovery elsewhere neither abandons it nor takes its vote over."""
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


def _unfinished(exc: ExactlyError, batch: Batch, holding: set[str] | None) -> ExactlyError:
    """`exc` again, of its own kind, saying that `batch` stays unfinished and which outputs
    hold it (`TwoPhaseCommit._finishing`; None: they could not be read)."""
    if holding is None:
        held = "which outputs hold it could not be read"
    elif holding:
        held = f"{', '.join(sorted(holding))} hold(s) it and the other outputs do not"
    else:
        held = "no output holds it yet"
    text = " ".join(str(exc).split()).rstrip(".")
    message = (
        f"voted batch {batch.app_id}/{batch.batch_id} cannot be finished: {text}; until it is, "
        f"{held}; the next start tries again"
    )
    try:
        return type(exc)(message)
    except TypeError:  # an error class with arguments of its own
        return InconsistencyError(message)


def _stage_metrics(output: StageOutput) -> dict[str, Any]:
    """What a stage records in the batch's metrics (shown by `exactly ledger` and Dagster)."""
    return {
        "records_read": output.records_read,
        "table_records": output.table_records,
        "quarantine_records": output.quarantine_records,
        "files": len(output.files),
        "stage_detail_s": output.seconds,
    }


def _ranges_text(batch: Batch) -> str:
    return " ".join(str(r) for r in batch.ranges if r.span) or "(empty)"


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
