"""The jobs of one pipeline: the micro-batch (plan -> stage -> prepare -> commit) and the
commit-only re-drive.

Each op is a thin call into the protocol core (ledger/two_phase.py); all the exactly-once
reasoning lives there, none here. Runs are partitioned by batch id (a dynamic partition per
batch), so the job's partition view in the UI is the checkpoint history. A run executes in
one process so its ops share one Spark session and pass the stage output in memory.
"""

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import dagster as dg
from deltalake import DeltaTable
from pydantic import Field

from jobs.pipeline import build, build_backfill
from jobs.spark_stager import SharedSpark
from ledger.backfill import BACKFILL, BackfillMode, plan_backfill
from ledger.protocol import MUST_FINISH, BatchState, OffsetRange
from ledger.store import Batch
from ledger.two_phase import StageOutput, TwoPhaseCommit
from resources.config import PipelineConfig

PIPELINE_TAG = "exactly/pipeline"
BATCH_TAG = "exactly/batch"
#: A run for an existing batch's partition reprocesses it (a replace backfill) only when an
#: operator asked: a partition backfill launched from the UI, or this tag set by hand.
REPROCESS_TAGS = frozenset({"dagster/backfill", "exactly/reprocess"})


@dataclass(frozen=True)
class PipelineJobs:
    config: PipelineConfig
    batches: dg.DynamicPartitionsDefinition
    table: dg.AssetSpec
    micro_batch: dg.JobDefinition
    redrive: dg.JobDefinition
    backfill: dg.JobDefinition
    coordinator: Any  # () -> TwoPhaseCommit, shared with the sensors and the schedule
    backfill_coordinator: Any  # () -> TwoPhaseCommit of the pipeline's backfills


def batch_metadata(batch: Batch) -> dict[str, Any]:
    """Run metadata of a batch: what the UI's partition view shows per checkpoint."""
    meta: dict[str, Any] = {
        "batch_id": batch.batch_id,
        "state": str(batch.state),
        "attempt": batch.attempt,
        "ranges": [str(r) for r in batch.ranges],
        "offsets_spanned": batch.span,
    }
    for key in ("records_read", "table_records", "quarantine_records", "files"):
        if key in batch.metrics:
            meta[key] = batch.metrics[key]
    for phase, seconds in batch.metrics.get("phase_s", {}).items():
        meta[f"{phase}_seconds"] = round(seconds, 3)
    return meta


def table_metadata(coordinator: TwoPhaseCommit, config: PipelineConfig) -> dict[str, Any]:
    """Table version, row count, last batch id and consumer lag per partition."""
    meta: dict[str, Any] = {"table_uri": dg.MetadataValue.path(config.delta.table_uri)}
    if DeltaTable.is_deltatable(config.delta.table_uri):
        table = DeltaTable(config.delta.table_uri)
        actions = table.get_add_actions(flatten=True)
        meta["table_version"] = table.version()
        meta["row_count"] = int(sum(actions.column("num_records").to_pylist() or [0]))
        meta["last_batch_id"] = table.transaction_version(config.app_id) or 0
    source = coordinator.source
    try:
        available = source.available()
        group = source.client.group_offsets(config.group_id, config.kafka.topic)
        meta["consumer_lag"] = {
            str(p): a.last_stable - group.get(p, a.earliest) for p, a in sorted(available.items())
        }
    except Exception as exc:
        meta["consumer_lag_error"] = str(exc)
    return meta


def _timed(coordinator: TwoPhaseCommit, batch: Batch, phase: str, started: float) -> Batch:
    phases = {**batch.metrics.get("phase_s", {}), phase: time.perf_counter() - started}
    return coordinator.store.record_metrics(batch, {"phase_s": phases})


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
    ranges: list[OffsetRangeConfig] = Field(default_factory=list)
    transform: str | None = Field(
        default=None, description="module:function instead of the pipeline's transform"
    )
    again: bool = Field(default=False, description="repeat an identical finished backfill")


