"""The Dagster code location: the definitions of every pipeline config in the pipelines
folder (orchestration/pipelines.py), each pipeline's assembled in one place
(orchestration/pipeline_definitions.py) and merged here.

Loading the code location also starts the shared Spark server of every pipeline that stages
on one (`spark.server: shared`, or EXACTLY_SPARK_SERVER=shared as `make ui` sets), in the
background: runs the daemon launches then connect to a warm JVM from the first one on.
"""

from __future__ import annotations

import logging

import dagster as dg

from jobs.spark_stager import SharedSpark
from orchestration.pipeline_definitions import pipeline_definitions
from orchestration.pipelines import config_files

_log = logging.getLogger("exactly")


def build_definitions() -> dg.Definitions:
    pipelines = [pipeline_definitions(p) for p in config_files()]
    for pipeline in pipelines:
        SharedSpark.for_config(pipeline.config).warm_in_background(_log.warning)
    return dg.Definitions.merge(*(p.definitions for p in pipelines))


defs = build_definitions()
