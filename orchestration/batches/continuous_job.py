"""The `<pipeline>_continuous` job: one long-running run that commits batch after batch.

A run per batch pays Dagster's launch and a new Spark session per batch, seconds before
the first record is read; for freshness, this run keeps its process, its Spark session and
its open tables, and runs the batches of jobs/wiring/continuous.py one after another. The UI
stays the place where every batch is seen: each batch gets its dynamic partition and its
materialization of the table and quarantine assets, with the same metadata as a
micro-batch run, as it commits; the run's batch tag names the batch in flight, so the
history and re-drive sensors leave that batch to this run (orchestration/health/liveness.py).

Stopping: terminate the run in the UI. Dagster interrupts the op, which is a crash
somewhere in a batch: recovery (this job's next run, any micro-batch run, or the re-drive
sensor for a batch that voted) finishes or abandons it, as for any run that died.
`max_batches` ends the run by itself (tests, bounded catch-ups). Don't leave
`<pipeline>_schedule` on beside it: both would plan the next batch, the ledger lets only
one of them own it, and the loser's run fails busy.
"""

import threading

import dagster as dg
from pydantic import Field

from jobs.wiring.continuous import Cadence, run_continuously
from ledger.coordinator.reports import BatchReport
from orchestration.batches.partitions import add_batch_partition
from orchestration.health.failures import one_line_failures
from orchestration.health.liveness import warn_if_not_acked
from orchestration.health.rejection import rejections_end_the_run
from orchestration.metadata import (
    commit_materialization,
    derived_materializations,
    maintenance_metadata,
    quarantine_materialization,
)
from orchestration.names import dagster_name
from orchestration.resources import pipeline_in, pipeline_key
from orchestration.tags import BATCH_TAG, PIPELINE_TAG
from resources.config.pipeline_config import PipelineConfig
from resources.delta.compaction import compacted_text


class ContinuousRequest(dg.Config):
    """How often the run starts a batch, and when it ends by itself."""

    min_interval_seconds: float = Field(
        default=1.0,
        ge=0,
        description="Seconds between the starts of two batches at least; a caught-up "
        "pipeline polls the topic this often.",
    )
    max_batches: int | None = Field(
        default=None,
        ge=1,
        description="End the run after this many committed batches (default: run until "
        "the run is terminated).",
    )


def build_continuous_job(
    config: PipelineConfig, batches: dg.DynamicPartitionsDefinition, table: dg.AssetSpec
) -> dg.JobDefinition:
    name = config.pipeline

    @dg.op(
        name=f"{dagster_name(name)}_commit_continuously",
        required_resource_keys={pipeline_key(name)},
    )
    @one_line_failures(name)
    def continuous(context: dg.OpExecutionContext, config: ContinuousRequest) -> dg.Output[int]:
        """Recover, then commit batches until terminated or `max_batches` have committed."""
        pipeline = pipeline_in(context, name)
        tpc = pipeline.live
        request = {"partition": "continuous"}
        with rejections_end_the_run(context, name, request):
            for done in pipeline.recover():
                context.log.info(f"recovered batch {done.app_id}/{done.batch_id}: {done.state}")

        def run_batch() -> BatchReport | None:
            with rejections_end_the_run(context, name, request):
                batch = tpc.begin()
                if batch is None:
                    return None
                # the batch in flight is this run's: the sensors see the run as its owner
                context.instance.add_run_tags(context.run_id, {BATCH_TAG: str(batch.batch_id)})
                add_batch_partition(context.instance, batches.name, str(batch.batch_id))
                return tpc.finish(batch)

        def committed(report: BatchReport) -> None:
            batch = report.batch
            warn_if_not_acked(context.log.warning, batch)
            context.log.info(report.line())
            extra = maintenance_metadata(pipeline, context.instance)
            materialization = commit_materialization(
                table.key, pipeline, batch, partition=str(batch.batch_id), extra=extra
            )
            context.log_event(materialization)
            context.log_event(quarantine_materialization(pipeline, batch, str(batch.batch_id)))
            for derived in derived_materializations(pipeline, batch, str(batch.batch_id)):
                context.log_event(derived)

        def sweep() -> None:
            # a backfill that died while this run holds the pipeline's one run slot: the
            # re-drive sensor's backfill run would wait for this one to end
            with rejections_end_the_run(context, name, request):
                for done in pipeline.recover_backfills():
                    context.log.info(f"recovered batch {done.app_id}/{done.batch_id}: {done.state}")
            for target, compacted in pipeline.compact_piled().items():
                context.log.info(compacted_text(target, compacted))

        cadence = Cadence(config.min_interval_seconds, config.max_batches)
        done = run_continuously(run_batch, cadence, threading.Event(), committed, sweep=sweep)
        return dg.Output(done, metadata={"batches": done})

    # the op's name differs from the job's: a graph and an op of one name conflict in the
    # code location (`dagster definitions validate` refuses it)
    @dg.job(
        name=f"{dagster_name(name)}_continuous",
        description=(
            f"Commit exactly-once micro-batches of pipeline {name!r} one after another in one "
            "long-running run (freshness); every batch gets its partition and materialization."
        ),
        executor_def=dg.in_process_executor,
        tags={PIPELINE_TAG: name},
    )
    def continuous_job() -> None:
        continuous()

    return continuous_job
