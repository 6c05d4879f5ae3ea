"""The `<pipeline>_stuck_prepared_sensor`: a person hears of a batch that stops moving, once,
and hears again when it moves on; and of a consumer group that keeps refusing acks.

Invariant 16 (docs/protocol.md): a pipeline never stops without telling anyone. Every batch
in a state that is not final (PLANNED, STAGED, PREPARED, COMMITTED) for longer than
`alerts.stuck_after_seconds` alerts once; when it leaves that state, a "resolved" follows.
A PREPARED batch must be published before Kafka retention deletes its offsets; a PLANNED or
STAGED one is normally abandoned by the schedule once its run died, so one that stays means
its run still looks alive; a COMMITTED one is complete but its consumer group was not moved.
A COMMITTED batch whose ack was *refused* alerts through the ack alert instead (otherwise a
group that refuses every ack would raise one alert per batch): once
`alerts.ack_failures_before_alert` acks in a row were refused, one alert, and one "resolved"
when an ack succeeds again.

Ages are measured by the ledger database's clock (invariant 17): "now" is the database's,
and so is every timestamp it is compared with. What to say is decided by pure functions
(`decide_stuck` in ledger/core/stuck.py, `decide_ack`) over the sensor's cursor, the alerts
still open.

The sensor keeps the name it had when it watched PREPARED batches only: Dagster keys a
sensor's running status and cursor by its name, so a new name would silently stop it and
forget its open alerts.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import dagster as dg

from jobs.wiring.pipeline import Pipeline
from ledger.core.backfill import backfill_app_id
from ledger.core.batch import Batch, BatchKind
from ledger.core.errors import TopicChangedError
from ledger.core.protocol import IN_FLIGHT, BatchState
from ledger.core.stuck import (
    StuckDecision,
    decide_stuck,
    in_state_since,
)
from orchestration.assets import table_key
from orchestration.health.holder import Holder, holder_of, run_url, stuck_text
from orchestration.names import dagster_name
from orchestration.resources import alerts_in, alerts_key, pipeline_in, pipeline_key
from resources.alerts.webhook import Alert, AlertsResource
from resources.config.pipeline_config import PipelineConfig

S = BatchState


@dataclass(frozen=True)
class AckDecision:
    """Whether to raise or resolve the consumer-group alert, and whether it is open after."""

    alert: bool
    resolve: bool
    open_after: bool


def decide_ack(was_open: bool, refused_in_a_row: int, threshold: int) -> AckDecision:
    """Pure: one alert once `threshold` acks in a row were refused; one "resolved" once an
    ack succeeds (a success acks every committed batch, so none is left refused)."""
    if not was_open and refused_in_a_row >= threshold:
        return AckDecision(alert=True, resolve=False, open_after=True)
    if was_open and refused_in_a_row == 0:
        return AckDecision(alert=False, resolve=True, open_after=False)
    return AckDecision(alert=False, resolve=False, open_after=was_open)


@dataclass(frozen=True)
class BlockedDecision:
    """Whether to raise or resolve the alert of a pipeline nothing can be planned for."""

    alert: bool
    resolve: bool
    #: the reason of the alert open after this evaluation, if any
    open_after: str | None


def decide_blocked(was_open: str | None, reason: str | None, known: bool) -> BlockedDecision:
    """Pure: one alert when the pipeline is blocked for a reason only an operator can lift
    (a re-created or re-pointed topic, invariant 10), again if the reason changes; one
    "resolved" once it is not blocked any more. `known` is False when the check could not
    tell (the broker was unreachable): nothing changes then."""
    if not known:
        return BlockedDecision(alert=False, resolve=False, open_after=was_open)
    if reason is not None:
        return BlockedDecision(alert=reason != was_open, resolve=False, open_after=reason)
    return BlockedDecision(alert=False, resolve=was_open is not None, open_after=None)


@dataclass(frozen=True)
class Cursor:
    """The sensor's memory between evaluations: the alerts it sent that are still open."""

    stuck: dict[str, str] = field(default_factory=dict)
    ack_alert_open: bool = False
    blocked: str | None = None

    def dumps(self) -> str:
        return json.dumps(
            {"stuck": self.stuck, "ack_alert_open": self.ack_alert_open, "blocked": self.blocked}
        )

    @classmethod
    def loads(cls, text: str | None) -> Cursor:
        """Also reads the cursor of the sensor's earlier version: a list of the keys of
        batches alerted as stuck in PREPARED."""
        if not text:
            return cls()
        data = json.loads(text)
        if isinstance(data, list):
            return cls({str(key): str(S.PREPARED) for key in data})
        return cls(
            dict(data.get("stuck", {})),
            bool(data.get("ack_alert_open", False)),
            data.get("blocked"),
        )


