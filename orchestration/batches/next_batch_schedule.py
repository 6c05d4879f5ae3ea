"""The `<pipeline>_schedule`: a micro-batch run whenever Kafka has something new.

The tick names the next batch (a dynamic partition) before the run plans it, so the run and
the batch share one id; ticks that would plan nothing are skipped with the reason, so the
partition history holds only real batches. Whether a batch is due is the coordinator's
decision (`next_batch`, the rule `begin` plans by), never the schedule's. Before deciding, a
tick abandons the batch of a run that died before the vote (orchestration/health/liveness.py), so
such a run never stops the pipeline (invariant 16).
"""

from collections.abc import Callable
from typing import Any

import dagster as dg

from jobs.wiring.pipeline import Pipeline
from orchestration.batches.partitions import add_batch_partition
from orchestration.health.liveness import abandon_dead_batches
from orchestration.names import dagster_name
from orchestration.resources import pipeline_in, pipeline_key
from orchestration.tags import BATCH_TAG
from resources.config.pipeline_config import PipelineConfig


def next_batch_request(
    pipeline: Pipeline,
    partitions: str,
    instance: dg.DagsterInstance,
    log: Callable[[str], None] = lambda _msg: None,
) -> dg.RunRequest | dg.SkipReason:
    """A run for the next batch's partition (added to `partitions` now), or why not.

    A live batch whose run died before the vote is abandoned first, so its ranges are the
    next batch's.
    """
    abandon_dead_batches(pipeline, instance, [pipeline.live], log)
    due = pipeline.live.next_batch()
    if due.in_flight is not None:
        return dg.SkipReason(
            f"batch {due.in_flight.batch_id} is {due.in_flight.state} (owner "
            f"{due.in_flight.owner}, still alive or within its lease, or a run of it is still "
            "running); it finishes, is re-driven or is abandoned before the next one is planned"
        )
    if due.batch_id is None:
        read = pipeline.config.kafka.topic or pipeline.config.kafka.selection().describe()
        return dg.SkipReason(f"{read}: caught up, nothing new to read")
    key = str(due.batch_id)
    add_batch_partition(instance, partitions, key)
    return dg.RunRequest(
        run_key=f"{pipeline.config.app_id}:{key}", partition_key=key, tags={BATCH_TAG: key}
    )


def build_next_batch_schedule(
    config: PipelineConfig,
    micro_batch: dg.JobDefinition,
    batches: dg.DynamicPartitionsDefinition,
) -> dg.ScheduleDefinition:
    name = config.pipeline

    @dg.schedule(
        name=f"{dagster_name(name)}_schedule",
        job=micro_batch,
        cron_schedule=config.schedule.cron,
        execution_timezone=config.schedule.timezone,
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description=f"A micro-batch of {name!r} when its topic has new records.",
        required_resource_keys={pipeline_key(name)},
    )
    def schedule(
        context: dg.ScheduleEvaluationContext, **_passed: Any
    ) -> dg.RunRequest | dg.SkipReason:
        return next_batch_request(
            pipeline_in(context, name), batches.name, context.instance, context.log.info
        )

    return schedule
