"""The `<pipeline>_redrive` job: finish one batch that voted and whose run died.

"Commit must eventually succeed, or data is lost" (docs/protocol.md): the run takes the batch over
under a new attempt and publishes exactly the files it voted, through the coordinator's
`redrive`, the same code recovery uses. The re-drive sensor
(orchestration/batches/redrive_sensor.py)
launches it; it can be launched by hand for a batch's partition too.
"""

import time
from collections.abc import Iterator

import dagster as dg

from ledger.core.batch import Batch
from orchestration.health.failures import one_line_failures
from orchestration.health.liveness import warn_if_not_acked
from orchestration.metadata import batch_metadata, log_commit
from orchestration.names import dagster_name
from orchestration.resources import pipeline_in, pipeline_key
from orchestration.tags import PIPELINE_TAG
from resources.config.pipeline_config import PipelineConfig


def build_redrive_job(
    config: PipelineConfig, batches: dg.DynamicPartitionsDefinition, table: dg.AssetSpec
) -> dg.JobDefinition:
    name = config.pipeline

    @dg.op(
        name=f"{dagster_name(name)}_redrive_commit",
        out=dg.Out(Batch, is_required=False),
        required_resource_keys={pipeline_key(name)},
    )
    @one_line_failures(name)
    def redrive_commit(context: dg.OpExecutionContext) -> Iterator[dg.Output[Batch]]:
        """Finish the partition's batch if it is PREPARED or COMMITTED; else do nothing."""
        started = time.perf_counter()
        pipeline = pipeline_in(context, name)
        acked = pipeline.live.redrive(int(context.partition_key))
        if acked is None:
            context.log.info(
                f"batch {context.partition_key} is not PREPARED or COMMITTED: nothing to re-drive"
            )
            return
        # the re-drive's seconds (a commit, or a re-stage and its commit), beside the phases
        # of the run that died
        phases = {**acked.metrics.get("phase_s", {}), "redrive": time.perf_counter() - started}
        acked = pipeline.live.store.record_metrics(acked, {"phase_s": phases})
        context.log.info(f"re-drove batch {acked.label} to {acked.state}")
        warn_if_not_acked(context.log.warning, acked)
        log_commit(context, table.key, pipeline, acked)
        yield dg.Output(acked, metadata=batch_metadata(acked))

    @dg.job(
        name=f"{dagster_name(name)}_redrive",
        description=f"Commit-only re-drive of one prepared batch of pipeline {name!r}.",
        executor_def=dg.in_process_executor,
        partitions_def=batches,
        tags={PIPELINE_TAG: name},
    )
    def redrive() -> None:
        redrive_commit()

    return redrive
