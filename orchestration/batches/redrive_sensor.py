"""The `<pipeline>_redrive_sensor`: a commit-only run for every voted batch whose run died.

"Commit must eventually succeed, or data is lost" (docs/protocol.md). Live batches get a
`<pipeline>_redrive` run of their partition; backfill batches a `<pipeline>_backfill` run
without ranges, which only recovers. The run key is (batch, attempt): an attempt is re-driven
once; if that run dies too, its takeover raised the attempt and a later evaluation may launch
again. Which voted batches need it is the coordinator's decision (`needs_redrive`): a
COMMITTED batch whose ack was refused is retried every `batch.ack_retry_seconds`, not on
every evaluation. Each evaluation also abandons live and backfill batches whose run died
before the vote (orchestration/health/liveness.py, invariant 16).
"""

from collections.abc import Callable, Iterator
from typing import Any

import dagster as dg

from jobs.wiring.pipeline import Pipeline
from ledger.coordinator.two_phase import TwoPhaseCommit
from ledger.core.batch import Batch
from ledger.core.protocol import IN_FLIGHT
from orchestration.batches.partitions import add_batch_partition
from orchestration.health.liveness import abandon_dead_batches, run_alive
from orchestration.names import dagster_name
from orchestration.resources import pipeline_in, pipeline_key
from orchestration.tags import BATCH_TAG
from resources.config.pipeline_config import PipelineConfig


def _unattended(coordinator: TwoPhaseCommit) -> list[Batch]:
    """The coordinator's voted batches nobody is finishing (`needs_redrive`), oldest first:
    PREPARED or COMMITTED, or sent back to be staged again (invariant 11), which the
    schedule would otherwise wait for forever as a batch in flight."""
    found = coordinator.store.batches(app_id=coordinator.app_id, states=IN_FLIGHT)
    return [b for b in sorted(found, key=lambda b: b.batch_id) if coordinator.needs_redrive(b)]


def redrive_requests(
    pipeline: Pipeline,
    instance: dg.DagsterInstance,
    *,
    partitions: str,
    redrive_job: str,
    backfill_job: str,
    log: Callable[[str], None] = lambda _msg: None,
) -> Iterator[dg.RunRequest]:
    """A commit-only run for every voted batch nobody is finishing, after abandoning the
    batches whose run died before the vote."""
    name = pipeline.config.pipeline
    abandon_dead_batches(pipeline, instance, [pipeline.live, pipeline.backfill()], log)
    for batch in _unattended(pipeline.live):
        key = str(batch.batch_id)
        if run_alive(instance, name, key):
            continue
        add_batch_partition(instance, partitions, key)
        yield dg.RunRequest(
            run_key=f"{batch.app_id}:{batch.batch_id}:{batch.attempt}",
            job_name=redrive_job,
            partition_key=key,
            tags={BATCH_TAG: key},
        )
    for batch in _unattended(pipeline.backfill()):
        label = f"{batch.app_id}/{batch.batch_id}"
        if run_alive(instance, f"{name}.backfill", label):
            continue
        yield dg.RunRequest(
            run_key=f"{batch.app_id}:{batch.batch_id}:{batch.attempt}",
            job_name=backfill_job,
            tags={BATCH_TAG: label},
        )


def build_redrive_sensor(
    config: PipelineConfig,
    batches: dg.DynamicPartitionsDefinition,
    redrive: dg.JobDefinition,
    backfill: dg.JobDefinition,
) -> dg.SensorDefinition:
    name = config.pipeline

    @dg.sensor(
        name=f"{dagster_name(name)}_redrive_sensor",
        jobs=[redrive, backfill],
        minimum_interval_seconds=config.schedule.sensor_interval(30),
        default_status=dg.DefaultSensorStatus.STOPPED,
        description=(
            "Launches a commit-only run for every PREPARED or COMMITTED batch whose run died "
            "and for every batch being staged again after its vote lost files, and abandons "
            "PLANNED or STAGED batches whose run died."
        ),
        required_resource_keys={pipeline_key(name)},
    )
    def redrive_sensor(
        context: dg.SensorEvaluationContext, **_passed: Any
    ) -> Iterator[dg.RunRequest]:
        yield from redrive_requests(
            pipeline_in(context, name),
            context.instance,
            partitions=batches.name,
            redrive_job=redrive.name,
            backfill_job=backfill.name,
            log=context.log.info,
        )

    return redrive_sensor
