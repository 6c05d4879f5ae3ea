"""The `<pipeline>_checks_sensor`: evaluates the tables' asset checks
(orchestration/health/table_checks.py) on every tick, reports them on the assets, and tells a
person once when a check fails and once when it passes again.

The evaluations go to Dagster as the sensor's asset events, so a failing check is red on
the asset and in the lineage view without any run. The alerts follow the stuck sensor's
way (orchestration/health/stuck_sensor.py): the checks whose failure was sent are kept in the
sensor's cursor, and `decide_blocked` decides per check: one alert when it fails, one
"resolved" when it passes, nothing when it gives no verdict (Kafka unreachable, say). The
alert's key is the check's name, not its text, whose figures change every tick.

`no_stuck_batch` is red and green here but alerts nobody from here: it is the stuck
sensor's rule (orchestration/health/stuck_sensor.py `decide_stuck`), and that sensor already
alerts once per stuck batch, with what is at stake and who retries, and resolves once it
moves on. Alerting on the check as well would tell a person twice about one batch.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg

from orchestration.assets import derived_key, quarantine_key, table_key
from orchestration.health.stuck_sensor import decide_blocked
from orchestration.health.table_checks import (
    NO_STUCK_BATCH,
    Verdict,
    check_specs,
    lag_observations,
    verdicts,
)
from orchestration.names import dagster_name
from orchestration.resources import alerts_in, alerts_key, pipeline_key, resource_in
from resources.alerts.webhook import Alert, AlertsResource
from resources.config.pipeline_config import PipelineConfig


@dataclass(frozen=True)
class ChecksDecision:
    """The checks to alert on now, those to resolve, and the failures open after."""

    failed: list[Verdict]
    resolved: list[Verdict]
    open_after: list[str]


def decide_checks(
    open_failures: Sequence[str], checks: Sequence[str], found: Sequence[Verdict]
) -> ChecksDecision:
    """Pure: per check, `decide_blocked` with the check's name as the reason it is failing;
    a check without a verdict keeps its alert as it was."""
    by_check = {v.check: v for v in found}
    failed, resolved, still_open = [], [], []
    for check in checks:
        verdict = by_check.get(check)
        decision = decide_blocked(
            check if check in open_failures else None,
            None if verdict is None or verdict.passed else check,
            verdict is not None,
        )
        if decision.alert and verdict is not None:
            failed.append(verdict)
        if decision.resolve and verdict is not None:
            resolved.append(verdict)
        if decision.open_after is not None:
            still_open.append(check)
    return ChecksDecision(failed, resolved, still_open)


def loads(cursor: str | None) -> list[str]:
    return list(json.loads(cursor)["failing"]) if cursor else []


def dumps(open_failures: Sequence[str]) -> str:
    return json.dumps({"failing": list(open_failures)})


def evaluate_checks(
    config: PipelineConfig,
    found: Sequence[Verdict],
    alerts: AlertsResource,
    cursor: str | None,
    log: Callable[[str], None],
) -> tuple[ChecksDecision, str]:
    """Send the alerts the verdicts call for; return the decision and the new cursor."""
    checks = [spec.name for spec in check_specs(config) if spec.name != NO_STUCK_BATCH]
    decision = decide_checks(loads(cursor), checks, found)
    for verdict in decision.failed:
        alerts.send(_alert(config, verdict, "check_failed", "failed"), log)
    for verdict in decision.resolved:
        alerts.send(_alert(config, verdict, "resolved", "passes again"), log)
    return decision, dumps(decision.open_after)


def _alert(config: PipelineConfig, verdict: Verdict, kind: str, what: str) -> Alert:
    figures = {k: v for k, v in verdict.metadata.items() if isinstance(v, int | float)}
    return Alert(
        kind=kind,
        pipeline=config.pipeline,
        title=f"{config.pipeline}: check {verdict.check} on {verdict.asset.to_user_string()} "
        f"{what}",
        text=verdict.text,
        details={"check": verdict.check, "asset": verdict.asset.to_user_string(), **figures},
    )


def checked_keys(config: PipelineConfig) -> list[dg.AssetKey]:
    """The assets whose checks the sensor evaluates: the table, the quarantine, each derived
    output."""
    name = config.pipeline
    derived = [derived_key(name, output.name) for output in config.derived]
    return [table_key(name), quarantine_key(name), *derived]


def build_checks_sensor(config: PipelineConfig) -> dg.SensorDefinition:
    name = config.pipeline

    @dg.sensor(
        name=f"{dagster_name(name)}_checks_sensor",
        minimum_interval_seconds=config.schedule.sensor_interval(60),
        default_status=dg.DefaultSensorStatus.STOPPED,
        description=(
            "Evaluates the asset checks of the pipeline's table, quarantine and derived outputs, "
            "shows them on the assets, and alerts once when a check fails and once when it "
            "passes again; a stuck batch is alerted by "
            f"{dagster_name(name)}_stuck_prepared_sensor, batch by batch."
        ),
        # shown as the automation of the assets it keeps (it launches no run)
        asset_selection=dg.AssetSelection.assets(*checked_keys(config)),
        required_resource_keys={pipeline_key(name), alerts_key(name)},
    )
    def checks(context: dg.SensorEvaluationContext, **_passed: Any) -> dg.SensorResult:
        log = context.log.warning
        found = verdicts(resource_in(context, name), log, context.instance)
        alerts = alerts_in(context, name)
        decision, cursor = evaluate_checks(config, found, alerts, context.cursor, log)
        failing = sorted(v.check for v in found if not v.passed)
        return dg.SensorResult(
            asset_events=[*(v.evaluation() for v in found), *lag_observations(name, found)],
            cursor=cursor,
            skip_reason=(
                f"{len(found) - len(failing)} checks passed, failed: {', '.join(failing) or '-'}; "
                f"{len(decision.failed)} alerted, {len(decision.resolved)} resolved"
            ),
        )

    return checks
