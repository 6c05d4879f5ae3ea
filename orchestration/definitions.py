"""The Dagster code location: the definitions of every pipeline config in the pipelines
folder (orchestration/pipelines.py), each pipeline's assembled in one place
(orchestration/pipeline_definitions.py) and merged here.

Loading the code location also starts the shared Spark server of every pipeline that stages
on one (`spark.server: shared`, or EXACTLY_SPARK_SERVER=shared as `make ui` sets), in the
background: runs the daemon launches then connect to a warm JVM from the first one on; and,
when EXACTLY_METRICS names an address, serves every pipeline's figures for Prometheus there
(orchestration/metrics_endpoint.py).
"""

from __future__ import annotations

import logging

import dagster as dg

from jobs.stage.spark_stager import SharedSpark
from ledger.core.errors import ExactlyError
from orchestration.metrics_endpoint import serve_code_location_metrics
from orchestration.pipeline_definitions import pipeline_definitions
from orchestration.pipelines import config_files
from resources.config.pipeline_config import PipelineConfig
from resources.spark.shared_server import server_mode

_log = logging.getLogger("exactly")


def build_definitions() -> dg.Definitions:
    files = config_files()
    pipelines = [pipeline_definitions(p) for p in files]
    for pipeline in pipelines:
        _warm_shared_spark(pipeline.config)
    serve_code_location_metrics(files)
    return dg.Definitions.merge(*(p.definitions for p in pipelines))


def _warm_shared_spark(config: PipelineConfig) -> None:
    """Start the pipeline's shared Spark server in the background, if it stages on one.

    A set-up error (a bad EXACTLY_SPARK_SERVER, an object-store environment that does not
    resolve) is logged, not raised: it fails the runs that stage, each in one line, and
    leaves the rest of the code location (its sensors, its alerts) loaded.
    """
    try:
        if server_mode(config.spark.server) == "shared":
            SharedSpark.for_config(config).warm_in_background(_log.warning)
    except ExactlyError as error:
        _log.warning(f"{config.pipeline}: the shared Spark server was not started: {error}")


defs = build_definitions()
