"""The Dagster code location: the definitions of every pipeline config in the pipelines
folder (orchestration/pipelines.py), each pipeline's assembled in one place
(orchestration/pipeline_definitions.py) and merged here."""

from __future__ import annotations

import dagster as dg

from orchestration.pipeline_definitions import pipeline_definitions
from orchestration.pipelines import config_files


def build_definitions() -> dg.Definitions:
    return dg.Definitions.merge(*(pipeline_definitions(p).definitions for p in config_files()))


defs = build_definitions()
