"""The Dagster code location: per pipeline config, its jobs, schedules, sensors, asset and
resources, assembled in `pipeline_definitions.py` and `definitions.py`; `batches/` runs
batches, `maintenance/` cleans and compacts, `health/` tells an operator what is wrong.
No exactly-once reasoning lives here: every op, tick and sensor is a thin call into the
coordinator (ledger/coordinator/) through the pipeline's resource, or a pure `decide_*`
function. May import `jobs`, `resources` and `ledger`; never the CLI or the benchmark.
"""
