"""The Dagster code location: every pipeline config's jobs, schedule, sensors and table
asset, assembled in one place."""

from __future__ import annotations

import dagster as dg

from orchestration.micro_batch import build_pipeline_jobs
from orchestration.pipelines import load_pipelines
from orchestration.schedules import build_schedule
from orchestration.sensors import build_sensors


def build_definitions() -> dg.Definitions:
    jobs, schedules, sensors, assets = [], [], [], []
    for config in load_pipelines():
        pipeline = build_pipeline_jobs(config)
        jobs += [pipeline.micro_batch, pipeline.redrive, pipeline.backfill]
        schedules.append(build_schedule(pipeline))
        sensors += build_sensors(pipeline)
        assets.append(pipeline.table)
    return dg.Definitions(jobs=jobs, schedules=schedules, sensors=sensors, assets=assets)


defs = build_definitions()
