"""The `<pipeline>_run_failure_sensor`: an alert through the pipeline's sinks for every
failed run of its jobs.

Built as a `RunStatusSensorDefinition` rather than with `@run_failure_sensor`, because only
the former can require a resource by a per-pipeline key (orchestration/resources.py).
"""

from collections.abc import Sequence
from typing import Any

import dagster as dg

from orchestration.resources import alerts_in, alerts_key
from orchestration.tags import BATCH_TAG
from resources.alerts import Alert
from resources.config import PipelineConfig


def build_run_failure_sensor(
    config: PipelineConfig, jobs: Sequence[dg.JobDefinition]
) -> dg.SensorDefinition:
    name = config.pipeline

    def run_failed(context: dg.RunStatusSensorContext, **_passed: Any) -> None:
        run = context.dagster_run
        error = context.dagster_event.message if context.dagster_event else "unknown error"
        alerts_in(context, name).send(
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

    return dg.RunStatusSensorDefinition(
        name=f"{name}_run_failure_sensor",
        run_status=dg.DagsterRunStatus.FAILURE,
        run_status_sensor_fn=run_failed,
        monitored_jobs=list(jobs),
        default_status=dg.DefaultSensorStatus.STOPPED,
        description="Alerts through the pipeline's sinks when one of its runs fails.",
        required_resource_keys={alerts_key(name)},
    )
