"""The run tags exactly sets and reads.

The instance's run queue (dagster.yaml) allows one run per `exactly/pipeline` value, and the
sensors find a batch's live runs by `exactly/batch`, so these names never change.
"""

PIPELINE_TAG = "exactly/pipeline"
BATCH_TAG = "exactly/batch"
