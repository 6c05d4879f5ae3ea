"""What Dagster adds to the coordinator's liveness decisions: whether a run of a batch is
still alive, and the abandonment of batches whose run died before the vote.

Whether a batch's attempt can still be running is the coordinator's decision
(`TwoPhaseCommit.may_be_alive`: the owner's process, or its lease by the database's clock).
Dagster knows one more thing: a run of the batch that is still queued or running (a retry
or a re-execution of the run that planned it) may continue it, so such a batch is left
alone. The schedule calls `abandon_dead_batches` before deciding whether a batch is due, and
the re-drive sensor on every evaluation, so a run that died before the vote never stops the
pipeline (invariant 16). A run that Dagster still shows as running although its process is
gone (a run worker killed by the out-of-memory killer, with a run launcher that cannot
check its workers' health) holds its batch until it is marked failed or terminated; the
stuck alert says so after `alerts.stuck_after_seconds`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import dagster as dg

from jobs.wiring.pipeline import Pipeline
from ledger.coordinator.two_phase import TwoPhaseCommit
from ledger.core.batch import Batch, BatchKind
from ledger.core.protocol import BatchState
from orchestration.tags import BATCH_TAG, PIPELINE_TAG

#: Run states in which a run may still execute (or cancel) its ops.
ALIVE = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


def run_alive(instance: dg.DagsterInstance, pipeline_tag: str, batch_tag: str) -> bool:
    """Whether a run tagged with this pipeline and batch is queued or running."""
    runs = instance.get_runs(
        dg.RunsFilter(tags={PIPELINE_TAG: pipeline_tag, BATCH_TAG: batch_tag}, statuses=ALIVE),
        limit=1,
    )
    return bool(runs)


def batch_run_tags(pipeline: str, batch: Batch) -> tuple[str, str]:
    """The (pipeline, batch) tag values of the runs that work on `batch`: micro-batch and
    re-drive runs for live batches, backfill runs for backfill batches."""
    if batch.kind == BatchKind.BACKFILL:
        return f"{pipeline}.backfill", f"{batch.app_id}/{batch.batch_id}"
    return pipeline, str(batch.batch_id)


def abandon_dead_batches(
    pipeline: Pipeline,
    instance: dg.DagsterInstance,
    coordinators: Iterable[TwoPhaseCommit],
    log: Callable[[str], None],
) -> list[Batch]:
    """Abandon every PLANNED or STAGED batch of `coordinators` whose owner is gone and whose
    runs are all finished (invariants 5 and 16); returns them, now ABORTED."""
    name = pipeline.config.pipeline

    def still_running(batch: Batch) -> bool:
        return run_alive(instance, *batch_run_tags(name, batch))

    abandoned = []
    for coordinator in coordinators:
        for batch in coordinator.abandon_dead(still_running):
            log(
                f"abandoned batch {batch.label}: its run died before the vote ({batch.error}); "
                "its ranges are planned again by the next batch"
            )
            abandoned.append(batch)
    return abandoned


def warn_if_not_acked(log: Callable[[str], None], batch: Batch) -> None:
    """Say in the run's log that the advisory ack was refused: the run succeeds (the batch is
    complete), the warning and the ack alert are how a person hears of it."""
    if batch.state is BatchState.COMMITTED and "ack_error" in batch.metrics:
        log(
            f"batch {batch.label} is committed and complete, but the consumer group was not "
            f"moved ({batch.metrics.get('ack_failures_in_a_row', 1)} refused in a row): "
            f"{batch.metrics['ack_error']}. The next ack that succeeds catches the group up."
        )
