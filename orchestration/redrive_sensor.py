"""The `<pipeline>_redrive_sensor`: a commit-only run for every voted batch whose run died.

"Commit must eventually succeed, or data is lost" (protocol.md). Live batches get a
`<pipeline>_redrive` run of their partition; backfill batches a `<pipeline>_backfill` run
without ranges, which only recovers. The run key is (batch, attempt): an attempt is re-driven
once; if that run dies too, its takeover raised the attempt and a later evaluation may launch
again.
"""

from collections.abc import Iterator
from typing import Any

import dagster as dg

from jobs.pipeline import Pipeline
from ledger.batch import Batch
from ledger.protocol import IN_FLIGHT, MUST_FINISH
from ledger.two_phase import TwoPhaseCommit
from orchestration.resources import pipeline_in, pipeline_key
from orchestration.tags import BATCH_TAG, PIPELINE_TAG
from resources.config import PipelineConfig

_ALIVE = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


def _run_alive(instance: dg.DagsterInstance, pipeline_tag: str, batch_tag: str) -> bool:
    runs = instance.get_runs(
        dg.RunsFilter(tags={PIPELINE_TAG: pipeline_tag, BATCH_TAG: batch_tag}, statuses=_ALIVE),
        limit=1,
    )
    return bool(runs)


def _unattended(coordinator: TwoPhaseCommit) -> list[Batch]:
    """The coordinator's voted batches whose attempt cannot be alive any more, oldest first:
    PREPARED or COMMITTED, or sent back to be staged again (invariant 11), which the
    schedule would otherwise wait for forever as a batch in flight."""
    found = coordinator.store.batches(app_id=coordinator.app_id, states=IN_FLIGHT)
    voted = [b for b in found if b.state in MUST_FINISH or b.voted_once]
    return [b for b in sorted(voted, key=lambda b: b.batch_id) if not coordinator.may_be_alive(b)]


def redrive_requests(
    pipeline: Pipeline,
    instance: dg.DagsterInstance,
    *,
    partitions: str,
    redrive_job: str,
    backfill_job: str,
) -> Iterator[dg.RunRequest]:
    """A commit-only run for every voted batch nobody is finishing."""
    name = pipeline.config.pipeline
    for batch in _unattended(pipeline.live):
        key = str(batch.batch_id)
        if _run_alive(instance, name, key):
            continue
        if not instance.has_dynamic_partition(partitions, key):
            instance.add_dynamic_partitions(partitions, [key])
        yield dg.RunRequest(
            run_key=f"{batch.app_id}:{batch.batch_id}:{batch.attempt}",
            job_name=redrive_job,
            partition_key=key,
            tags={BATCH_TAG: key},
        )
    for batch in _unattended(pipeline.backfill()):
        label = f"{batch.app_id}/{batch.batch_id}"
        if _run_alive(instance, f"{name}.backfill", label):
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
        name=f"{name}_redrive_sensor",
        jobs=[redrive, backfill],
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description=(
            "Launches a re-drive run for every PREPARED or COMMITTED batch whose run died, "
            "and for every batch being staged again after its vote lost files."
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
        )

    return redrive_sensor
