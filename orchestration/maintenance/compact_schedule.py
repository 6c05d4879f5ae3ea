"""The `<pipeline>_compact_schedule`: the compact job on the config's `compact.cron`.

Ships stopped, like every schedule here: rewriting a table's files is an operator's
decision, and the replaced files stay in storage until Delta's VACUUM (README, "Cleaning
and VACUUM").
"""

import dagster as dg

from orchestration.names import dagster_name
from resources.config.pipeline_config import PipelineConfig


def build_compact_schedule(
    config: PipelineConfig, compact: dg.JobDefinition
) -> dg.ScheduleDefinition:
    return dg.ScheduleDefinition(
        name=f"{dagster_name(config.pipeline)}_compact_schedule",
        job=compact,
        cron_schedule=config.compact.cron,
        execution_timezone=config.schedule.timezone,
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description=f"Merge {config.pipeline!r}'s small files in both tables.",
    )
