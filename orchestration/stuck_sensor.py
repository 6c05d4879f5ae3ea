"""The `<pipeline>_stuck_prepared_sensor`: a person hears of a batch that voted and stays
uncommitted, once, and hears again when it commits.

A PREPARED batch must be published before Kafka retention deletes its offsets (protocol.md);
the re-drive sensor retries on its own, this sensor says when that is not enough. Which
batches to alert on is decided by a pure function (`decide_stuck`) over the sensor's cursor,
the batches already alerted.
"""

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import dagster as dg

from jobs.pipeline import Pipeline
from ledger.backfill import backfill_app_id
from ledger.batch import Batch, BatchKind
from ledger.protocol import BatchState
from orchestration.resources import alerts_in, alerts_key, pipeline_in, pipeline_key
from resources.alerts import Alert, AlertsResource
from resources.config import PipelineConfig


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
    pipeline: Pipeline, alerts: AlertsResource, cursor: str | None, log: Callable[[str], None]
) -> tuple[StuckDecision, str]:
    """One evaluation: send the alerts it decides, return the decision and the new cursor."""
    config = pipeline.config
    store = pipeline.store
    open_keys = json.loads(cursor) if cursor else []
    current = {}
    for key in open_keys:
        app_id, _, batch_id = key.rpartition("/")
        current[key] = store.get(app_id, int(batch_id))
    prepared = [
        *store.batches(app_id=config.app_id, states=[BatchState.PREPARED]),
        *store.batches(app_id=backfill_app_id(config.pipeline), states=[BatchState.PREPARED]),
    ]
    now = store.now()  # ages by the database's clock, as prepared_at is (invariant 17)
    decision = decide_stuck(
        open_keys,
        prepared,
        current,
        now,
        config.alerts.stuck_prepared_after_seconds,
    )
    for batch in decision.stuck:
        minutes = (now - batch.prepared_at).total_seconds() / 60 if batch.prepared_at else 0
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
    live = batch.kind == BatchKind.LIVE
    label = str(batch.batch_id) if live else f"{batch.app_id}/{batch.batch_id}"
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


def build_stuck_sensor(config: PipelineConfig) -> dg.SensorDefinition:
    name = config.pipeline

    @dg.sensor(
        name=f"{name}_stuck_prepared_sensor",
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description=(
            f"Alerts once per batch PREPARED for over "
            f"{config.alerts.stuck_prepared_after_seconds:g}s, and again when it commits."
        ),
        required_resource_keys={pipeline_key(name), alerts_key(name)},
    )
    def stuck(context: dg.SensorEvaluationContext, **_passed: Any) -> dg.SkipReason:
        decision, cursor = evaluate_stuck(
            pipeline_in(context, name),
            alerts_in(context, name),
            context.cursor,
            context.log.warning,
        )
        context.update_cursor(cursor)
        return dg.SkipReason(
            f"{len(decision.stuck)} new stuck, {len(decision.resolved)} resolved, "
            f"{len(decision.open_after)} open"
        )

    return stuck
