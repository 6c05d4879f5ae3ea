"""The schedule of one pipeline: a micro-batch run whenever Kafka has something new.

The tick names the next batch (a dynamic partition) before the run plans it, so the run and
the batch share one id; ticks that would plan nothing are skipped with the reason, so the
partition history holds only real batches.
"""

from __future__ import annotations

import dagster as dg

from ledger.protocol import IN_FLIGHT, plan_ranges, worth_planning
from orchestration.micro_batch import BATCH_TAG, PipelineJobs


def next_batch_request(
    jobs: PipelineJobs, instance: dg.DagsterInstance
) -> dg.RunRequest | dg.SkipReason:
    """What a tick should do now; shared by the schedule and the tests."""
    config = jobs.config
    tpc = jobs.coordinator()
    in_flight = tpc.store.batches(app_id=config.app_id, states=IN_FLIGHT, limit=1)
    if in_flight:
        batch = in_flight[0]
        return dg.SkipReason(
            f"batch {batch.batch_id} is {batch.state}; it finishes (or the re-drive sensor "
            "finishes it) before the next one is planned"
        )
    positions = tpc.store.positions(config.app_id)
    ranges = plan_ranges(
        config.kafka.topic,
        positions,
        tpc.source.available(),
        config.batch.max_records_per_partition,
        config.kafka.starting_offsets,
    )
    if not worth_planning(ranges, positions, config.kafka.starting_offsets):
        return dg.SkipReason(f"{config.kafka.topic}: caught up, nothing new to read")
    latest = tpc.store.batches(app_id=config.app_id, limit=1)
    next_id = (latest[0].batch_id if latest else 0) + 1
    instance.add_dynamic_partitions(jobs.batches.name, [str(next_id)])
    return dg.RunRequest(
        run_key=f"{config.app_id}:{next_id}",
        partition_key=str(next_id),
        tags={BATCH_TAG: str(next_id)},
    )


def build_schedule(jobs: PipelineJobs) -> dg.ScheduleDefinition:
    config = jobs.config

    @dg.schedule(
        name=f"{config.pipeline}_schedule",
        job=jobs.micro_batch,
        cron_schedule=config.schedule.cron,
        execution_timezone=config.schedule.timezone,
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description=f"A micro-batch of {config.pipeline!r} when its topic has new records.",
    )
    def schedule(context: dg.ScheduleEvaluationContext) -> dg.RunRequest | dg.SkipReason:
        return next_batch_request(jobs, context.instance)

    return schedule
