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
from orchestration.assets import quarantine_key


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
    the batch id), with the batch's and the table's metadata, and the quarantine asset's."""
    partition = context.partition_key if context.has_partition_key else str(batch.batch_id)
    meta = {**batch_metadata(batch), **table_metadata(pipeline)}
    if batch.kind == BatchKind.BACKFILL:
        meta["reprocessed_by"] = f"{batch.app_id}/{batch.batch_id}"
    context.log_event(dg.AssetMaterialization(asset_key=table, partition=partition, metadata=meta))
    log_quarantine(context, pipeline, batch, partition)


def log_quarantine(
    context: dg.OpExecutionContext, pipeline: Pipeline, batch: Batch, partition: str
) -> None:
    """Materialize the quarantine asset's partition of the same commit: the quarantine is
    published in the batch's checkpoint too (quarantine first), so its version and rows move
    with the table's, even when this batch quarantined nothing."""
    config = pipeline.config
    meta: dict[str, Any] = {
        "table_uri": dg.MetadataValue.path(config.delta.quarantine_uri),
        # an identifier, not a measure: text, so the UI does not plot it
        "batch": dg.MetadataValue.text(f"{batch.app_id}/{batch.batch_id}"),
    }
    if "quarantine_records" in batch.metrics:
        meta["quarantine_records"] = batch.metrics["quarantine_records"]
    stats = pipeline.publisher.quarantine_stats(batch.app_id)
    if stats is not None:
        meta["table_version"] = stats.version
        meta["row_count"] = stats.row_count
    key = quarantine_key(config.pipeline)
    context.log_event(dg.AssetMaterialization(asset_key=key, partition=partition, metadata=meta))
