"""Sensors of one pipeline: re-drive voted batches, alert on stuck ones, alert on failures.

"Commit must eventually succeed, or data is lost" (protocol.md): a batch that voted and
whose run died is re-driven by a commit-only run; one that stays PREPARED too long reaches a
person, once, and a resolved message follows when it commits.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime

import dagster as dg

from ledger.batch import Batch, BatchKind, utcnow
from ledger.protocol import BatchState
from orchestration.micro_batch import BATCH_TAG, PIPELINE_TAG, PipelineJobs
from resources.alerts import Alert, AlertsResource

_ALIVE = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


def alerts_for(jobs: PipelineJobs) -> AlertsResource:
    settings = jobs.config.alerts
    return AlertsResource(
        webhook_url_env=settings.webhook_url_env,
        slack_token_env=settings.slack_token_env,
        slack_channel=settings.slack_channel,
        slack_api_url=settings.slack_api_url,
    )


def _run_alive(instance: dg.DagsterInstance, pipeline_tag: str, batch_tag: str) -> bool:
    runs = instance.get_runs(
        dg.RunsFilter(tags={PIPELINE_TAG: pipeline_tag, BATCH_TAG: batch_tag}, statuses=_ALIVE),
        limit=1,
    )
    return bool(runs)


VOTED = [BatchState.PREPARED, BatchState.COMMITTED]


def redrive_requests(jobs: PipelineJobs, instance: dg.DagsterInstance) -> Iterator[dg.RunRequest]:
    """A commit-only run for every voted batch nobody is finishing.

    Live batches get a re-drive run of their partition; backfill batches a backfill run
    without ranges, which only recovers. The run key is (batch, attempt): an attempt is
    re-driven once; if that run dies too, its takeover raised the attempt and the next
    evaluation may launch again.
    """
    pipeline = jobs.config.pipeline
    tpc = jobs.coordinator()
    for batch in sorted(tpc.store.batches(app_id=tpc.app_id, states=VOTED), key=_id):
        if _run_alive(instance, pipeline, str(batch.batch_id)) or tpc.may_be_alive(batch):
            continue
        key = str(batch.batch_id)
        if not instance.has_dynamic_partition(jobs.batches.name, key):
            instance.add_dynamic_partitions(jobs.batches.name, [key])
        yield dg.RunRequest(
            run_key=f"{batch.app_id}:{batch.batch_id}:{batch.attempt}",
            job_name=jobs.redrive.name,
            partition_key=key,
            tags={BATCH_TAG: key},
        )
    backfills = jobs.backfill_coordinator()
    for batch in sorted(backfills.store.batches(app_id=backfills.app_id, states=VOTED), key=_id):
        label = f"{batch.app_id}/{batch.batch_id}"
        if _run_alive(instance, f"{pipeline}.backfill", label) or backfills.may_be_alive(batch):
            continue
        yield dg.RunRequest(
            run_key=f"{batch.app_id}:{batch.batch_id}:{batch.attempt}",
            job_name=jobs.backfill.name,
            tags={BATCH_TAG: label},
        )


def _id(batch: Batch) -> int:
    return batch.batch_id


@dataclass(frozen=True)
class StuckDecision:
    """What the stuck-prepared sensor must say now, and the batches it is watching after."""

    stuck: list[Batch]
    resolved: list[Batch]
    open_after: list[str]


def decide_stuck(
    open_keys: Iterable[str],
    prepared: Iterable[Batch],
    current: dict[str, Batch | None],
    now: datetime,
    threshold_s: float,
) -> StuckDecision:
    """Pure: alert once per stuck batch; resolve once it is past PREPARED.

    `open_keys` are the batches already alerted (the sensor's cursor); `current` maps each of
    them to its row now (None if it vanished).
    """
    open_set = set(open_keys)
    stuck = [
        b
        for b in prepared
        if b.prepared_at is not None
        and (now - b.prepared_at).total_seconds() >= threshold_s
        and f"{b.app_id}/{b.batch_id}" not in open_set
    ]
    resolved = []
    still_open = set(open_set)
    for key in sorted(open_set):
        row = current.get(key)
        if row is None or row.state is not BatchState.PREPARED:
            still_open.discard(key)
            if row is not None:
                resolved.append(row)
    still_open |= {f"{b.app_id}/{b.batch_id}" for b in stuck}
    return StuckDecision(stuck, resolved, sorted(still_open))


def evaluate_stuck(
    jobs: PipelineJobs, cursor: str | None, log: Callable[[str], None]
) -> tuple[StuckDecision, str]:
    """One evaluation: send the alerts it decides, return the decision and the new cursor."""
    config = jobs.config
    store = jobs.coordinator().store
    open_keys = json.loads(cursor) if cursor else []
    current = {}
    for key in open_keys:
        app_id, _, batch_id = key.rpartition("/")
        current[key] = store.get(app_id, int(batch_id))
    prepared = [
        *store.batches(app_id=config.app_id, states=[BatchState.PREPARED]),
        *store.batches(app_id=jobs.backfill_coordinator().app_id, states=[BatchState.PREPARED]),
    ]
    decision = decide_stuck(
        open_keys,
        prepared,
        current,
        utcnow(),
        config.alerts.stuck_prepared_after_seconds,
    )
    alerts = alerts_for(jobs)
    for batch in decision.stuck:
        minutes = (utcnow() - batch.prepared_at).total_seconds() / 60 if batch.prepared_at else 0
        text = (
            f"batch {batch.batch_id} (attempt {batch.attempt}) voted {minutes:.1f} min ago "
            f"and is not committed; its ranges {' '.join(map(str, batch.ranges))} must be "
            "published before Kafka retention deletes them. The re-drive sensor retries; "
            f"see `exactly ledger -c <config>` and the {config.pipeline}_redrive runs."
        )
        alerts.send(_batch_alert("stuck_prepared", "stuck in PREPARED", text, batch), log)
    for batch in decision.resolved:
        text = f"batch {batch.batch_id} is {batch.state} now (attempt {batch.attempt})."
        alerts.send(_batch_alert("resolved", "committed", text, batch), log)
    return decision, json.dumps(decision.open_after)


def _batch_alert(kind: str, what: str, text: str, batch: Batch) -> Alert:
    label = (
        str(batch.batch_id) if batch.kind == BatchKind.LIVE else f"{batch.app_id}/{batch.batch_id}"
    )
    return Alert(
        kind=kind,
        pipeline=batch.pipeline,
        title=f"{batch.pipeline}: batch {label} {what}",
        text=text,
        details={
            "batch_id": batch.batch_id,
            "attempt": batch.attempt,
            "state": str(batch.state),
            "app_id": batch.app_id,
        },
    )


def build_sensors(jobs: PipelineJobs) -> list[dg.SensorDefinition]:
    name = jobs.config.pipeline

    @dg.sensor(
        name=f"{name}_redrive_sensor",
        jobs=[jobs.redrive, jobs.backfill],
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description=(
            "Launches a commit-only run for every PREPARED or COMMITTED batch whose run died."
        ),
    )
    def redrive(context: dg.SensorEvaluationContext) -> Iterator[dg.RunRequest]:
        yield from redrive_requests(jobs, context.instance)

    @dg.sensor(
        name=f"{name}_stuck_prepared_sensor",
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description=(
            f"Alerts once per batch PREPARED for over "
            f"{jobs.config.alerts.stuck_prepared_after_seconds:g}s, and again when it commits."
        ),
    )
    def stuck(context: dg.SensorEvaluationContext) -> dg.SkipReason:
        decision, cursor = evaluate_stuck(jobs, context.cursor, context.log.warning)
        context.update_cursor(cursor)
        return dg.SkipReason(
            f"{len(decision.stuck)} new stuck, {len(decision.resolved)} resolved, "
            f"{len(decision.open_after)} open"
        )

    @dg.run_failure_sensor(
        name=f"{name}_run_failure_sensor",
        monitored_jobs=[jobs.micro_batch, jobs.redrive, jobs.backfill],
        default_status=dg.DefaultSensorStatus.STOPPED,
        description="Alerts through the pipeline's sinks when one of its runs fails.",
    )
    def run_failed(context: dg.RunFailureSensorContext) -> None:
        run = context.dagster_run
        error = context.failure_event.message if context.failure_event else "unknown error"
        alerts_for(jobs).send(
            Alert(
                kind="run_failed",
                pipeline=name,
                title=f"{name}: run {run.run_id[:8]} of {run.job_name} failed",
                text=error or "",
                details={
                    "run_id": run.run_id,
                    "job": run.job_name,
                    "batch": run.tags.get(BATCH_TAG),
                },
            ),
            context.log.error,
        )

    return [redrive, stuck, run_failed]
