"""The `<pipeline>_backfill` job: fill or replace offset ranges from the Launchpad, exactly
once, while the live pipeline keeps running.

The op finishes voted backfill batches first, then plans the request through
ledger/core/backfill.py (which decides whether the ranges may be filled or replaced) and runs the
batch through the pipeline's backfill coordinator. Without ranges it only recovers, which is
how the re-drive sensor finishes a backfill batch whose run died. Its commit materializes the
table asset without a partition (a backfill batch is no live batch; orchestration/metadata.py),
so the table's version and row-count history has no holes; batches it finishes by recovery
are materialized by the history sensor (orchestration/health/history_sensor.py).
A request the rules refuse ends the run with one sentence and no alert
(orchestration/health/rejection.py); the Launchpad's example ranges live in the config's
descriptions, not in defaults, since the re-drive sensor launches this job without config.
"""

from collections.abc import Iterator
from typing import Literal

import dagster as dg
from pydantic import Field

from ledger.coordinator.backfill import plan_backfill
from ledger.core.backfill import BackfillMode
from ledger.core.batch import Batch, BatchKind
from ledger.core.errors import ConfigError
from ledger.core.protocol import OffsetRange
from orchestration.health.failures import one_line_failures
from orchestration.health.rejection import rejections_end_the_run
from orchestration.metadata import batch_label, batch_metadata, log_commit
from orchestration.names import dagster_name
from orchestration.resources import pipeline_in, pipeline_key
from orchestration.tags import BATCH_TAG, PIPELINE_TAG
from resources.config.pipeline_config import PipelineConfig
from resources.config.transforms import absolute_spec


class OffsetRangeConfig(dg.Config):
    partition: int = Field(description="Kafka partition")
    start: int = Field(description="first offset of the range", ge=0)
    end: int = Field(description="the offset after the last one", ge=1)
    topic: str | None = Field(default=None, description="default: the pipeline's topic")


class BackfillRequest(dg.Config):
    """The launchpad of the backfill job."""

    mode: Literal["fill", "replace"] = Field(
        default="fill",
        description="fill: offsets nothing covers yet; replace: reprocess committed offsets",
    )
    ranges: list[OffsetRangeConfig] = Field(
        default_factory=list,
        description=(
            "the offsets to fill or replace; none: only finish voted backfill batches. "
            "Example: [{partition: 0, start: 0, end: 1000}, {partition: 1, start: 500, end: 900}]"
        ),
    )
    transform: str | None = Field(
        default=None, description="module:function instead of the pipeline's transform"
    )
    again: bool = Field(default=False, description="repeat an identical finished backfill")


def build_backfill_job(config: PipelineConfig, table: dg.AssetSpec) -> dg.JobDefinition:
    name = config.pipeline

    @dg.op(
        name=f"{dagster_name(name)}_backfill_ranges",
        out=dg.Out(Batch, is_required=False),
        required_resource_keys={pipeline_key(name)},
    )
    @one_line_failures(name)
    def backfill_ranges(
        context: dg.OpExecutionContext, config: BackfillRequest
    ) -> Iterator[dg.Output[Batch]]:
        """Finish voted backfill batches, then fill or replace the requested ranges."""
        pipeline = pipeline_in(context, name)
        transform = (
            absolute_spec(config.transform) if config.transform else pipeline.config.transform
        )
        tpc = pipeline.backfill(transform)
        ranges = [
            OffsetRange(r.topic or pipeline.config.kafka.topic or "", r.partition, r.start, r.end)
            for r in config.ranges
        ]
        request = {"mode": config.mode, "ranges": [str(r) for r in ranges]}
        with rejections_end_the_run(context, name, request):
            if any(not r.topic for r in ranges):
                raise ConfigError(
                    f"ranges: pipeline {name} reads several topics (kafka.topics or "
                    "kafka.pattern): give each range its topic"
                )
            for done in pipeline.recover(BatchKind.BACKFILL):
                context.log.info(f"recovered batch {done.app_id}/{done.batch_id}: {done.state}")
            if not ranges:
                context.log.info("no ranges requested: recovery only")
                return
            batch, planned = plan_backfill(
                tpc,
                live_app_id=pipeline.config.app_id,
                mode=BackfillMode(config.mode),
                ranges=ranges,
                transform=transform,
                again=config.again,
                replace_refusals=pipeline.config.replace_refusals(),
            )
        if not planned:
            context.log.info(f"already done as {batch.label} ({batch.state}); nothing to do")
            return
        context.instance.add_run_tags(context.run_id, {BATCH_TAG: batch_label(batch)})
        report = tpc.finish(batch)
        log_commit(context, table.key, pipeline, report.batch)
        yield dg.Output(report.batch, metadata=batch_metadata(report.batch))

    @dg.job(
        name=f"{dagster_name(name)}_backfill",
        description=(
            f"Fill or replace offset ranges of pipeline {name!r}, exactly once, while the live "
            "pipeline keeps running. Without ranges it only recovers: it finishes every voted "
            "batch of the pipeline, backfill or live. Launchpad example: ops: "
            f"{{{dagster_name(name)}_backfill_ranges: {{config: {{mode: fill, "
            "ranges: [{partition: 0, start: 0, end: 1000}]}}}"
        ),
        executor_def=dg.in_process_executor,
        tags={PIPELINE_TAG: f"{name}.backfill"},
    )
    def backfill() -> None:
        backfill_ranges()

    return backfill
