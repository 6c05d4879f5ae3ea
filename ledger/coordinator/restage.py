"""A vote checked on storage before it is published, and staged again when it lost files
(invariant 11): the vote's files must all be there as voted, or nothing of that vote is
published and the batch is staged over the same ranges as a new attempt. A batch staged
again while some outputs already hold it must split its records as they hold them
(invariants 1 and 12).

`TwoPhaseCommit.commit` runs these before it publishes (ledger/coordinator/two_phase.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ledger.coordinator.reports import ranges_text, staged_files_missing
from ledger.core.batch import RESTAGE, Batch, StagedFile
from ledger.core.errors import InconsistencyError
from ledger.core.vote_check import VoteCheck, check_vote, describe

if TYPE_CHECKING:
    from ledger.coordinator.two_phase import TwoPhaseCommit


def checked_vote(tpc: TwoPhaseCommit, batch: Batch) -> tuple[Batch, list[StagedFile], VoteCheck]:
    """The PREPARED batch whose voted files are all on storage as voted, with those files
    and their check; `batch` itself unless a vote lost files and was staged again, at most
    `tpc.max_restages` times, after which InconsistencyError (and an alert) says that
    something deletes staged files."""
    restages = 0
    while True:
        tpc.store.require_current(batch)
        files = tpc.store.files(batch.app_id, batch.batch_id)
        check = vote_on_storage(tpc, batch, files)
        if not check.missing:
            return batch, files, check
        if restages >= tpc.max_restages:
            _alert_missing(tpc, batch, check, restaging=False)
            raise InconsistencyError(
                f"batch {batch.label}: voted files vanished again after {restages} "
                f"re-stages in a row ({', '.join(describe(check.missing, 3))}): something "
                "deletes staged files before they are committed (a storage lifecycle rule "
                "or a VACUUM of the staging folders?); stop it, then run recover"
            )
        batch = _restage(tpc, batch, check)
        restages += 1


def vote_on_storage(tpc: TwoPhaseCommit, batch: Batch, files: Sequence[StagedFile]) -> VoteCheck:
    """Which voted files are missing or changed on storage, skipping outputs that
    already hold the batch (invariant 11)."""
    return check_vote(files, tpc.publisher.outputs_holding(batch), tpc.publisher.file_size)


def check_same_split(
    tpc: TwoPhaseCommit, batch: Batch, files: Sequence[StagedFile], check: VoteCheck
) -> None:
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
        held = tpc.publisher.rows_held(batch, target)
        if held is not None and staged != held:
            raise InconsistencyError(
                f"batch {batch.label}: the {target} holds {held} rows of its ranges from "
                f"an earlier attempt, but the batch was staged again and staged {staged} "
                f"{target} rows: the transform splits these records differently now "
                "(changed since the first attempt?); publishing would duplicate or lose "
                "records. Run recover with the transform the batch was first staged with"
            )


def _restage(tpc: TwoPhaseCommit, batch: Batch, check: VoteCheck) -> Batch:
    """Send a vote that lost files back to PLANNED (a new attempt, its file rows gone,
    why recorded), then stage and vote again over the same ranges: the PREPARED batch
    of the new attempt. The old vote's files are orphans, never published."""
    _alert_missing(tpc, batch, check, restaging=True)
    missing = describe(check.missing)
    count = batch.metrics.get(RESTAGE, {}).get("count", 0) + 1
    planned = tpc.store.restage(
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
    tpc.log(f"re-staging batch {planned.label} over {ranges_text(planned)}")
    staged, output = tpc.invoke(planned)
    return tpc.pre_commit(staged, output)


def _alert_missing(tpc: TwoPhaseCommit, batch: Batch, check: VoteCheck, *, restaging: bool) -> None:
    """Tell operators a vote lost files: it is a storage problem someone must fix."""
    tpc.alert(
        staged_files_missing(
            tpc.pipeline, batch, check, restaging=restaging, max_restages=tpc.max_restages
        )
    )