@dataclass(frozen=True)
class Evaluation:
    """One evaluation's decisions (what was sent), for the sensor's skip message."""

    stuck: StuckDecision
    ack: AckDecision
    blocked: BlockedDecision


def evaluate_stuck(
    pipeline: Pipeline, alerts: AlertsResource, cursor: str | None, log: Callable[[str], None]
) -> tuple[StuckDecision, str]:
    """One evaluation: send the alerts it decides, return the stuck decision and the new
    cursor."""
    evaluation, new_cursor = evaluate(pipeline, alerts, cursor, log)
    return evaluation.stuck, new_cursor


def evaluate(
    pipeline: Pipeline,
    alerts: AlertsResource,
    cursor: str | None,
    log: Callable[[str], None],
    instance: dg.DagsterInstance | None = None,
) -> tuple[Evaluation, str]:
    """One evaluation of both alerts: send what it decides, return it and the new cursor.
    `instance`: the Dagster instance whose runs may hold a stuck batch (none: not asked)."""
    config = pipeline.config
    store = pipeline.store
    memory = Cursor.loads(cursor)
    current = {}
    for key in memory.stuck:
        app_id, _, batch_id = key.rpartition("/")
        current[key] = store.get(app_id, int(batch_id))
    candidates = [
        *store.batches(app_id=config.app_id, states=IN_FLIGHT),
        *store.batches(app_id=backfill_app_id(config.pipeline), states=IN_FLIGHT),
    ]
    now = store.now()
    stuck = decide_stuck(memory.stuck, candidates, current, now, config.alerts.stuck_after_seconds)
    for batch in stuck.stuck:
        alerts.send(_stuck_alert(config, batch, now, holder_of(pipeline, batch, instance)), log)
    for batch, alerted in stuck.resolved:
        alerts.send(_resolved_alert(batch, alerted), log)

    refused = pipeline.live.refused_acks()
    in_a_row = sum(int(b.metrics.get("ack_failures", 0)) for b in refused)
    ack = decide_ack(memory.ack_alert_open, in_a_row, config.alerts.ack_failures_before_alert)
    if ack.alert:
        alerts.send(_ack_alert(config, refused, in_a_row), log)
    if ack.resolve:
        alerts.send(_ack_resolved_alert(config), log)

    live_in_flight = any(b.app_id == config.app_id for b in candidates)
    reason, known = (None, False) if live_in_flight else _blocked_reason(pipeline, log)
    blocked = decide_blocked(memory.blocked, reason, known)
    if blocked.alert and reason is not None:
        alerts.send(_blocked_alert(config, reason), log)
    if blocked.resolve:
        alerts.send(_blocked_resolved_alert(config), log)
    cursor_after = Cursor(stuck.open_after, ack.open_after, blocked.open_after)
    return Evaluation(stuck, ack, blocked), cursor_after.dumps()


def _blocked_reason(pipeline: Pipeline, log: Callable[[str], None]) -> tuple[str | None, bool]:
    """(why nothing can be planned, whether the check could tell). Only reasons an operator
    must act on count: a topic whose identity changed (invariant 10) stops the schedule's
    every tick with the same error, and no batch is in flight for the stuck alert to see.
    Asked only while no live batch is in flight: one that is holds planning up itself, and
    the stuck alert speaks for it."""
    try:
        pipeline.live.check_topic()
    except TopicChangedError as exc:
        return str(exc), True
    except Exception as exc:  # the broker is unreachable, say: the run that needs it fails
        log(f"could not check the topic's identity: {exc}")
        return None, False
    return None, True


def _minutes(now: datetime, since: datetime | None) -> float:
    return (now - since).total_seconds() / 60 if since is not None else 0.0


def _stuck_alert(config: PipelineConfig, batch: Batch, now: datetime, holder: Holder) -> Alert:
    state = str(batch.state)
    minutes = _minutes(now, in_state_since(batch))
    url = config.alerts.dagster_url
    heard = _minutes(now, batch.heartbeat_at)
    text = stuck_text(config.pipeline, batch, minutes, heard, holder, url)
    held: dict[str, Any] = {"owner": str(batch.owner), "owner_alive": holder.owner_alive}
    if holder.runs:
        held |= {"run_id": holder.runs[0], "run_url": run_url(url, holder.runs[0])}
    return _batch_alert(f"stuck_{state.lower()}", f"stuck in {state}", text, batch, held)


