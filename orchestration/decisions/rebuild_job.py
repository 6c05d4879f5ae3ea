"""The `<pipeline>_rebuild` job: build a derived output's table from the raw table, from the
Launchpad, as `exactly derived rebuild` does on the command line.

A derived output added to a pipeline with history, or whose table was deleted, would stay
short of its recomputation for ever, so the publisher refuses to merge into it and the
pipeline's batches wait, with a sentence that names this job (docs/derived-tables.md). The
job builds it through the same wiring as the CLI (`Pipeline.rebuild_derived`,
jobs/derived/rebuild.py), so the same rules refuse it in the same words, as rejected input:
an unknown output, one that holds batches already, no raw table yet, an upsert over two
incarnations of a topic. Who asked and why are kept in the rebuild's Delta commit, and the
rebuilt table is a materialization of the output's asset that says them.
"""

import dagster as dg
from pydantic import Field

from orchestration.assets import derived_key
from orchestration.decisions.decide_job import decided_by
from orchestration.health.failures import one_line_failures
from orchestration.health.rejection import rejections_end_the_run
from orchestration.names import dagster_name
from orchestration.resources import pipeline_in, pipeline_key
from orchestration.tags import PIPELINE_TAG
from resources.config.pipeline_config import PipelineConfig


class RebuildRequest(dg.Config):
    """The Launchpad of the rebuild job: `exactly derived rebuild`'s options."""

    output: str = Field(description="the derived output's name (the config's `derived:`)")
    reason: str = Field(description="why; shown with the rebuilt table", min_length=1)
    empty: bool = Field(
        default=False,
        description="start it empty at the raw table's batches: it holds only what is "
        "published from now on (an upsert after its topic was re-created)",
    )


def build_rebuild_job(config: PipelineConfig) -> dg.JobDefinition:
    name = config.pipeline
    outputs = ", ".join(o.name for o in config.derived) or "none"

    @dg.op(name=f"{dagster_name(name)}_rebuild_op", required_resource_keys={pipeline_key(name)})
    @one_line_failures(name)
    def rebuild(context: dg.OpExecutionContext, config: RebuildRequest) -> None:
        """Build the output's table, or refuse in one sentence."""
        from jobs.derived.rebuild import rebuilt_text

        pipeline = pipeline_in(context, name)
        who = decided_by(context)
        shown = {"output": config.output, "reason": config.reason, "decided_by": who}
        with rejections_end_the_run(context, name, shown):
            done = pipeline.rebuild_derived(
                config.output, empty=config.empty, who=who, reason=config.reason
            )
        said = rebuilt_text(done)
        context.log.info(said)
        context.log_event(
            dg.AssetMaterialization(
                asset_key=derived_key(name, done.name),
                description=said,
                metadata={
                    "rebuilt_by": who,
                    "reason": config.reason,
                    # a PostgreSQL output has no table version
                    **({} if done.version is None else {"table_version": done.version}),
                    "raw_table_version": done.raw_version,
                    "rows": done.rows,
                    "holds": ", ".join(f"{a}/{v}" for a, v in done.holds.items()) or "none",
                    "empty": config.empty,
                },
            )
        )

    @dg.job(
        name=f"{dagster_name(name)}_rebuild",
        description=(
            f"Build a derived output of pipeline {name!r} from the raw table, as `exactly "
            f"derived rebuild` does (its outputs: {outputs}). Launchpad example: ops: "
            f"{{{dagster_name(name)}_rebuild_op: {{config: {{output: "
            f"{config.derived[0].name if config.derived else 'NAME'}, "
            "reason: the output was added}}}"
        ),
        executor_def=dg.in_process_executor,
        tags={PIPELINE_TAG: f"{name}.rebuild"},
    )
    def rebuild_job() -> None:
        rebuild()

    return rebuild_job
