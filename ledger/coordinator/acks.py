"""The ack: moving the consumer group to the newest published batch's ends, and marking
the batches it covers ACKED (the protocol's last step, docs/protocol.md).

Advisory: the tables and the ledger, never the group, decide what comes next, so a refused
ack is recorded on the batch and retried, never an error (`ack`); the refused acks are
listed for the sensors that warn about them (`refused_acks`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ledger.core.batch import Batch, BatchKind
from ledger.core.errors import FencedError
from ledger.core.protocol import PUBLISHED, BatchState

if TYPE_CHECKING:
    from ledger.coordinator.two_phase import TwoPhaseCommit


def ack(tpc: TwoPhaseCommit, batch: Batch) -> Batch:
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
    if tpc.kind != BatchKind.LIVE:
        return tpc.store.transition(batch, BatchState.ACKED)
    try:
        through = _ack_newest(tpc, batch)
    except Exception as exc:  # advisory: whatever refused it, the batch is complete
        return _ack_refused(tpc, batch, exc)
    acked = _mark_acked(tpc, batch, through)
    _catch_up_acks(tpc, through)
    return acked


def _ack_newest(tpc: TwoPhaseCommit, batch: Batch, rounds: int = 5) -> int:
    """Move the group to the newest published batch's ends; returns that batch's id.

    After each commit to the group the ledger is read again: if a newer batch was
    published meanwhile, its committer's ack may have reached Kafka before ours, and ours
    would have moved the group back, so the newer ends are committed again. Once a read
    finds nothing newer, any later batch is acked by its committer after ours completed.
    """
    newest = _newest_published(tpc, batch)
    for _ in range(rounds):
        tpc.source.ack(newest.ranges)
        again = _newest_published(tpc, newest)
        if again.batch_id == newest.batch_id:
            break
        newest = again
    return newest.batch_id


def _mark_acked(tpc: TwoPhaseCommit, batch: Batch, through: int) -> Batch:
    """Move `batch` to ACKED; if a later batch's ack caught it up first, that is the same
    outcome, not a fencing to report."""
    try:
        return tpc.store.transition(batch, BatchState.ACKED, metrics={"acked_to_batch": through})
    except FencedError:
        current = tpc.store.get(batch.app_id, batch.batch_id)
        if current is None or current.state is not BatchState.ACKED:
            raise
        return current


def _newest_published(tpc: TwoPhaseCommit, batch: Batch) -> Batch:
    """The newest batch of this application id the tables hold (`batch` itself unless a
    later one was committed meanwhile): where the group belongs."""
    newest = tpc.store.batches(app_id=tpc.app_id, states=PUBLISHED, limit=1)
    return newest[0] if newest and newest[0].batch_id > batch.batch_id else batch


def _catch_up_acks(tpc: TwoPhaseCommit, through: int) -> None:
    """Mark the COMMITTED batches up to `through` ACKED: the group now points past them."""
    for older in tpc.store.batches(app_id=tpc.app_id, states=[BatchState.COMMITTED]):
        if older.batch_id > through:
            continue
        try:
            tpc.store.transition(older, BatchState.ACKED, metrics={"acked_to_batch": through})
        except FencedError:
            continue  # another attempt acked it meanwhile


def _ack_refused(tpc: TwoPhaseCommit, batch: Batch, exc: Exception) -> Batch:
    """Record a refused ack on the batch (it stays COMMITTED) and warn."""
    in_a_row = tpc.ack_failures_in_a_row() + 1
    refused = tpc.store.record_metrics(
        batch,
        {
            "ack_error": str(exc),
            "ack_failures": int(batch.metrics.get("ack_failures", 0)) + 1,
            "ack_failures_in_a_row": in_a_row,
        },
    )
    tpc.log(
        f"warning: batch {batch.label} is committed, but the consumer group was not moved "
        f"({in_a_row} refused in a row): {exc}. The batch is complete and the next batch "
        "runs; the next ack that succeeds catches the group up."
    )
    return refused


def refused_acks(tpc: TwoPhaseCommit) -> list[Batch]:
    """COMMITTED batches whose ack was refused since the last one that succeeded (a
    success acks every batch up to the newest), oldest first."""
    committed = tpc.store.batches(app_id=tpc.app_id, states=[BatchState.COMMITTED])
    return sorted((b for b in committed if "ack_error" in b.metrics), key=lambda b: b.batch_id)


def ack_failures_in_a_row(tpc: TwoPhaseCommit) -> int:
    """Acks refused since the last one that succeeded, across batches and attempts."""
    return sum(int(b.metrics.get("ack_failures", 0)) for b in tpc.refused_acks())