def _resolved_alert(batch: Batch, alerted: BatchState) -> Alert:
    if batch.state is S.ABORTED:
        what = "abandoned"
    elif alerted is S.COMMITTED:
        what = "acked"
    elif batch.state in (S.COMMITTED, S.ACKED):
        what = "committed"
    else:
        what = f"moved on to {batch.state}"
    text = f"batch {batch.batch_id} is {batch.state} now (attempt {batch.attempt})."
    if batch.state is S.ABORTED:
        text += " The next batch reads its ranges again."
    return _batch_alert("resolved", what, text, batch)


def _ack_alert(config: PipelineConfig, refused: list[Batch], in_a_row: int) -> Alert:
    group = config.group_id
    last = refused[-1].metrics.get("ack_error", "") if refused else ""
    ids = [b.batch_id for b in refused]
    return Alert(
        kind="ack_failing",
        pipeline=config.pipeline,
        title=f"{config.pipeline}: consumer group {group} refused {in_a_row} acks in a row",
        text=(
            f"the last {in_a_row} acks of consumer group {group} on "
            f"{config.kafka.selection().describe()} "
            f"were refused (last: {last}). Batches {', '.join(map(str, ids))} are committed "
            "and complete, and the next batches still run: exactly never reads the group. "
            "Only lag tools, which do, show it behind. A group with active members (a "
            "consumer using the same group.id) or a missing ACL (Write on the group) refuses "
            "the commit; the next ack that succeeds moves the group to the newest committed "
            "batch."
        ),
        details={
            "group_id": group,
            "refused_in_a_row": in_a_row,
            "batch_ids": ids,
            "last_error": last,
        },
    )


def _blocked_alert(config: PipelineConfig, reason: str) -> Alert:
    return Alert(
        kind="blocked",
        pipeline=config.pipeline,
        title=f"{config.pipeline}: nothing can be planned until an operator decides",
        text=f"{reason}. Every schedule tick fails with this until then; no record is read.",
        details={"topic": config.kafka.topic or config.kafka.selection().describe()},
    )


def _blocked_resolved_alert(config: PipelineConfig) -> Alert:
    return Alert(
        kind="resolved",
        pipeline=config.pipeline,
        title=f"{config.pipeline}: batches can be planned again",
        text=f"{config.kafka.selection().describe()}: the positions belong to the topics' "
        "incarnations again (a decision was recorded): the schedule plans the next batch."
        if config.kafka.topic is None
        else f"topic {config.kafka.topic} is the incarnation the positions belong to again "
        "(a decision was recorded): the schedule plans the next batch.",
        details={"topic": config.kafka.topic or config.kafka.selection().describe()},
    )


def _ack_resolved_alert(config: PipelineConfig) -> Alert:
    group = config.group_id
    return Alert(
        kind="resolved",
        pipeline=config.pipeline,
        title=f"{config.pipeline}: consumer group {group} acked again",
        text=f"an ack of consumer group {group} succeeded: it points at the newest committed "
        "batch again.",
        details={"group_id": group},
    )


def _batch_alert(
    kind: str, what: str, text: str, batch: Batch, extra: Mapping[str, Any] | None = None
) -> Alert:
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
            **(extra or {}),
        },
    )


def build_stuck_sensor(config: PipelineConfig) -> dg.SensorDefinition:
    name = config.pipeline

    @dg.sensor(
        name=f"{dagster_name(name)}_stuck_prepared_sensor",
        minimum_interval_seconds=config.schedule.sensor_interval(30),
        default_status=dg.DefaultSensorStatus.STOPPED,
        description=(
            f"Alerts once per batch PLANNED, STAGED, PREPARED or COMMITTED for over "
            f"{config.alerts.stuck_after_seconds:g}s, and again when it moves on; and once "
            f"when {config.alerts.ack_failures_before_alert} consumer-group acks in a row "
            "were refused, and again when one succeeds; and once when a changed topic blocks "
            "planning until an operator decides, and again when it does."
        ),
        # shown as the automation of the assets it keeps (it launches no run)
        asset_selection=dg.AssetSelection.assets(table_key(name)),
        required_resource_keys={pipeline_key(name), alerts_key(name)},
    )
    def stuck(context: dg.SensorEvaluationContext, **_passed: Any) -> dg.SkipReason:
        evaluation, cursor = evaluate(
            pipeline_in(context, name),
            alerts_in(context, name),
            context.cursor,
            context.log.warning,
            context.instance,
        )
        context.update_cursor(cursor)
        decision = evaluation.stuck
        return dg.SkipReason(
            f"{len(decision.stuck)} new stuck, {len(decision.resolved)} resolved, "
            f"{len(decision.open_after)} open; ack alert "
            f"{'open' if evaluation.ack.open_after else 'closed'}; "
            f"{'blocked' if evaluation.blocked.open_after else 'not blocked'}"
        )

    return stuck
