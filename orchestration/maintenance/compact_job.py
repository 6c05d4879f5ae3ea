"""The `<pipeline>_compact` job: merge the small files a micro-batch pipeline leaves behind
(a few per batch) in the table and the quarantine table, with delta-rs OPTIMIZE compact
(resources/delta/table.py `DeltaTarget.compact`, which says why it cannot disturb exactly-once).

Its own concurrency key (`<pipeline>.compact`): it runs beside micro-batches and backfills,
whose commits it never holds up, and two compactions of one pipeline never run at once. The
run observes the table asset with the file count and bytes after it, and its time, so the
asset shows whether maintenance keeps up (orchestration/metadata.py).
"""

import time
from collections.abc import Iterator

import dagster as dg

from orchestration.health.failures import one_line_failures
from orchestration.metadata import maintenance_metadata
from orchestration.names import dagster_name
from orchestration.resources import pipeline_in, pipeline_key
from orchestration.tags import PIPELINE_TAG
from resources.config.pipeline_config import PipelineConfig
from resources.delta.compaction import compacted_text


def build_compact_job(config: PipelineConfig, table: dg.AssetSpec) -> dg.JobDefinition:
    name = config.pipeline

    @dg.op(name=f"{dagster_name(name)}_compact_tables", required_resource_keys={pipeline_key(name)})
    @one_line_failures(name)
    def compact_tables(context: dg.OpExecutionContext) -> Iterator[dg.Output[str]]:
        """Compact the quarantine table, then the data table (the order of their commits)."""
        pipeline = pipeline_in(context, name)
        results = pipeline.publisher.compact()
        metadata: dict[str, int] = {}
        for target, done in results.items():
            context.log.info(compacted_text(target, done))
            if done is None:
                continue
            metadata[f"{target}_files_removed"] = done.files_removed
            metadata[f"{target}_files_added"] = done.files_added
        context.log_event(
            dg.AssetObservation(
                asset_key=table.key,
                metadata=maintenance_metadata(pipeline, context.instance, compacted=time.time()),
            )
        )
        removed = sum(d.files_removed for d in results.values() if d is not None)
        yield dg.Output(f"{removed} files compacted", metadata=metadata)

    @dg.job(
        name=f"{dagster_name(name)}_compact",
        description=(
            f"Merge the small files of pipeline {name!r}'s table and quarantine table "
            "(Delta OPTIMIZE compact), beside live batches and backfills."
        ),
        executor_def=dg.in_process_executor,
        tags={PIPELINE_TAG: f"{name}.compact"},
    )
    def compact_job() -> None:
        compact_tables()

    return compact_job
