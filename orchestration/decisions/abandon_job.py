"""The `<pipeline>_abandon` job: release a batch a hung run or process holds, from the
Launchpad, as `exactly abandon` does on the command line.

Recovery leaves a batch to an owner that may be alive (invariant 16), so a hung run holds
its batch, and with it the pipeline, until someone decides; the stuck alert and the
`no_stuck_batch` check name this job as the action. It does two things, in this order:

1. It terminates the Dagster runs that hold the batch (queued or running, found by their
   batch tags as the re-drive sensor finds them). A run whose process does not answer (it
   died unseen, or hangs beyond Dagster's reach) is marked canceled after
   `TERMINATE_WAIT_S`: the fence below makes whatever it still does harmless, and a run
   shown as running for ever would keep holding the batch in every sensor's eyes.
2. It fences the batch's attempt through the same wiring as the CLI
   (`Pipeline.abandon`, ledger/coordinator/release.py): a batch that never voted is
   abandoned, its ranges read again by the next batch; one that voted is never abandoned
   (invariant 5): it is taken over and finished here.

A batch with nothing to release (unknown, ACKED, ABORTED) is refused in one sentence as
rejected input. Who decided is the run's `dagster/user` tag, else the run; why is the
config's `reason`, required; both are recorded on the batch in the ledger and shown as an
observation of the table asset.
"""

import contextlib
import time

import dagster as dg
from pydantic import Field

from ledger.core.batch import Batch
from orchestration.assets import table_key
from orchestration.decisions.decide_job import decided_by
from orchestration.health.failures import one_line_failures
from orchestration.health.liveness import ALIVE, batch_run_tags
from orchestration.health.rejection import rejections_end_the_run
from orchestration.names import dagster_name
from orchestration.resources import pipeline_in, pipeline_key
from orchestration.tags import BATCH_TAG, PIPELINE_TAG
from resources.config.pipeline_config import PipelineConfig

#: how long a terminated run's process has to stop before its run is marked canceled
TERMINATE_WAIT_S = 10.0


class AbandonRequest(dg.Config):
    """The Launchpad of the abandon job: `exactly abandon`'s options, by the same names."""

    batch_id: int = Field(description="the batch a hung run or process holds")
    reason: str = Field(description="why; recorded with the batch", min_length=1)
    backfill: bool = Field(default=False, description="a backfill batch (its id in the ledger)")


def terminate_holders(instance: dg.DagsterInstance, pipeline: str, batch: Batch) -> list[str]:
    """Terminate the queued or running Dagster runs of `batch`; their ids. A run that is
    still not finished after TERMINATE_WAIT_S (its process did not answer) is marked
    canceled, with a message that says why."""
    tag, key = batch_run_tags(pipeline, batch)
    runs = instance.get_runs(
        dg.RunsFilter(tags={PIPELINE_TAG: tag, BATCH_TAG: key}, statuses=ALIVE)
    )
    for run in runs:
        # a code server that is gone raises: the run is marked canceled below
        with contextlib.suppress(Exception):
            instance.run_coordinator.cancel_run(run.run_id)
    deadline = time.monotonic() + TERMINATE_WAIT_S
    for run in runs:
        now = instance.get_run_by_id(run.run_id)
        while now is not None and not now.is_finished and time.monotonic() < deadline:
            time.sleep(0.5)
            now = instance.get_run_by_id(run.run_id)
        if now is not None and not now.is_finished:
            instance.report_run_canceled(
                now,
                message=(
                    f"its process did not stop within {TERMINATE_WAIT_S:.0f} s of being "
                    f"terminated; marked canceled while batch {batch.label} is released, "
                    "which fences its attempt, so nothing it still does is published"
                ),
            )
    return [r.run_id for r in runs]


def build_abandon_job(config: PipelineConfig) -> dg.JobDefinition:
    name = config.pipeline

    @dg.op(name=f"{dagster_name(name)}_abandon_op", required_resource_keys={pipeline_key(name)})
    @one_line_failures(name)
    def abandon(context: dg.OpExecutionContext, config: AbandonRequest) -> None:
        """Terminate the runs that hold the batch, then fence its attempt."""
        from ledger.coordinator.release import released_text

        pipeline = pipeline_in(context, name)
        who = decided_by(context)
        coordinator = pipeline.backfill() if config.backfill else pipeline.live
        shown = {"batch_id": config.batch_id, "reason": config.reason, "decided_by": who}
        with rejections_end_the_run(context, name, shown):
            held = coordinator.store.get(coordinator.app_id, config.batch_id)
            ended = terminate_holders(context.instance, name, held) if held else []
            for run_id in ended:
                context.log.info(f"terminated run {run_id}, which held the batch")
            batch = pipeline.abandon(
                config.batch_id, backfill=config.backfill, who=who, reason=config.reason
            )
        said = released_text(batch)
        context.log.info(said)
        context.instance.report_runless_asset_event(
            dg.AssetObservation(
                asset_key=table_key(name),
                description=said,
                metadata={
                    "batch": f"{batch.app_id}/{batch.batch_id}",
                    "state": str(batch.state),
                    "decided_by": who,
                    "reason": config.reason,
                    "terminated_runs": ", ".join(ended) or "none",
                    "run": dg.MetadataValue.dagster_run(context.run_id),
                },
            )
        )

    @dg.job(
        name=f"{dagster_name(name)}_abandon",
        description=(
            f"Release a batch of pipeline {name!r} that a hung run or process holds, as "
            "`exactly abandon` does: terminate its runs and fence its attempt; a batch that "
            "never voted is abandoned (the next batch reads its ranges again), one that "
            "voted is finished now. Launchpad example: ops: "
            f"{{{dagster_name(name)}_abandon_op: {{config: {{batch_id: 7, "
            "reason: the run hangs in its stage}}}"
        ),
        executor_def=dg.in_process_executor,
        tags={PIPELINE_TAG: f"{name}.abandon"},
    )
    def abandon_job() -> None:
        abandon()

    return abandon_job
