"""What the UI shows of a batch and of the table, as Dagster metadata.

Every run carries its batch's ranges, counts and phase times, so the job's partition view is
the checkpoint history; every commit materializes the table asset's partition with the
table's version, rows and last batch id and the consumer group's lag, all read through the
pipeline's edges (jobs/delta_publisher.py, jobs/offset_source.py).
"""

from __future__ import annotations

from typing import Any

import dagster as dg

from jobs.pipeline import Pipeline
from ledger.batch import Batch, BatchKind


def batch_metadata(batch: Batch) -> dict[str, Any]:
    """Run metadata of a batch: what the UI's partition view shows per checkpoint."""
    meta: dict[str, Any] = {
        "batch_id": batch.batch_id,
        "state": str(batch.state),
        "attempt": batch.attempt,
        "ranges": [str(r) for r in batch.ranges],
        "offsets_spanned": batch.span,
    }
    counts = ("files_staged", "files_committed", "files_already_committed", "files_missing")
    for key in ("records_read", "table_records", "quarantine_records", "files", *counts):
        if key in batch.metrics:
            meta[key] = batch.metrics[key]
    if "restage" in batch.metrics:  # staged again after its vote lost files (invariant 11)
        meta["restages"] = batch.metrics["restage"].get("count", 0)
    for phase, seconds in batch.metrics.get("phase_s", {}).items():
        meta[f"{phase}_seconds"] = round(seconds, 3)
    return meta


def table_metadata(pipeline: Pipeline) -> dict[str, Any]:
    """Table version, row count, last batch id and consumer lag per partition.

    The lag is advisory (so is the group it is read from): when Kafka cannot say, the
    metadata says why instead of failing the commit that is being recorded.
    """
    config = pipeline.config
    meta: dict[str, Any] = {"table_uri": dg.MetadataValue.path(config.delta.table_uri)}
    stats = pipeline.publisher.table_stats(config.app_id)
    if stats is not None:
        meta["table_version"] = stats.version
        meta["row_count"] = stats.row_count
        meta["last_batch_id"] = stats.app_version or 0
    try:
        lag = pipeline.source.consumer_lag()
        meta["consumer_lag"] = {str(p): offsets for p, offsets in lag.items()}
    except Exception as exc:
        meta["consumer_lag_error"] = str(exc)
    return meta


def log_commit(
    context: dg.OpExecutionContext, table: dg.AssetKey, pipeline: Pipeline, batch: Batch
) -> None:
    """Materialize the table asset's partition of a committed batch (the run's partition, or
    the batch id), with the batch's and the table's metadata."""
    partition = context.partition_key if context.has_partition_key else str(batch.batch_id)
    meta = {
        **batch_metadata(batch),
        **table_metadata(pipeline),
        **maintenance_metadata(pipeline, context.instance),
    }
    if batch.kind == BatchKind.BACKFILL:
        meta["reprocessed_by"] = f"{batch.app_id}/{batch.batch_id}"
    context.log_event(dg.AssetMaterialization(asset_key=table, partition=partition, metadata=meta))


def maintenance_metadata(
    pipeline: Pipeline, instance: dg.DagsterInstance, **done_now: float
) -> dict[str, Any]:
    """Both tables' file count and bytes, and when each maintenance job last succeeded.

    What tells an operator whether compaction and cleaning keep up: the file count grows by
    a few files per batch until the compact job merges them. The times come from the
    instance's last successful `<pipeline>_compact` and `<pipeline>_clean` runs;
    `done_now` (`compacted=...`, `cleaned=...`, epoch seconds) stands for a run that is
    finishing as this is recorded.
    """
    meta: dict[str, Any] = {}
    for target, layout in pipeline.publisher.layouts().items():
        if layout is not None:
            meta[f"{target}_files"] = layout.files
            meta[f"{target}_bytes"] = layout.bytes
    name = pipeline.config.pipeline
    for job, key in ((f"{name}_compact", "compacted"), (f"{name}_clean", "cleaned")):
        when = done_now.get(key)
        if when is None:
            runs = instance.get_run_records(
                filters=dg.RunsFilter(job_name=job, statuses=[dg.DagsterRunStatus.SUCCESS]),
                limit=1,
            )
            when = runs[0].end_time if runs else None
        if when is not None:
            meta[f"last_{key}_at"] = dg.MetadataValue.timestamp(when)
    return meta
