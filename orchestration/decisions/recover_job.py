"""The `<pipeline>_recover` job: what `exactly recover` does, from the Launchpad.

Every batch run recovers first, and the re-drive sensor does so on its ticks; this job is
for the operator who wants it now, or runs without that sensor: it finishes every voted
batch, live and backfill, and abandons every dead one that did not vote (invariant 5). A
batch whose owner may still be alive is left to it (BusyError), which is refused in one
sentence like any rejected request. What it did is journaled in the ledger with who asked and
why (ledger/core/actions.py) and shown on the table asset.
"""

import dagster as dg
from pydantic import Field

from orchestration.assets import table_key
from orchestration.decisions.decide_job import decided_by
from orchestration.health.failures import one_line_failures
from orchestration.health.fates import action_observation
from orchestration.health.rejection import rejections_end_the_run
from orchestration.names import dagster_name
from orchestration.resources import pipeline_in, pipeline_key
from orchestration.tags import PIPELINE_TAG
from resources.config.pipeline_config import PipelineConfig


class RecoverRequest(dg.Config):
    """The Launchpad of the recover job: why it is asked for (who is the run's user)."""

    reason: str = Field(
        default="", description="why the recovery is asked for; journaled in the ledger"
    )


def build_recover_job(config: PipelineConfig) -> dg.JobDefinition:
    name = config.pipeline

    @dg.op(name=f"{dagster_name(name)}_recover_op", required_resource_keys={pipeline_key(name)})
    @one_line_failures(name)
    def recover(context: dg.OpExecutionContext, config: RecoverRequest) -> None:
        """Finish voted batches and abandon dead ones; log each, journal the action."""
        pipeline = pipeline_in(context, name)
        who = decided_by(context)
        with rejections_end_the_run(context, name, {"reason": config.reason, "decided_by": who}):
            done, journaled = pipeline.recover_asked(who=who, reason=config.reason)
        for batch in done:
            context.log.info(f"recovered batch {batch.app_id}/{batch.batch_id}: {batch.state}")
        context.log.info(f"{name}: recovered {len(done)} batch(es)")
        context.log_event(action_observation(table_key(name), journaled, context.run_id))

    @dg.job(
        name=f"{dagster_name(name)}_recover",
        description=(
            f"Finish every voted batch of pipeline {name!r} and abandon every dead one that "
            "did not vote, as `exactly recover` does; journaled in the ledger with who and "
            "why. Launchpad example: ops: "
            f"{{{dagster_name(name)}_recover_op: {{config: {{reason: after the outage}}}}}}"
        ),
        executor_def=dg.in_process_executor,
        tags={PIPELINE_TAG: name},
    )
    def recover_job() -> None:
        recover()

    return recover_job
