"""The `<pipeline>_run_failure_sensor`: an alert through the pipeline's sinks for every
failed run of its jobs, carrying the cause (each failed step's error line), not only the
step names.

A run whose request a protocol rule refused (REJECTED_TAG, orchestration/health/rejection.py) is
rejected input, not a failure of the system: it is logged on the tick and alerts nobody.

Built as a `RunStatusSensorDefinition` rather than with `@run_failure_sensor`, because only
the former can require a resource by a per-pipeline key (orchestration/resources.py).
"""

from collections.abc import Sequence
from typing import Any

import dagster as dg

from orchestration.names import dagster_name
from orchestration.resources import alerts_in, alerts_key
from orchestration.tags import BATCH_TAG, REJECTED_TAG
from resources.alerts.webhook import Alert
from resources.config.pipeline_config import PipelineConfig


def error_line(event: dg.DagsterEvent) -> str:
    """The cause of one step failure as one line: a `dg.Failure`'s description, else the
    message of the exception the op raised (not Dagster's wrapper around it)."""
    data = event.step_failure_data
    if data.user_failure_data is not None and data.user_failure_data.description:
        return data.user_failure_data.description
    error = data.error
    if error is None:
        return "no error recorded"
    if error.cls_name == "DagsterExecutionStepExecutionError" and error.cause is not None:
        error = error.cause
    lines = [line.strip() for line in error.message.splitlines() if line.strip()]
    return " ".join(lines) or error.cls_name or "no error message"


def build_run_failure_sensor(
    config: PipelineConfig, jobs: Sequence[dg.JobDefinition]
) -> dg.SensorDefinition:
    name = config.pipeline

    def run_failed(context: dg.RunStatusSensorContext, **_passed: Any) -> None:
        run = context.dagster_run
        failed = context.for_run_failure().get_step_failure_events()
        causes = {e.step_key or "run": error_line(e) for e in failed}
        if REJECTED_TAG in run.tags:
            context.log.info(
                f"run {run.run_id[:8]} of {run.job_name} was refused, not failed "
                f"(rejected input, no alert): {'; '.join(causes.values())}"
            )
            return
        summary = context.dagster_event.message if context.dagster_event else None
        text = "\n".join(f"{step}: {line}" for step, line in causes.items())
        alerts_in(context, name).send(
            Alert(
                kind="run_failed",
                pipeline=name,
                title=f"{name}: run {run.run_id[:8]} of {run.job_name} failed",
                text=text or summary or "unknown error",
                details={
                    "run_id": run.run_id,
                    "job": run.job_name,
                    "batch": run.tags.get(BATCH_TAG),
                    "errors": causes,
                },
            ),
            context.log.error,
        )

    return dg.RunStatusSensorDefinition(
        name=f"{dagster_name(name)}_run_failure_sensor",
        run_status=dg.DagsterRunStatus.FAILURE,
        run_status_sensor_fn=run_failed,
        monitored_jobs=list(jobs),
        default_status=dg.DefaultSensorStatus.STOPPED,
        description=(
            "Alerts through the pipeline's sinks, with each failed step's error line, when one "
            "of its runs fails; runs whose request a protocol rule refused alert nobody."
        ),
        required_resource_keys={alerts_key(name)},
    )
