"""The `<pipeline>_decide` job: an operator's decision from the Launchpad, as `exactly skip`
takes it on the command line.

The pipeline stops, and says so, rather than skip records on its own: a re-created topic,
offsets retention deleted before they were read, a lost ledger whose log lost its commit
history, a deleted topic among several. Each needs a person to decide, and this job records
that decision through the same wiring (`Pipeline.decide`, ledger/core/decisions.py), so
the same rules refuse it in the same words: a refusal ends the run as rejected input, one
sentence and no alert (orchestration/health/rejection.py). Who decided is the run's
`dagster/user` tag where Dagster sets one, else the run itself; why is the config's
`reason`, required. The recorded decision is an observation of the table asset, so the
asset's page shows who skipped what and why, and the next batch's commit carries it.
"""

from typing import Literal

import dagster as dg
from pydantic import Field

from ledger.core.decisions import DecisionKind, Request
from ledger.core.errors import ConfigError
from orchestration.assets import table_key
from orchestration.health.failures import one_line_failures
from orchestration.health.fates import decision_observation
from orchestration.health.rejection import rejections_end_the_run
from orchestration.names import dagster_name
from orchestration.resources import pipeline_in, pipeline_key
from orchestration.tags import PIPELINE_TAG
from resources.config.pipeline_config import PipelineConfig

#: the tag Dagster+ sets to the user who launched a run (Dagster OSS sets none)
USER_TAG = "dagster/user"


class DecisionRequest(dg.Config):
    """The Launchpad of the decide job: `exactly skip`'s options, by the same names."""

    kind: Literal["lost-offsets", "new-topic", "resume-at", "retire-topic"] = Field(
        description=(
            "lost-offsets: continue past offsets retention deleted; new-topic: accept a "
            "re-created topic's id; resume-at: state the positions a lost ledger lost; "
            "retire-topic: stop reading a deleted topic among several"
        )
    )
    reason: str = Field(description="why; recorded with the decision", min_length=1)
    topic: str | None = Field(
        default=None, description="the topic (required when the pipeline reads several)"
    )
    partition: int | None = Field(default=None, description="lost-offsets: only this partition")
    to: int | None = Field(default=None, description="lost-offsets: continue at this offset")
    topic_id: str | None = Field(default=None, description="new-topic: the id to accept")
    positions: dict[str, int] = Field(
        default_factory=dict,
        description="resume-at: partition -> offset to continue at. Example: {'0': 1200}",
    )
    force: bool = Field(
        default=False,
        description="skip records Kafka still holds, or read committed ones again, on purpose",
    )


def decided_by(context: dg.OpExecutionContext) -> str:
    """Who takes a decision launched from Dagster: the user Dagster+ names on the run, else
    the run itself (Dagster OSS names no user)."""
    return context.run.tags.get(USER_TAG) or f"Dagster run {context.run_id}"


def request_of(config: DecisionRequest, decided_by: str) -> Request:
    """The ledger's request from the Launchpad's config."""
    positions: dict[int, int] = {}
    for partition, offset in config.positions.items():
        if not partition.strip().isdigit():
            raise ConfigError(f"positions: {partition!r} is not a partition number")
        positions[int(partition)] = offset
    return Request(
        kind=DecisionKind(config.kind),
        reason=config.reason,
        decided_by=decided_by,
        partition=config.partition,
        to=config.to,
        topic_id=config.topic_id,
        positions=positions,
        force=config.force,
        topic=config.topic,
    )


def build_decide_job(config: PipelineConfig) -> dg.JobDefinition:
    name = config.pipeline

    @dg.op(name=f"{dagster_name(name)}_decide_op", required_resource_keys={pipeline_key(name)})
    @one_line_failures(name)
    def decide(context: dg.OpExecutionContext, config: DecisionRequest) -> None:
        """Record the decision, or refuse it in one sentence."""
        pipeline = pipeline_in(context, name)
        who = decided_by(context)
        shown = {"kind": config.kind, "reason": config.reason, "decided_by": who}
        with rejections_end_the_run(context, name, shown):
            decision = pipeline.decide(request_of(config, who))
        context.log.info(f"recorded decision {decision.id[:8]}: {decision.describe()}")
        context.instance.report_runless_asset_event(
            decision_observation(table_key(name), decision, context.run_id)
        )

    @dg.job(
        name=f"{dagster_name(name)}_decide",
        description=(
            f"Record an operator's decision for pipeline {name!r}, as `exactly skip` does: "
            "the same rules refuse it in the same words, and the next batch's commit carries "
            "it. Launchpad example: ops: "
            f"{{{dagster_name(name)}_decide_op: {{config: {{kind: new-topic, "
            "topic_id: AAAAAAAAAAAAAAAAAAAAAA, reason: the topic was re-created}}}"
        ),
        executor_def=dg.in_process_executor,
        tags={PIPELINE_TAG: f"{name}.decide"},
    )
    def decide_job() -> None:
        decide()

    return decide_job
