"""The pipeline's checks, evaluated by the run that committed, right after its commit.

Why: a commit materializes the table, and Dagster then shows each of its checks as "Not
evaluated" until the checks sensor's next tick: up to a minute, and for ever while that
sensor is off (it ships stopped). The run that committed has the pipeline open, so it
evaluates them itself and reports the results as runless events, with the lag as an
observation of the topic asset. The checks sensor still alerts on them, once per failure,
as before.

The derived outputs' checks are left to the sensor: each recomputes its output from the
whole table, a cost that grows with the table and has no place in every batch's run.

It never fails the run: the batch is committed and acked by then. A check that cannot be
evaluated now (Kafka unreachable for the lag) is logged in one line, left to the sensor.
"""

from __future__ import annotations

import dagster as dg

from orchestration.health.table_checks import lag_observations, verdicts
from orchestration.resources import resource_in
from resources.failures.lines import one_line


def report_checks_after_commit(context: dg.OpExecutionContext, pipeline: str) -> int:
    """Evaluate and report every check of `pipeline` now; returns how many were reported."""
    try:
        resource = resource_in(context, pipeline)
        found = verdicts(resource, context.log.warning, context.instance, derived=False)
    except Exception as exc:  # the commit stands; the sensor evaluates on its next tick
        context.log.warning(
            f"the checks were not evaluated after the commit: {one_line(str(exc))}; "
            "the checks sensor evaluates them on its next tick"
        )
        return 0
    for verdict in found:
        context.instance.report_runless_asset_event(verdict.evaluation())
    for observation in lag_observations(pipeline, found):
        context.instance.report_runless_asset_event(observation)
    return len(found)
