"""What a run that names a batch does with it: report the commit its recovery finished,
reprocess it, refuse, or plan a new batch.

A run may name the batch it is for (under Dagster, a run on a batch's partition). Such a run
must neither repaint the history with a success that did nothing nor plan a second batch
under the same id, so whether it re-drives, reprocesses or refuses is exactly-once
reasoning, and it lives here, pure, beside the rules it keeps: a batch that voted is
finished, never staged again (invariant 5); a committed batch's offsets are read again only
when the operator confirms it (a replace backfill); an abandoned batch is never published,
its offsets are the next batch's. The caller reads the ledger before and after its
recovery and acts on the returned `RunPlan` (orchestration/batches/micro_batch_job.py).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from ledger.core.batch import Batch
from ledger.core.protocol import PUBLISHED, BatchState


class RunAction(enum.Enum):
    """What the run does."""

    #: plan a batch: the one the run names if the ledger does not hold it, or the next one
    PLAN = "plan"
    #: the named batch had voted and this run's recovery finished it: report that commit
    REDRIVEN = "redriven"
    #: the named batch is committed and the run confirms a reprocess: replace its offsets
    REPROCESS = "reprocess"
    #: the named batch is not the run's to change: fail with what to do instead
    REFUSE = "refuse"


class Refused(enum.StrEnum):
    """Why a run on a batch was refused. The values are the runs' rejected-input tags:
    never renamed."""

    #: committed, and the run did not confirm a reprocess
    ALREADY_COMMITTED = "AlreadyCommitted"
    #: abandoned (ABORTED): never published; the next batch reads its offsets again
    ABANDONED = "AbandonedBatch"
    #: still in flight, moved on by another attempt
    UNFINISHED = "UnfinishedBatch"


@dataclass(frozen=True)
class RunPlan:
    """The action, and the batch it is about (None when planning)."""

    action: RunAction
    batch: Batch | None = None
    refused: Refused | None = None


def decide_plan(
    before: Batch | None,
    after: Batch | None,
    finished: Iterable[Batch],
    *,
    reprocess: bool,
) -> RunPlan:
    """The run's action on the batch it names.

    `before` is the named batch as the ledger held it before the run's recovery (None when
    the run names no batch, or the ledger does not hold it), `after` the same batch read
    again after recovery, `finished` the batches that recovery finished or abandoned, and
    `reprocess` whether the run confirms reprocessing a committed batch.
    """
    if before is None or after is None:
        return RunPlan(RunAction.PLAN)
    recovered = {done.batch_id: done for done in finished if done.app_id == before.app_id}
    redriven = recovered.get(before.batch_id)
    if redriven is not None and redriven.state in PUBLISHED:
        return RunPlan(RunAction.REDRIVEN, redriven)
    if after.state not in PUBLISHED:
        aborted = after.state is BatchState.ABORTED
        return RunPlan(
            RunAction.REFUSE, after, Refused.ABANDONED if aborted else Refused.UNFINISHED
        )
    if not reprocess:
        return RunPlan(RunAction.REFUSE, after, Refused.ALREADY_COMMITTED)
    return RunPlan(RunAction.REPROCESS, after)
