"""An operator's release of a batch its owner holds and does not move: a hung process.

Recovery leaves a batch to an owner that may be alive (invariant 16), by design: taking
over a healthy run would fail it. A hung owner is alive and going nowhere, so it holds its
batch, and with it the pipeline, until a person decides. `release` is that decision, the
same rules whoever takes it (`exactly abandon` and the `<pipeline>_abandon` job):

- a batch that never voted is abandoned: ABORTED under a fenced write, with who and why as
  its error, so the hung attempt's next write (its vote) is refused (invariant 6) and the
  next batch plans the same ranges again;
- a batch that voted is never abandoned (invariant 5): it is taken over and finished now,
  and the hung attempt is fenced the same way (recovery.take_over says why that is safe);
- a batch that is final (ACKED or ABORTED), or that does not exist, is refused in one
  sentence: there is nothing to release.

The owner may move the batch between the read and the write (it was slow, not hung): the
write is then refused (FencedError), and the batch is read and decided again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ledger.coordinator import recovery
from ledger.core.batch import Batch
from ledger.core.errors import DecisionError, FencedError
from ledger.core.protocol import ABANDONABLE, BatchState

if TYPE_CHECKING:
    from ledger.coordinator.two_phase import TwoPhaseCommit

#: how often a batch that moved under the release is read and decided again
ATTEMPTS = 3


def release_refusal(batch: Batch | None, label: str) -> str | None:
    """Pure: why `batch` (None: not in the ledger) cannot be released, or None."""
    if batch is None:
        return f"there is no batch {label} in the ledger: nothing to abandon"
    if batch.state is BatchState.ACKED:
        return f"batch {label} is ACKED: published and acknowledged, nothing holds it"
    if batch.state is BatchState.ABORTED:
        return f"batch {label} is already ABORTED ({batch.error})"
    return None


def abandons(batch: Batch) -> bool:
    """Pure: whether releasing `batch` abandons it (never voted) or finishes it (voted)."""
    return batch.state in ABANDONABLE and not batch.voted_once


def release(tpc: TwoPhaseCommit, batch_id: int, who: str, reason: str) -> Batch:
    """Abandon batch `batch_id` of this application id if it never voted, else finish it
    now under a new attempt; either way its current attempt is fenced. Returns the batch
    as it ends (ABORTED, or COMMITTED/ACKED). DecisionError if there is nothing to release.
    """
    label = f"{tpc.app_id}/{batch_id}"
    for _ in range(ATTEMPTS):
        batch = tpc.store.get(tpc.app_id, batch_id)
        refusal = release_refusal(batch, label)
        if refusal is not None or batch is None:
            raise DecisionError(refusal)
        try:
            if abandons(batch):
                tpc.log(f"abandoning batch {batch.label} ({batch.state}) for {who}: {reason}")
                return tpc.abort(batch, f"abandoned by {who}: {reason}")
            tpc.log(f"taking batch {batch.label} ({batch.state}) over for {who}: {reason}")
            done = recovery.take_over(tpc, batch)
        except FencedError:
            continue  # its owner moved it meanwhile: decide again on what it is now
        try:
            return tpc.store.record_metrics(done, {"taken_over_by": f"{who}: {reason}"})
        except FencedError:
            return done  # finished; a recovery acked it first, which is as good
    raise DecisionError(
        f"batch {label} kept moving while it was being released: its owner is not hung; look again"
    )


def released_text(batch: Batch) -> str:
    """Pure: what a release did to `batch`, in one sentence for the operator."""
    ranges = " ".join(str(r) for r in batch.ranges if r.span) or "(empty)"
    label = f"{batch.app_id}/{batch.batch_id}"
    if batch.state is BatchState.ABORTED:
        return (
            f"abandoned batch {label}: its attempt is fenced, so a write of the hung owner is "
            f"refused, and the next batch reads its ranges {ranges} again"
        )
    return (
        f"batch {label} had voted, so it is never abandoned: taken over and finished, now "
        f"{batch.state}; the hung owner's attempt is fenced"
    )
