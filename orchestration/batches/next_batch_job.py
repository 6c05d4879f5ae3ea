"""The `<pipeline>_next_batch` job: the Launchpad's "run the next batch", no id to type.

The micro-batch job is partitioned by batch id, and the Launchpad cannot name a partition
that does not exist yet. This job runs the same graph (orchestration/batches/micro_batch_job.py)
without a partition: its plan op plans whatever is due next, adds that batch's partition and
tags the run with it, and its commit materializes the table asset's partition of the batch,
so the batch is in the history as if the schedule had launched it.
"""

import dagster as dg

from orchestration.names import dagster_name
from orchestration.tags import PIPELINE_TAG
from resources.config.pipeline_config import PipelineConfig


def build_next_batch_job(config: PipelineConfig, graph: dg.GraphDefinition) -> dg.JobDefinition:
    name = config.pipeline
    return graph.to_job(
        name=f"{dagster_name(name)}_next_batch",
        description=(
            f"Plan and run the next exactly-once micro-batch of pipeline {name!r}, adding its "
            "partition; does nothing when the topic has nothing new."
        ),
        executor_def=dg.in_process_executor,
        tags={PIPELINE_TAG: name},
    )
