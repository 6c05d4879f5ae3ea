"""The Dagster code location: definitions for every pipeline config, assembled in one place."""

from __future__ import annotations

import dagster as dg

from orchestration.micro_batch import build_micro_batch_job, build_schedule
from orchestration.pipelines import load_pipelines


def build_definitions() -> dg.Definitions:
    jobs = []
    schedules = []
    for config in load_pipelines():
        job = build_micro_batch_job(config)
        jobs.append(job)
        schedules.append(build_schedule(config, job))
    return dg.Definitions(jobs=jobs, schedules=schedules)


defs = build_definitions()
