"""Recovery: finishing the batches that voted, abandoning the dead ones that did not, and
rebuilding a lost ledger from the Delta logs.

Every start runs `recover_and_commit` before it plans (invariant 5); an orchestrator
re-drives one voted batch whose run died with `redrive`, when `needs_redrive` says nobody
is finishing it. A voted batch is never abandoned: it is published under a new attempt,
or staged again over its ranges when its vote lost files or some outputs only hold it
(invariants 11, 12). The ledger's committed history is rebuilt from every output's log
first (invariant 7).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ledger.coordinator import table_history
from ledger.coordinator import topics as topics_coordinator
from ledger.coordinator.reports import ranges_text, unfinished
from ledger.core.backfill import backfill_app_id
from ledger.core.batch import RESTAGE, Batch, BatchKind
from ledger.core.decision_rules import resume_command
from ledger.core.decisions import Decision, DecisionKind
from ledger.core.errors import BusyError, ExactlyError, FencedError, InconsistencyError
from ledger.core.protocol import ABANDONABLE, MUST_FINISH, BatchState, OffsetRange

if TYPE_CHECKING:
    from ledger.coordinator.two_phase import TwoPhaseCommit


def recover_and_commit(tpc: TwoPhaseCommit, *, wait: bool = True) -> list[Batch]:
    """Finish every batch of this application id that voted, abandon every dead one that
    did not.

    Runs before anything new is planned (invariant 5). Rebuilds missing committed
    history from the Delta log first (invariant 7). With `wait`, raises BusyError if a
    batch that has not voted, or a PREPARED one, belongs to an attempt that may still
    be alive: the caller is about to plan on this application id and must wait for it.
    Without, such batches are left to their owners: a caller planning on the other
    application id (jobs/wiring/pipeline.py `Pipeline.recover`) has nothing to wait for.

    A voted batch whose owner may still be running is its owner's to finish: two runs
    started at once, one between its vote and its ack when the other's recovery looks.
    Taking it over would be safe (the owner is fenced at its next transition) but would
    fail a healthy run. So recovery takes over only voted batches whose owner is gone,
    and a COMMITTED one whose ack was refused (its owner has moved on; the ack is
    retried here). A COMMITTED batch of a live owner does not block planning and is
    left alone; a PREPARED one does, so it is BusyError: wait for it to finish.
    """
    tpc.rebuild_from_log(history_required=wait or tpc.kind is BatchKind.LIVE)
    finished = []
    voted = tpc.store.batches(app_id=tpc.app_id, states=MUST_FINISH | ABANDONABLE)
    for stale in sorted(voted, key=lambda b: b.batch_id):
        batch = tpc.store.get(tpc.app_id, stale.batch_id)
        if batch is None:
            continue
        try:
            if batch.state in ABANDONABLE:
                if batch.voted_once and not tpc.may_be_alive(batch):
                    with finishing(tpc, batch):
                        finished.append(_finish_restaging(tpc, batch))
                continue  # the others are abandoned below, if their owner is gone
            if batch.state not in MUST_FINISH:
                continue  # an earlier batch's ack caught it up
            if tpc.may_be_alive(batch) and "ack_error" not in batch.metrics:
                continue  # its owner is finishing it (a PREPARED one is BusyError below)
            with finishing(tpc, batch):
                finished.append(_finish_voted(tpc, batch))
        except FencedError:
            # another start took it over first (two recoveries at once): it is the
            # winner's to finish; with `wait`, BusyError below waits for it
            tpc.log(f"batch {batch.label} was taken over by another start; left to it")
    finished.extend(tpc.abandon_dead())
    if not wait:
        return finished
    waiting = ABANDONABLE | {BatchState.PREPARED}
    for batch in tpc.store.batches(app_id=tpc.app_id, states=waiting):
        raise BusyError(
            f"batch {batch.label} is {batch.state} and its owner {batch.owner} "
            "may still be running; try again when it finishes"
        )
    return finished


def abandon_dead(tpc: TwoPhaseCommit, still_running: Callable[[Batch], bool]) -> list[Batch]:
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
        tpc.store.batches(app_id=tpc.app_id, states=ABANDONABLE), key=lambda b: b.batch_id
    ):
        if batch.voted_once:
            continue  # never abandoned (invariant 5): redrive() stages it again
        if tpc.may_be_alive(batch) or still_running(batch):
            continue
        tpc.log(f"abandoning batch {batch.label} ({batch.state}, owner gone)")
        try:
            abandoned.append(tpc.abort(batch, f"abandoned by recovery: {batch.owner} is gone"))
        except FencedError:
            continue  # its owner moved it on after all, or another recovery was first
    return abandoned


def redrive(tpc: TwoPhaseCommit, batch_id: int) -> Batch | None:
    """Finish one batch that voted, under a new attempt; None if it is not past the vote.

    For an orchestrator that re-drives a batch whose run died (invariant 5) without
    recovering everything else: only PREPARED or COMMITTED batches are touched.
    """
    batch = tpc.store.get(tpc.app_id, batch_id)
    if batch is None:
        return None
    if batch.state in MUST_FINISH:
        with finishing(tpc, batch):
            return _finish_voted(tpc, batch)
    if batch.voted_once and batch.state in ABANDONABLE and not tpc.may_be_alive(batch):
        with finishing(tpc, batch):
            return _finish_restaging(tpc, batch)
    return None


def take_over(tpc: TwoPhaseCommit, batch: Batch) -> Batch:
    """Finish a voted batch now under a new attempt, whether or not its owner may be alive:
    an operator's release of a batch its hung owner holds (ledger/coordinator/release.py).

    Safe against the owner waking up: its token stops working at the takeover, so its next
    ledger write is refused (invariant 6), and a publish it had already begun meets this
    one at each output's compare-and-set (one Delta version per batch, max_commit_retries
    0, the PostgreSQL state row), so each output holds the batch once.
    """
    with finishing(tpc, batch):
        if batch.state in MUST_FINISH:
            return _finish_voted(tpc, batch)
        return _finish_restaging(tpc, batch)


@contextmanager
def finishing(tpc: TwoPhaseCommit, batch: Batch) -> Iterator[None]:
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
            holding: set[str] | None = tpc.publisher.outputs_holding(batch)
        except Exception:  # the store that failed the batch may fail this read too
            holding = None
        raise unfinished(exc, batch, holding) from exc


def needs_redrive(tpc: TwoPhaseCommit, batch: Batch) -> bool:
    """Whether a voted batch is left with nobody finishing it (invariant 5).

    Its attempt cannot be alive any more; and a COMMITTED batch whose ack was refused is
    retried only once `ack_retry_seconds` passed since its last attempt (by the
    database's clock): the batch is complete and the group advisory, so a group that
    keeps refusing is retried, not hammered by a run per sensor evaluation.
    """
    if tpc.may_be_alive(batch):
        return False
    if batch.voted_once and batch.state in ABANDONABLE:
        return True  # a vote sent back to be staged again, whose attempt died
    if batch.state not in MUST_FINISH:
        return False
    if batch.state is BatchState.COMMITTED and "ack_error" in batch.metrics:
        since = (tpc.store.now() - batch.heartbeat_at).total_seconds()
        return since >= tpc.ack_retry_seconds
    return True


def _finish_voted(tpc: TwoPhaseCommit, batch: Batch) -> Batch:
    """Take the batch over (fencing its old attempt), publish it if it is still PREPARED,
    and ack it; recovery and re-drive both finish voted batches here."""
    batch = tpc.store.takeover(batch)
    tpc.log(f"re-driving batch {batch.label} from {batch.state}")
    if batch.state is BatchState.PREPARED:
        batch = tpc.commit(batch, recovering=True)
    return tpc.ack(batch)


def _finish_restaging(tpc: TwoPhaseCommit, batch: Batch) -> Batch:
    """Take over a batch that voted once and went back to be staged again (invariant
    11), or that a rebuild found in some outputs only (invariant 12), whose attempt
    died: stage it over its ranges under a new attempt, vote, commit and ack. It is
    never abandoned (invariant 5); if its ranges left Kafka this fails loudly
    (DataLossError) and the batch stays as it is, to be finished later."""
    batch = tpc.store.takeover(batch)
    tpc.log(f"re-staging batch {batch.label} from {batch.state} over {ranges_text(batch)}")
    if batch.state is BatchState.PLANNED:
        batch, output = tpc.invoke(batch)
    else:  # STAGED by a dead attempt, whose files were never voted: stage anew
        batch, output = tpc.stage_anew(batch)
    return tpc.ack(tpc.commit(tpc.pre_commit(batch, output), recovering=True))


# -- the ledger rebuilt from the Delta logs -------------------------------------------------


def rebuild_from_log(tpc: TwoPhaseCommit, *, history_required: bool = True) -> int:
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
    table_history.refuse_a_table_without_its_batches(tpc)
    table_history.refuse_a_quarantine_without_its_rows(tpc)
    version = tpc.publisher.committed_version(tpc.app_id)
    if version is None:
        if tpc.kind is BatchKind.LIVE:
            # the live id holds no batch (just read); the backfills' may
            table_history.refuse_other_writers(tpc, [backfill_app_id(tpc.pipeline)])
        return 0
    known = tpc.store.get(tpc.app_id, version)
    if known is not None:
        stale = known.state in ABANDONABLE and not known.voted_once
        if stale or known.state is BatchState.ABORTED:
            raise InconsistencyError(
                f"the Delta table holds batch {tpc.app_id}/{version}, but the ledger has "
                f"it {known.state}: the ledger is older than the table (restored from a "
                "backup?); move the ledger aside to rebuild it from the Delta log"
            )
        return 0
    entries = tpc.publisher.committed_batches(tpc.app_id)
    gone = not any(e["batch_id"] == version for e in entries)
    if gone and not history_required:
        tpc.log(
            f"batches of {tpc.app_id} through {version} are no longer all in the Delta "
            "log (log retention?): rebuilt what it has; a backfill start will refuse"
        )
    elif gone and (unstated := _unresumed(tpc, version)):
        raise InconsistencyError(
            f"the Delta table holds batch {tpc.app_id}/{version}, but its commit info is no "
            "longer in the Delta log (log retention?): offsets cannot be rebuilt; if the "
            "table's rows are complete, state where each partition continues (one past its "
            "highest offset in the table): " + _resume_hint(tpc, unstated)
        )
    rebuilt = 0
    for entry in entries:
        if tpc.store.get(tpc.app_id, entry["batch_id"]) is not None:
            continue
        ranges = [OffsetRange.from_dict(r) for r in entry["ranges"]]
        decisions = [Decision.from_dict(d) for d in entry.get("decisions") or ()]
        for decision in decisions:
            tpc.store.insert_decision(decision)
        if not entry.get("complete", True):
            rebuilt += _insert_unfinished(tpc, entry, ranges, decisions)
            continue
        rebuilt += tpc.store.insert_committed(
            pipeline=tpc.pipeline,
            app_id=tpc.app_id,
            kind=BatchKind(entry.get("kind", tpc.kind)),
            batch_id=entry["batch_id"],
            ranges=ranges,
            table_version=entry.get("table_version"),
            params=entry.get("params"),
            topic_id=entry.get("topic_ids") or entry.get("topic_id"),
            decisions=decisions,
        )
    tpc.log(f"rebuilt {rebuilt} committed batches of {tpc.app_id} from the Delta log")
    return rebuilt


def _resume_hint(tpc: TwoPhaseCommit, topics: Sequence[str | None]) -> str:
    """The resume-at command of each topic in `topics`, with the table's reach filled in
    (None: the pipeline's one topic, which the command need not name)."""
    source = tpc.source
    commands = []
    for topic in topics:
        read = source.available() if topic is None else source.available_of(topic)  # type: ignore[union-attr]
        reach = tpc.publisher.rows_reach(topic or source.topic)  # type: ignore[union-attr]
        commands.append(resume_command(reach, sorted(read), topic=topic))
    return "; ".join(commands)


def _insert_unfinished(
    tpc: TwoPhaseCommit,
    entry: Mapping[str, Any],
    ranges: list[OffsetRange],
    decisions: list[Decision],
) -> bool:
    """Re-create a batch that some outputs hold and others not as one to be staged
    again over its ranges and finished (invariant 12)."""
    holding = sorted(entry.get("outputs", []))
    batch_id = int(entry["batch_id"])
    tpc.log(f"batch {tpc.app_id}/{batch_id} is in {holding} only: it will be re-staged")
    return tpc.store.insert_unfinished(
        pipeline=tpc.pipeline,
        app_id=tpc.app_id,
        kind=BatchKind(entry.get("kind", tpc.kind)),
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


def _unresumed(tpc: TwoPhaseCommit, version: int) -> list[str | None]:
    """The topics an operator has not yet stated where to continue on, past the table's
    `version` whose commit info is gone (resume-at decisions, invariant 15): on several
    topics, every topic read now needs its own, since one left out would restart at the
    starting offsets and read the table's rows again. None stands for a single topic."""
    resumed = {
        d.topic
        for d in tpc.store.decisions(app_id=tpc.app_id)
        if d.kind is DecisionKind.RESUME_AT and d.after_batch_id >= version
    }
    if not topics_coordinator.reads_several_topics(tpc.source):
        return [] if resumed else [None]
    read_now = tpc.source.topics()  # type: ignore[union-attr]
    return [topic for topic in read_now if topic not in resumed]
