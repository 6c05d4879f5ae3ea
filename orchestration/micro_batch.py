"""The micro-batch job of one pipeline: plan -> stage -> prepare -> commit.

Each op is a thin call into the protocol core (ledger/two_phase.py); all the exactly-once
reasoning lives there, none here. The run executes in one process so the ops share one
Spark session and pass the stage output in memory.
"""

from collections.abc import Iterator
from typing import Any

import dagster as dg

from jobs.micro_batch import SharedSpark, build
from ledger.store import Batch
from ledger.two_phase import StageOutput
from resources.config import PipelineConfig


def _ranges_metadata(batch: Batch) -> dict[str, Any]:
    return {
        "batch_id": batch.batch_id,
        "attempt": batch.attempt,
        "ranges": [str(r) for r in batch.ranges],
        "offsets_spanned": batch.span,
    }


def build_micro_batch_job(config: PipelineConfig) -> dg.JobDefinition:
    name = config.pipeline
    spark = SharedSpark(config.spark.master, config.spark.conf)

    def tpc() -> Any:
        return build(config, spark_factory=spark)

    @dg.op(name=f"{name}_plan", out=dg.Out(Batch, is_required=False))
    def plan(context: dg.OpExecutionContext) -> Iterator[dg.Output[Batch]]:
        """Recover first (finish voted batches), then fix the next batch's ranges."""
        coordinator = tpc()
        for done in coordinator.recover_and_commit():
            context.log.info(f"recovered batch {done.batch_id}: {done.state}")
        batch = coordinator.begin()
        if batch is None:
            context.log.info(f"{name}: caught up, nothing new to read")
            return
        yield dg.Output(batch, metadata=_ranges_metadata(batch))

    @dg.op(name=f"{name}_stage", out={"batch": dg.Out(Batch), "staged_files": dg.Out(StageOutput)})
    def stage(context: dg.OpExecutionContext, batch: Batch) -> Iterator[dg.Output[Any]]:
        staged, output = tpc().invoke(batch)
        context.log.info(f"staged {output.records_read} records into {len(output.files)} files")
        yield dg.Output(staged, "batch", metadata={"records": output.records_read})
        yield dg.Output(output, "staged_files", metadata={"files": len(output.files)})

    @dg.op(name=f"{name}_prepare", out=dg.Out(Batch))
    def prepare(batch: Batch, staged_files: StageOutput) -> Batch:
        return tpc().pre_commit(batch, staged_files)

    @dg.op(name=f"{name}_commit", out=dg.Out(Batch))
    def commit(context: dg.OpExecutionContext, batch: Batch) -> Batch:
        coordinator = tpc()
        acked = coordinator.ack(coordinator.commit(batch))
        context.add_output_metadata(
            {
                **_ranges_metadata(acked),
                "state": str(acked.state),
                "table_version": acked.table_version or 0,
            }
        )
        return acked

    @dg.job(
        name=f"{name}_micro_batch",
        description=f"One exactly-once micro-batch of pipeline {name!r}.",
        executor_def=dg.in_process_executor,
        tags={"exactly/pipeline": name},
    )
    def micro_batch() -> None:
        batch, staged_files = stage(plan())
        commit(prepare(batch, staged_files))

    return micro_batch


def build_schedule(config: PipelineConfig, job: dg.JobDefinition) -> dg.ScheduleDefinition:
    return dg.ScheduleDefinition(
        name=f"{config.pipeline}_schedule",
        job=job,
        cron_schedule=config.schedule.cron,
        execution_timezone=config.schedule.timezone,
        default_status=dg.DefaultScheduleStatus.STOPPED,
    )
