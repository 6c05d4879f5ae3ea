"""The Dagster resources of a pipeline: its edges (`<pipeline>_pipeline`) and its alert sinks
(`<pipeline>_alerts`), declared once per pipeline in the code location's Definitions
(orchestration/pipeline_definitions.py) and shown in the UI's resources view.

The keys are per pipeline because one code location serves every config of a folder. Dagster
injects a resource into a parameter named after its key, which a per-pipeline key cannot be,
so every op, schedule and sensor names its keys as required resource keys and reads them from
its context (`pipeline_in`, `alerts_in`). When a schedule or sensor is called directly (as
the tests do), Dagster also passes them as keyword arguments, which those functions ignore.

`PipelineResource` holds only the config file's path, so the UI shows where the pipeline is
described and never a Kafka or object-store option (those may hold credentials). The
`Pipeline` it opens is kept for the life of the process: a code server's schedule ticks and
sensor evaluations, and a run's ops, share one ledger engine, one Kafka client and one Spark
session instead of opening new ones every time.
"""

from __future__ import annotations

import atexit
import threading
from typing import Any

import dagster as dg
from pydantic import Field

from jobs.wiring.pipeline import Pipeline
from ledger.core.errors import with_config
from orchestration.names import dagster_name
from resources.alerts.webhook import AlertsResource
from resources.config.loading import load_config
from resources.config.pipeline_config import PipelineConfig
from resources.config.sections import AlertSettings

_open: dict[str, Pipeline] = {}
_open_lock = threading.Lock()


def pipeline_key(pipeline: str) -> str:
    return f"{dagster_name(pipeline)}_pipeline"


def alerts_key(pipeline: str) -> str:
    return f"{dagster_name(pipeline)}_alerts"


class PipelineResource(dg.ConfigurableResource):
    """One pipeline config file, and the process's `Pipeline` opened from it."""

    config_path: str = Field(description="the pipeline's config file (YAML)")

    def config(self) -> PipelineConfig:
        return load_config(self.config_path)

    def pipeline(self) -> Pipeline:
        """The process's Pipeline of this config file, opened on first use.

        The file is read then; a changed file takes effect in a new process (a code location
        reload starts one, and every run worker is one).
        """
        with _open_lock:
            found = _open.get(self.config_path)
            if found is None:
                found = _open[self.config_path] = Pipeline(self.config())
            return found

    def spell(self, text: str) -> str:
        """`text` as Dagster shows it: the commands it names (ledger.core.errors.CONFIG_PLACEHOLDER)
        spelled for this config file, as the CLI spells them for the file it was given."""
        return with_config(text, self.config_path)

    def close(self) -> None:
        """Close the process's Pipeline of this file, if open; the next use opens it again."""
        with _open_lock:
            found = _open.pop(self.config_path, None)
        if found is not None:
            found.close()


def alerts_resource(settings: AlertSettings, config_path: str) -> AlertsResource:
    """The sinks a pipeline config names (environment variable names only, never secrets),
    and the config file the commands in its alerts name."""
    return AlertsResource(
        webhook_url_env=settings.webhook_url_env,
        slack_token_env=settings.slack_token_env,
        slack_channel=settings.slack_channel,
        slack_api_url=settings.slack_api_url,
        config_path=config_path,
    )


def resource_in(context: Any, pipeline: str) -> PipelineResource:
    """The resource of `pipeline`, from an op, schedule or sensor context that requires it."""
    resource: PipelineResource = getattr(context.resources, pipeline_key(pipeline))
    return resource


def pipeline_in(context: Any, pipeline: str) -> Pipeline:
    """The Pipeline of `pipeline`, from an op, schedule or sensor context that requires it."""
    return resource_in(context, pipeline).pipeline()


def alerts_in(context: Any, pipeline: str) -> AlertsResource:
    """The alert sinks of `pipeline`, from a sensor context that requires them."""
    alerts: AlertsResource = getattr(context.resources, alerts_key(pipeline))
    return alerts


@atexit.register
def _close_all() -> None:
    """Dispose of every Pipeline the process opened (ledger engines, Kafka clients)."""
    with _open_lock:
        pipelines = list(_open.values())
        _open.clear()
    for pipeline in pipelines:
        pipeline.close()
