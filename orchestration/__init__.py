"""The Dagster code location: per pipeline config, its jobs, schedules, sensors, asset and
resources, assembled in `pipeline_definitions.py` and `definitions.py`; `batches/` runs
batches, `maintenance/` cleans and compacts, `health/` tells an operator what is wrong.
No exactly-once reasoning lives here: every op, tick and sensor is a thin call into the
coordinator (ledger/coordinator/) through the pipeline's resource, or a pure `decide_*`
function. May import `jobs`, `resources` and `ledger`; never the CLI or the benchmark.
"""

import warnings

from dagster import BetaWarning

# Dagster's own `resolve_job_def` builds its sensors with `owners=`, which warns on every
# import of the definitions, in every `exactly` command that builds them (the bench, the
# checks): noise on an operator's terminal about a parameter this project never passes.
warnings.filterwarnings("ignore", message="Parameter `owners`", category=BetaWarning)
