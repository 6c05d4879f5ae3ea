"""Dagster's spelling of a pipeline's name.

A pipeline may be named with '.' and '-' (`orders-eu.v2`): it is the ledger's application
id and the Delta transactions' too, so it is kept as it is everywhere but in Dagster, whose
job, op, sensor, schedule, resource, partition-set and asset names take letters, digits and
'_' only. Every Dagster name this package builds from a pipeline goes through
`dagster_name`; run tags, alerts and texts naming the pipeline keep its real name. Two
pipelines whose names differ only there (`a-b`, `a_b`) are refused in one code location
(orchestration/pipelines.py), as two with one name are.
"""

from __future__ import annotations

import re

_NOT_IN_A_NAME = re.compile(r"[^A-Za-z0-9_]")


def dagster_name(pipeline: str) -> str:
    """`pipeline` with every character Dagster refuses in a name as '_' (idempotent)."""
    return _NOT_IN_A_NAME.sub("_", pipeline)
