"""The `<pipeline>_clean_schedule`: the clean job on the config's `clean.cron`.

Ships stopped, like every schedule here: deleting files is an operator's decision, and the
retention settings it relies on are in the README ("Cleaning and VACUUM").
"""

import dagster as dg

from orchestration.names import dagster_name
from resources.config.pipeline_config import PipelineConfig


def build_clean_schedule(config: PipelineConfig, clean: dg.JobDefinition) -> dg.ScheduleDefinition:
    return dg.ScheduleDefinition(
        name=f"{dagster_name(config.pipeline)}_clean_schedule",
        job=clean,
        cron_schedule=config.clean.cron,
        execution_timezone=config.schedule.timezone,
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description=(
            f"Delete {config.pipeline!r}'s staged orphans older than {config.clean.older_than}."
        ),
    )
