"""Which output each of a batch's voted files goes to, checked against the outputs the
config has now.

A batch is voted under one config and may be published under another (a re-drive after
an edit, a recovery on another machine), so the vote and the config must agree before
any output is touched: a file voted for an output the config no longer has would be
dropped, and an output configured after the vote has no partial for the batch at all.
Either is refused with the one way out (restore the output, or remove it until the batch
is published); neither can be repaired by publishing part of the batch.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from ledger.core.batch import Batch, StagedFile
from ledger.core.errors import InconsistencyError


def files_by_target(
    batch: Batch, targets: Collection[str], order: Sequence[str], files: Sequence[StagedFile]
) -> dict[str, list[StagedFile]]:
    """The batch's voted `files` by output, one list for every output of `targets` (empty
    for one the batch wrote nothing to); refused (InconsistencyError) when a file names an
    output outside `targets`, or a derived output of `order` has no voted schema."""
    by_target: dict[str, list[StagedFile]] = {t: [] for t in targets}
    for f in files:
        if f.target not in by_target:
            raise InconsistencyError(
                f"batch {batch.label} voted files for output {f.target}, which the "
                "config no longer has: restore the output to publish the batch"
            )
        by_target[f.target].append(f)
    lacking = [t for t in order if t not in batch.schemas]
    if lacking:
        raise InconsistencyError(
            f"batch {batch.label} voted before output(s) {', '.join(lacking)} were "
            "configured, so it has no partial for them: remove them until it is published"
        )
    return by_target
