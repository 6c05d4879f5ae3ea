"""The run tags exactly sets and reads.

The instance's run queue (dagster.yaml) allows one run per `exactly/pipeline` value, and the
sensors find a batch's live runs by `exactly/batch`, so these names never change.
"""

PIPELINE_TAG = "exactly/pipeline"
BATCH_TAG = "exactly/batch"
#: Set on a run whose request a protocol rule refused (orchestration/health/rejection.py): rejected
#: input, not a failure of the system, so the run-failure sensor does not alert on it.
REJECTED_TAG = "exactly/rejected"
