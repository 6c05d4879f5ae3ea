"""What the UI shows of a batch and of the table, as Dagster metadata.

Every run's outputs carry their batch's ranges, counts and phase times; every committed batch
materializes the table asset with the same metadata (`commit_materialization`), whichever
path committed it: a micro-batch, next-batch or re-drive run, a backfill run, or the history
sensor for batches committed where Dagster did not see it (the CLI, recovery, a run that
died before logging). Measures are numbers, so the asset's plots draw them; identifiers
(batch, application id, attempt) are text, so they are labels and never plotted. The table's
version and row count are read as of the version the batch committed, so the history shows
each commit's table rather than today's. The quarantine and each derived output are
materialized for the same commit on the same partition (`quarantine_materialization`,
`derived_materializations`): they are published in the batch's commit too.

Live batches materialize their own partition (the batch id). Backfill batches are not live
batches and have no partition of their own: they materialize the asset without a partition
(labelled `<pipeline>.backfill/<id>`), so the partitions view holds exactly the live batches
while the version and row-count plots over time hold every commit. A reprocess launched on a
live batch's partition materializes that partition, `reprocessed_by` the backfill batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

from jobs.publish.delta_publisher import DERIVED_METRICS
from jobs.wiring.pipeline import Pipeline
from ledger.core.batch import Batch, BatchKind
from orchestration.assets import derived_key, quarantine_key
from orchestration.health.checks_now import report_checks_after_commit
from orchestration.names import dagster_name

_COUNTS = (
    "records_read",
    "table_records",
    "quarantine_records",
    "files",
    "files_staged",
    "files_committed",
    "files_already_committed",
    "files_missing",
)


def batch_label(batch: Batch) -> str:
    """The unambiguous name of a batch: backfill batch 1 is not live batch 1."""
    return f"{batch.app_id}/{batch.batch_id}"


def batch_metadata(batch: Batch) -> dict[str, dg.MetadataValue]:
    """A batch as the ledger records it: identifiers as text, measures as numbers, and its
    original timings (creation, commit, seconds per phase)."""
    meta: dict[str, dg.MetadataValue] = {
        "batch": dg.MetadataValue.text(batch_label(batch)),
        "app_id": dg.MetadataValue.text(batch.app_id),
        "batch_id": dg.MetadataValue.text(str(batch.batch_id)),
        "attempt": dg.MetadataValue.text(str(batch.attempt)),
        "kind": dg.MetadataValue.text(str(batch.kind)),
        "state": dg.MetadataValue.text(str(batch.state)),
        "ranges": dg.MetadataValue.text(" ".join(str(r) for r in batch.ranges) or "(empty)"),
        "offsets_spanned": dg.MetadataValue.int(batch.span),
        "created_at": dg.MetadataValue.timestamp(batch.created_at),
    }
    if batch.committed_at is not None:
        meta["committed_at"] = dg.MetadataValue.timestamp(batch.committed_at)
    if batch.table_version is not None:
        meta["table_version"] = dg.MetadataValue.int(batch.table_version)
    for key in _COUNTS:
        if key in batch.metrics:
            meta[key] = dg.MetadataValue.int(int(batch.metrics[key]))
    if "restage" in batch.metrics:  # staged again after its vote lost files (invariant 11)
        meta["restages"] = dg.MetadataValue.int(int(batch.metrics["restage"].get("count", 0)))
    phases: dict[str, float] = batch.metrics.get("phase_s", {})
    for phase, seconds in phases.items():
        meta[f"{phase}_seconds"] = dg.MetadataValue.float(round(float(seconds), 3))
    total = sum(phases.values())
    if "records_read" in batch.metrics and "stage" in phases and total > 0:  # read here
        rate = batch.metrics["records_read"] / total
        meta["records_per_second"] = dg.MetadataValue.float(round(rate, 1))
    return meta


def table_metadata(pipeline: Pipeline, batch: Batch) -> dict[str, dg.MetadataValue]:
    """The table as the batch's commit left it: its version, row count and the live
    pipeline's last batch then. A version no longer readable (its log was cleaned) is said,
    not guessed."""
    config = pipeline.config
    meta: dict[str, dg.MetadataValue] = {"table_uri": dg.MetadataValue.path(config.delta.table_uri)}
    try:
        stats = pipeline.publisher.table_stats(config.app_id, batch.table_version)
    except Exception as exc:
        meta["table_stats_error"] = dg.MetadataValue.text(str(exc))
        return meta
    if stats is not None:
        meta["table_version"] = dg.MetadataValue.int(stats.version)
        meta["row_count"] = dg.MetadataValue.int(stats.row_count)
        meta["last_batch_id"] = dg.MetadataValue.text(str(stats.app_version or 0))
    return meta


def lag_metadata(pipeline: Pipeline) -> dict[str, dg.MetadataValue]:
    """The consumer group's lag now, in total and per partition, as separate numbers.

    The lag is advisory (so is the group it is read from): when Kafka cannot say, the
    metadata says why instead of failing the commit that is being recorded.
    """
    try:
        lag = pipeline.source.consumer_lag()
    except Exception as exc:
        return {"consumer_lag_error": dg.MetadataValue.text(str(exc))}
    meta = {"consumer_lag_total": dg.MetadataValue.int(sum(lag.values()))}
    for partition, offsets in sorted(lag.items()):
        meta[f"consumer_lag_p{partition}"] = dg.MetadataValue.int(offsets)
    return meta


def commit_materialization(
    table: dg.AssetKey,
    pipeline: Pipeline,
    batch: Batch,
    *,
    partition: str | None = None,
    with_lag: bool = True,
    extra: Mapping[str, Any] | None = None,
) -> dg.AssetMaterialization:
    """The table asset's materialization of a committed batch, on `partition` (default: the
    batch's own for a live batch, none for a backfill batch).

    `with_lag` is for commits recorded as they happen: the group's lag is a value of now,
    so a batch reported later (by the history sensor) does not claim it. `extra` adds
    metadata of the moment of the commit (the tables' layout and maintenance times).
    """
    if partition is None and batch.kind == BatchKind.LIVE:
        partition = str(batch.batch_id)
    meta: dict[str, Any] = {**batch_metadata(batch), **table_metadata(pipeline, batch)}
    if with_lag:
        meta.update(lag_metadata(pipeline))
    meta.update(extra or {})
    if batch.kind == BatchKind.BACKFILL and partition is not None:
        meta["reprocessed_by"] = dg.MetadataValue.text(batch_label(batch))
    return dg.AssetMaterialization(asset_key=table, partition=partition, metadata=meta)


def log_commit(
    context: dg.OpExecutionContext, table: dg.AssetKey, pipeline: Pipeline, batch: Batch
) -> None:
    """Materialize the table asset for a batch the run committed (on the run's partition,
    when it has one), and the quarantine's and each derived output's for the same commit;
    then evaluate the checks on them (orchestration/health/checks_now.py)."""
    partition = context.partition_key if context.has_partition_key else None
    extra = maintenance_metadata(pipeline, context.instance)
    materialization = commit_materialization(
        table, pipeline, batch, partition=partition, extra=extra
    )
    context.log_event(materialization)
    context.log_event(quarantine_materialization(pipeline, batch, materialization.partition))
    for derived in derived_materializations(pipeline, batch, materialization.partition):
        context.log_event(derived)
    report_checks_after_commit(context, pipeline.config.pipeline)


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
    for job, key in (
        (f"{dagster_name(name)}_compact", "compacted"),
        (f"{dagster_name(name)}_clean", "cleaned"),
    ):
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


def quarantine_materialization(
    pipeline: Pipeline, batch: Batch, partition: str | None
) -> dg.AssetMaterialization:
    """The quarantine asset's materialization of the same commit as the table's (on the same
    partition): the quarantine is published in the batch's checkpoint too (quarantine
    first), so its version and rows move with the table's, even when this batch quarantined
    nothing."""
    config = pipeline.config
    meta: dict[str, Any] = {
        "table_uri": dg.MetadataValue.path(config.delta.quarantine_uri),
        # an identifier, not a measure: text, so the UI does not plot it
        "batch": dg.MetadataValue.text(batch_label(batch)),
    }
    if "quarantine_records" in batch.metrics:
        meta["quarantine_records"] = batch.metrics["quarantine_records"]
    stats = pipeline.publisher.quarantine_stats(batch.app_id)
    if stats is not None:
        meta["table_version"] = stats.version
        meta["row_count"] = stats.row_count
    key = quarantine_key(config.pipeline)
    return dg.AssetMaterialization(asset_key=key, partition=partition, metadata=meta)


#: A derived output's merge outcome (jobs/publish/derived_outputs.py `merge_outcome`) as metadata:
#: the measures as numbers, so the asset's plots draw rows changed and seconds per batch.
_MERGE_FIGURES = ("rows_inserted", "rows_updated", "rows_deleted", "tries")


def derived_materializations(
    pipeline: Pipeline, batch: Batch, partition: str | None
) -> list[dg.AssetMaterialization]:
    """Each derived output's materialization of the same commit as the table's (on the same
    partition): the batch MERGEd into every output before the table (invariant 12), so each
    output's history moves with the table's, also when the batch changed no group.

    With the batch's outcome for the output when the ledger has it (applied, the version
    the MERGE made, rows inserted/updated/deleted, seconds); a batch rebuilt from the Delta
    log has none, and gets what the output's log says: its version and row count, read from
    the log's file statistics (cheap, as the quarantine's), as of the MERGE's version when
    known so the history shows each commit's table. A version no longer readable is said.
    """
    outcomes: Mapping[str, Any] = batch.metrics.get(DERIVED_METRICS, {})
    found = []
    for spec, delta in pipeline.publisher.derived:
        app_id = spec.app_id(batch.app_id)
        meta: dict[str, Any] = {
            "table_uri": dg.MetadataValue.path(spec.table_uri),
            "batch": dg.MetadataValue.text(batch_label(batch)),
            "output_app_id": dg.MetadataValue.text(app_id),
        }
        outcome: Mapping[str, Any] | None = outcomes.get(spec.name)
        version = None
        if outcome is not None:
            meta["applied"] = dg.MetadataValue.bool(bool(outcome.get("applied")))
            if outcome.get("version") is not None:
                version = int(outcome["version"])
                meta["merge_version"] = dg.MetadataValue.int(version)
            if outcome.get("seconds") is not None:
                meta["merge_seconds"] = dg.MetadataValue.float(float(outcome["seconds"]))
            for key in _MERGE_FIGURES:
                if key in outcome:
                    meta[key] = dg.MetadataValue.int(int(outcome[key]))
        try:
            stats = delta.stats(app_id, version)
        except Exception as exc:  # the version's log was cleaned, the store unreachable
            meta["table_stats_error"] = dg.MetadataValue.text(str(exc))
            stats = None
        if stats is not None:
            meta["table_version"] = dg.MetadataValue.int(stats.version)
            meta["row_count"] = dg.MetadataValue.int(stats.row_count)
            meta["last_batch_id"] = dg.MetadataValue.text(str(stats.app_version or 0))
        key = derived_key(pipeline.config.pipeline, spec.name)
        found.append(dg.AssetMaterialization(asset_key=key, partition=partition, metadata=meta))
    return found + postgres_materializations(pipeline, batch, partition)


def postgres_materializations(
    pipeline: Pipeline, batch: Batch, partition: str | None
) -> list[dg.AssetMaterialization]:
    """Each PostgreSQL output's materialization of the commit: the batch was applied to it
    before the table (jobs/publish/delta_publisher.py), with the transaction's outcome when the
    ledger has it (applied, the state's batch id, rows upserted, seconds, tries). A database
    table has no version to read stats at; the check reads it."""
    outcomes: Mapping[str, Any] = batch.metrics.get(DERIVED_METRICS, {})
    found = []
    for pg in pipeline.publisher.postgres.values():
        spec = pg.spec
        meta: dict[str, Any] = {
            "table": dg.MetadataValue.text(spec.table),
            "batch": dg.MetadataValue.text(batch_label(batch)),
            "output_app_id": dg.MetadataValue.text(spec.app_id(batch.app_id)),
        }
        outcome: Mapping[str, Any] | None = outcomes.get(spec.name)
        if outcome is not None:
            meta["applied"] = dg.MetadataValue.bool(bool(outcome.get("applied")))
            if outcome.get("seconds") is not None:
                meta["apply_seconds"] = dg.MetadataValue.float(float(outcome["seconds"]))
            for key in ("held_batch_id", "rows_upserted", "tries"):
                if outcome.get(key) is not None:
                    meta[key] = dg.MetadataValue.int(int(outcome[key]))
        key = derived_key(pipeline.config.pipeline, spec.name)
        found.append(dg.AssetMaterialization(asset_key=key, partition=partition, metadata=meta))
    return found