def build_pipeline_jobs(config: PipelineConfig) -> PipelineJobs:
    name = config.pipeline
    pipeline_config = config
    batches = dg.DynamicPartitionsDefinition(name=f"{name}_batches")
    table = dg.AssetSpec(
        key=f"{name}_table",
        description=f"Delta table {config.delta.table_uri}, one partition per committed batch",
        partitions_def=batches,
        group_name="exactly",
        kinds={"delta"},
    )
    spark = SharedSpark(config.spark.master, config.spark.conf)

    def coordinator() -> TwoPhaseCommit:
        return build(config, spark_factory=spark)

    def coordinator_for(batch: Batch) -> TwoPhaseCommit:
        """Live batches and reprocessing (replace backfill) batches flow through the same ops."""
        if batch.kind == BACKFILL:
            return build_backfill(
                config, transform=batch.params.get("transform"), spark_factory=spark
            )
        return coordinator()

    def publish_event(context: dg.OpExecutionContext, tpc: TwoPhaseCommit, batch: Batch) -> None:
        partition = context.partition_key if context.has_partition_key else str(batch.batch_id)
        meta = {**batch_metadata(batch), **table_metadata(tpc, config)}
        if batch.kind == BACKFILL:
            meta["reprocessed_by"] = f"{batch.app_id}/{batch.batch_id}"
        context.log_event(
            dg.AssetMaterialization(asset_key=table.key, partition=partition, metadata=meta)
        )

    def reprocess(context: dg.OpExecutionContext, existing: Batch) -> Batch | None:
        """A partition backfill over existing batches replaces their ranges."""
        ranges = [r for r in existing.ranges if r.span]
        if not ranges:
            context.log.info(f"batch {existing.batch_id} read nothing; nothing to reprocess")
            return None
        tpc = build_backfill(config, spark_factory=spark)
        batch, _ = plan_backfill(
            tpc,
            live_app_id=config.app_id,
            mode=BackfillMode.REPLACE,
            ranges=ranges,
            transform=config.transform,
            again=True,
        )
        context.log.info(f"reprocessing batch {existing.batch_id} as {batch.label}")
        return batch

    @dg.op(name=f"{name}_plan", out=dg.Out(Batch, is_required=False))
    def plan(context: dg.OpExecutionContext) -> Iterator[dg.Output[Batch]]:
        """Recover first (finish voted batches), then plan the run's batch."""
        started = time.perf_counter()
        tpc = coordinator()
        for done in tpc.recover_and_commit():
            context.log.info(f"recovered batch {done.batch_id}: {done.state}")
        wanted = int(context.partition_key) if context.has_partition_key else None
        if wanted is not None and (existing := tpc.store.get(config.app_id, wanted)):
            asked = REPROCESS_TAGS & set(context.run.tags)
            if asked and existing.state in (BatchState.COMMITTED, BatchState.ACKED):
                if replacement := reprocess(context, existing):
                    yield dg.Output(replacement, metadata=batch_metadata(replacement))
                return
            context.log.info(f"batch {wanted} already exists ({existing.state}); nothing to plan")
            return
        batch = tpc.begin(batch_id=wanted)
        if batch is None:
            context.log.info(f"{name}: caught up, nothing new to read")
            return
        context.instance.add_run_tags(context.run_id, {BATCH_TAG: str(batch.batch_id)})
        if wanted is None:
            context.instance.add_dynamic_partitions(batches.name, [str(batch.batch_id)])
        batch = _timed(tpc, batch, "plan", started)
        yield dg.Output(batch, metadata=batch_metadata(batch))

    @dg.op(name=f"{name}_stage", out={"batch": dg.Out(Batch), "staged_files": dg.Out(StageOutput)})
    def stage(batch: Batch) -> Iterator[dg.Output[Any]]:
        started = time.perf_counter()
        tpc = coordinator_for(batch)
        staged, output = tpc.invoke(batch)
        staged = _timed(tpc, staged, "stage", started)
        yield dg.Output(staged, "batch", metadata=batch_metadata(staged))
        yield dg.Output(output, "staged_files", metadata={"files": len(output.files)})

    @dg.op(name=f"{name}_prepare", out=dg.Out(Batch))
    def prepare(batch: Batch, staged_files: StageOutput) -> dg.Output[Batch]:
        started = time.perf_counter()
        tpc = coordinator_for(batch)
        prepared = _timed(tpc, tpc.pre_commit(batch, staged_files), "prepare", started)
        return dg.Output(prepared, metadata=batch_metadata(prepared))

    @dg.op(name=f"{name}_commit", out=dg.Out(Batch))
    def commit(context: dg.OpExecutionContext, batch: Batch) -> dg.Output[Batch]:
        started = time.perf_counter()
        tpc = coordinator_for(batch)
        acked = _timed(tpc, tpc.ack(tpc.commit(batch)), "commit", started)
        publish_event(context, tpc, acked)
        return dg.Output(acked, metadata=batch_metadata(acked))

    @dg.job(
        name=f"{name}_micro_batch",
        description=f"One exactly-once micro-batch of pipeline {name!r}; partition = batch id.",
        executor_def=dg.in_process_executor,
        partitions_def=batches,
        tags={PIPELINE_TAG: name},
    )
    def micro_batch() -> None:
        batch, staged_files = stage(plan())
        commit(prepare(batch, staged_files))

    @dg.op(name=f"{name}_redrive_commit", out=dg.Out(Batch, is_required=False))
    def redrive_commit(context: dg.OpExecutionContext) -> Iterator[dg.Output[Batch]]:
        """Finish one voted batch (PREPARED or COMMITTED) under a new attempt."""
        tpc = coordinator()
        batch = tpc.store.get(config.app_id, int(context.partition_key))
        if batch is None or batch.state not in MUST_FINISH:
            state = batch.state if batch else "missing"
            context.log.info(f"batch {context.partition_key} is {state}: nothing to re-drive")
            return
        batch = tpc.store.takeover(batch)
        context.log.info(f"re-driving batch {batch.label} from {batch.state}")
        if batch.state is BatchState.PREPARED:
            batch = tpc.commit(batch, recovering=True)
        acked = tpc.ack(batch)
        publish_event(context, tpc, acked)
        yield dg.Output(acked, metadata=batch_metadata(acked))

    @dg.job(
        name=f"{name}_redrive",
        description=f"Commit-only re-drive of one prepared batch of pipeline {name!r}.",
        executor_def=dg.in_process_executor,
        partitions_def=batches,
        tags={PIPELINE_TAG: name},
    )
    def redrive() -> None:
        redrive_commit()

    @dg.op(name=f"{name}_backfill_ranges", out=dg.Out(Batch, is_required=False))
    def run_backfill(
        context: dg.OpExecutionContext, config: BackfillRequest
    ) -> Iterator[dg.Output[Batch]]:
        """Finish voted backfill batches, then fill or replace the requested ranges."""
        transform = config.transform or pipeline_config.transform
        tpc = build_backfill(pipeline_config, transform=transform, spark_factory=spark)
        for done in tpc.recover_and_commit():
            context.log.info(f"recovered backfill batch {done.batch_id}: {done.state}")
        if not config.ranges:
            context.log.info("no ranges requested: recovery only")
            return
        ranges = [
            OffsetRange(r.topic or pipeline_config.kafka.topic, r.partition, r.start, r.end)
            for r in config.ranges
        ]
        batch, planned = plan_backfill(
            tpc,
            live_app_id=pipeline_config.app_id,
            mode=BackfillMode(config.mode),
            ranges=ranges,
            transform=transform,
            again=config.again,
        )
        if not planned:
            context.log.info(f"already done as {batch.label} ({batch.state}); nothing to do")
            return
        context.instance.add_run_tags(
            context.run_id, {BATCH_TAG: f"{batch.app_id}/{batch.batch_id}"}
        )
        report = tpc.finish(batch)
        yield dg.Output(report.batch, metadata=batch_metadata(report.batch))

    @dg.job(
        name=f"{name}_backfill",
        description=(
            f"Fill or replace offset ranges of pipeline {name!r}, exactly once, while the live "
            "pipeline keeps running. Without ranges it only finishes voted backfill batches."
        ),
        executor_def=dg.in_process_executor,
        tags={PIPELINE_TAG: f"{name}.backfill"},
    )
    def backfill() -> None:
        run_backfill()

    def backfill_coordinator() -> TwoPhaseCommit:
        return build_backfill(config, spark_factory=spark)

    return PipelineJobs(
        config, batches, table, micro_batch, redrive, backfill, coordinator, backfill_coordinator
    )
