"""The Dagster code location: per pipeline config, its jobs, schedule, sensors, asset and
resources, one module each, assembled in `pipeline_definitions.py` and `definitions.py`.
No exactly-once reasoning lives here: every op, tick and sensor is a thin call into the
coordinator (ledger/coordinator/two_phase.py) through the pipeline's resource.
"""
