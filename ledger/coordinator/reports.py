"""What the coordinator says about a batch: the report of one run (`BatchReport`), the
metrics a stage records, the incidents it alerts operators with, and the error that says
which outputs hold a voted batch it cannot finish.

Pure builders of values: the coordinator (ledger/coordinator/two_phase.py and its
collaborators) decides when to record, alert or raise them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ledger.core.batch import Batch
from ledger.core.errors import ExactlyError, InconsistencyError
from ledger.core.ports import Incident, StageOutput
from ledger.core.vote_check import VoteCheck, describe


@dataclass(frozen=True)
class BatchReport:
    """One batch run through every phase: the batch as it ended, what its stage wrote,
    and the seconds each phase took (`TwoPhaseCommit.finish`)."""

    batch: Batch
    output: StageOutput
    seconds: dict[str, float]

    def line(self) -> str:
        phases = " ".join(f"{k}={v:.2f}s" for k, v in self.seconds.items())
        return (
            f"batch {self.batch.batch_id} {self.batch.state}: {ranges_text(self.batch)} "
            f"records={self.output.records_read} table={self.output.table_records} "
            f"quarantine={self.output.quarantine_records} files={len(self.output.files)} "
            f"{phases}"
        )


def ranges_text(batch: Batch) -> str:
    """The batch's non-empty ranges, as log lines and alerts name them."""
    return " ".join(str(r) for r in batch.ranges if r.span) or "(empty)"


def stage_metrics(output: StageOutput) -> dict[str, Any]:
    """What a stage records in the batch's metrics (shown by `exactly ledger` and Dagster)."""
    return {
        "records_read": output.records_read,
        "table_records": output.table_records,
        "quarantine_records": output.quarantine_records,
        "files": len(output.files),
        "stage_detail_s": output.seconds,
        **(
            {} if output.newest_record_ms is None else {"newest_record_ms": output.newest_record_ms}
        ),
    }


def publish_refused(pipeline: str, batch: Batch, exc: InconsistencyError) -> Incident:
    """An output refused the batch at publish (a PostgreSQL output's compare-and-set found
    it out of order, a schema no output can take): a protocol violation or an operator's
    fix to make; the batch waits PREPARED, never skipped (invariant 5), and the pipeline
    stops on the error."""
    return Incident(
        kind="publish_refused",
        title=f"{pipeline}: batch {batch.batch_id} refused at publish",
        text=f"batch {batch.label} ({ranges_text(batch)}) was not published: {exc}",
        details={
            "app_id": batch.app_id,
            "batch_id": batch.batch_id,
            "attempt": batch.attempt,
            "error": str(exc),
        },
    )


def staged_files_missing(
    pipeline: str, batch: Batch, check: VoteCheck, *, restaging: bool, max_restages: int
) -> Incident:
    """A vote lost files: a storage problem someone must fix. `restaging` says whether the
    batch is staged again now or has lost files `max_restages` times and waits."""
    what = (
        "nothing of that vote is published; the batch is re-staged over the same ranges "
        "as a new attempt"
        if restaging
        else f"it was re-staged {max_restages} times and lost files every time; "
        "the commit stops here and the batch waits (its range is held)"
    )
    missing = describe(check.missing)
    return Incident(
        kind="staged_files_missing",
        title=f"{pipeline}: batch {batch.batch_id} lost staged files",
        text=(
            f"batch {batch.label} ({ranges_text(batch)}) voted files that are gone or "
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


def unfinished(exc: ExactlyError, batch: Batch, holding: set[str] | None) -> ExactlyError:
    """`exc` again, of its own kind, saying that `batch` stays unfinished and which outputs
    hold it (ledger/coordinator/recovery.py `finishing`; None: they could not be read)."""
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
