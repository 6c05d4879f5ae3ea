"""The `<pipeline>_micro_batch` job: plan -> stage -> prepare -> commit, one op per step.

Each op is a thin call into the pipeline's coordinators (jobs/wiring/pipeline.py over
ledger/coordinator/two_phase.py); all the exactly-once reasoning lives there, none here. Runs are
partitioned by batch id (a dynamic partition per batch), so the job's partition view in the
UI is the checkpoint history. A run executes in one process, so its ops share the process's
Pipeline (orchestration/resources.py) and pass the stage output in memory. The same graph,
without a partition, is the Launchpad's "next batch" (orchestration/batches/next_batch_job.py).

A run for a batch that is already committed does not pass for a success that repaints the
history: it fails with the one sentence that says how to reprocess the batch, unless its run
config confirms the reprocess (`reprocess: true`), which then replaces the batch's offsets
(a replace backfill) in one Delta commit. Nor does a run for a batch that is not committed:
if the batch had voted, the run's recovery finishes it (as the re-drive job does) and the
run reports and materializes that commit; if it was abandoned, the run fails with the one
sentence that says the next batch reads its offsets again. Both failures are rejected input
(orchestration/health/rejection.py): the run-failure sensor pages nobody over them. Which of
these a run does is decided by `decide_plan` (ledger/core/run_plan.py), pure; the plan op
reads the ledger, calls it and carries out its answer.
"""

import time
from collections.abc import Iterator, Mapping
from typing import Any

import dagster as dg
from pydantic import Field

from jobs.wiring.pipeline import Pipeline
from ledger.coordinator.two_phase import TwoPhaseCommit
from ledger.core.batch import Batch
from ledger.core.errors import CONFIG_PLACEHOLDER
from ledger.core.ports import StageOutput
from ledger.core.protocol import BatchState
from ledger.core.run_plan import Refused, RunAction, RunPlan, decide_plan
from orchestration.batches.partitions import add_batch_partition
from orchestration.health.failures import one_line_failures
from orchestration.health.liveness import warn_if_not_acked
from orchestration.health.rejection import rejected, rejections_end_the_run
from orchestration.metadata import batch_label, batch_metadata, log_commit
from orchestration.names import dagster_name
from orchestration.resources import pipeline_in, pipeline_key
from orchestration.tags import BATCH_TAG, PIPELINE_TAG
from resources.config.pipeline_config import PipelineConfig


class PlanRequest(dg.Config):
    """The plan op's Launchpad config: only a reprocess needs any."""

    reprocess: bool = Field(
        default=False,
        description=(
            "Confirm that a run on an already committed batch's partition replaces that "
            "batch's committed rows with its offsets read again through the current "
            "transform (a replace backfill). Without it such a run fails and changes nothing."
        ),
    )


def _timed(coordinator: TwoPhaseCommit, batch: Batch, phase: str, started: float) -> Batch:
    """Record the op's seconds among the batch's phase times (shown per partition)."""
    phases = {**batch.metrics.get("phase_s", {}), phase: time.perf_counter() - started}
    return coordinator.store.record_metrics(batch, {"phase_s": phases})


def committed_sentence(pipeline: str, batch: Batch) -> str:
    """Why a run on a committed batch's partition did nothing, and how to reprocess it."""
    ranges = " ".join(str(r) for r in batch.ranges if r.span) or "no offsets"
    name = dagster_name(pipeline)
    return (
        f"Batch {batch.batch_id} is already committed ({batch.state}, table version "
        f"{batch.table_version}), so this run changed nothing; to reprocess its offsets "
        f"({ranges}) and replace its committed rows, run this partition again with "
        f"`ops: {name}_plan: config: reprocess: true`, or run {name}_backfill in "
        "replace mode over those ranges."
    )


def unfinished_sentence(pipeline: str, batch: Batch) -> str:
    """Why a run on the partition of a batch that is not committed did nothing, and what
    finishes it. Recovery, which every run does first, has already finished the batch if it
    voted and abandoned it if its owner is gone; one still in flight belongs to an attempt
    that moved it on meanwhile."""
    name = dagster_name(pipeline)
    if batch.state is BatchState.ABORTED:
        return (
            f"Batch {batch.batch_id} was abandoned ({batch.state}: {batch.error}), so this run "
            "changed nothing: nothing of it was published and it never will be, and the next "
            f"batch reads its offsets again; launch {name}_next_batch (or turn on "
            f"{name}_schedule) instead of re-running this partition."
        )
    return (
        f"Batch {batch.batch_id} is {batch.state} and another attempt (owner {batch.owner}) "
        "is moving it on, so this run changed nothing; once that attempt is gone, "
        f"{name}_redrive_sensor finishes a batch that voted and {name}_schedule "
        f"abandons one that did not; see `exactly ledger -c {CONFIG_PLACEHOLDER}`."
    )


def _rerun(
    context: dg.OpExecutionContext,
    name: str,
    table: dg.AssetSpec,
    pipeline: Pipeline,
    before: Batch,
    plan: RunPlan,
    request: Mapping[str, str],
) -> Iterator[dg.Output[Batch]]:
    """Carry out `plan` for a run on the partition of `before`, an existing batch: report
    the commit its recovery finished, refuse with what to do instead, or plan the batch's
    reprocess."""
    batch = plan.batch
    assert batch is not None
    if plan.action is RunAction.REDRIVEN:
        # the partition's batch had voted and its run died: this run's recovery finished
        # it, as the re-drive job does, so the run reports that commit
        context.instance.add_run_tags(context.run_id, {BATCH_TAG: str(batch.batch_id)})
        context.log.info(
            f"re-drove batch {batch.batch_id} from {before.state} to {batch.state}; "
            "nothing new to plan"
        )
        log_commit(context, table.key, pipeline, batch)
        return
    if plan.action is RunAction.REFUSE:
        assert plan.refused is not None
        if plan.refused is Refused.ALREADY_COMMITTED:
            sentence = committed_sentence(name, batch)
        else:
            sentence = unfinished_sentence(name, batch)
        raise rejected(context, name, sentence, plan.refused.value, request)
    replacement = pipeline.reprocess(batch)
    if replacement is None:
        context.log.info(f"batch {batch.batch_id} read nothing; nothing to reprocess")
        return
    context.instance.add_run_tags(context.run_id, {BATCH_TAG: batch_label(replacement)})
    context.log.info(f"reprocessing batch {batch.batch_id} as {replacement.label}")
    yield dg.Output(replacement, metadata=batch_metadata(replacement))


def _plan_op(
    name: str, batches: dg.DynamicPartitionsDefinition, table: dg.AssetSpec
) -> dg.OpDefinition:
    @dg.op(
        name=f"{dagster_name(name)}_plan",
        out=dg.Out(Batch, is_required=False),
        required_resource_keys={pipeline_key(name)},
    )
    @one_line_failures(name)
    def plan(context: dg.OpExecutionContext, config: PlanRequest) -> Iterator[dg.Output[Batch]]:
        """Recover first (finish voted batches), then plan the run's batch: the partition's,
        or the next one (adding its partition) when the run has none.

        A run for an existing batch's partition plans nothing: it reports the batch's commit
        if its own recovery finished it, and otherwise fails with what to do instead (on a
        committed batch, the way to reprocess it, unless its config confirms the reprocess);
        which of these is `decide_plan`'s (ledger/core/run_plan.py).
        """
        started = time.perf_counter()
        pipeline = pipeline_in(context, name)
        tpc = pipeline.live
        wanted = int(context.partition_key) if context.has_partition_key else None
        request = {"partition": str(wanted) if wanted is not None else "the next batch"}
        before = tpc.store.get(tpc.app_id, wanted) if wanted is not None else None
        with rejections_end_the_run(context, name, request):
            finished = pipeline.recover()
        for done in finished:
            context.log.info(f"recovered batch {done.app_id}/{done.batch_id}: {done.state}")
        after = tpc.store.get(tpc.app_id, before.batch_id) if before is not None else None
        decided = decide_plan(before, after, finished, reprocess=config.reprocess)
        if before is not None and decided.action is not RunAction.PLAN:
            yield from _rerun(context, name, table, pipeline, before, decided, request)
            return
        with rejections_end_the_run(context, name, request):
            batch = tpc.begin(batch_id=wanted)
        if batch is None:
            context.log.info(f"{name}: caught up, nothing new to read")
            return
        context.instance.add_run_tags(context.run_id, {BATCH_TAG: str(batch.batch_id)})
        if wanted is None:
            add_batch_partition(context.instance, batches.name, str(batch.batch_id))
        batch = _timed(tpc, batch, "plan", started)
        yield dg.Output(batch, metadata=batch_metadata(batch))

    return plan


def build_micro_batch_graph(
    config: PipelineConfig, batches: dg.DynamicPartitionsDefinition, table: dg.AssetSpec
) -> dg.GraphDefinition:
    """The four ops of one batch, for the partitioned job and the next-batch job."""
    name = config.pipeline
    needs = {pipeline_key(name)}

    plan = _plan_op(name, batches, table)

    @dg.op(
        name=f"{dagster_name(name)}_stage",
        out={"batch": dg.Out(Batch), "staged_files": dg.Out(StageOutput)},
        required_resource_keys=needs,
    )
    @one_line_failures(name)
    def stage(context: dg.OpExecutionContext, batch: Batch) -> Iterator[dg.Output[Any]]:
        started = time.perf_counter()
        tpc = pipeline_in(context, name).coordinator_for(batch)
        staged, output = tpc.invoke(batch)
        staged = _timed(tpc, staged, "stage", started)
        yield dg.Output(staged, "batch", metadata=batch_metadata(staged))
        yield dg.Output(output, "staged_files", metadata={"files": len(output.files)})

    @dg.op(name=f"{dagster_name(name)}_prepare", out=dg.Out(Batch), required_resource_keys=needs)
    @one_line_failures(name)
    def prepare(
        context: dg.OpExecutionContext, batch: Batch, staged_files: StageOutput
    ) -> dg.Output[Batch]:
        started = time.perf_counter()
        tpc = pipeline_in(context, name).coordinator_for(batch)
        prepared = _timed(tpc, tpc.pre_commit(batch, staged_files), "prepare", started)
        return dg.Output(prepared, metadata=batch_metadata(prepared))

    @dg.op(name=f"{dagster_name(name)}_commit", out=dg.Out(Batch), required_resource_keys=needs)
    @one_line_failures(name)
    def commit(context: dg.OpExecutionContext, batch: Batch) -> dg.Output[Batch]:
        started = time.perf_counter()
        pipeline = pipeline_in(context, name)
        tpc = pipeline.coordinator_for(batch)
        acked = _timed(tpc, tpc.ack(tpc.commit(batch)), "commit", started)
        warn_if_not_acked(context.log.warning, acked)
        log_commit(context, table.key, pipeline, acked)
        return dg.Output(acked, metadata=batch_metadata(acked))

    @dg.graph(name=f"{dagster_name(name)}_batch")
    def one_batch() -> None:
        batch, staged_files = stage(plan())
        commit(prepare(batch, staged_files))

    return one_batch


def build_micro_batch_job(
    config: PipelineConfig, graph: dg.GraphDefinition, batches: dg.DynamicPartitionsDefinition
) -> dg.JobDefinition:
    name = config.pipeline
    return graph.to_job(
        name=f"{dagster_name(name)}_micro_batch",
        description=f"One exactly-once micro-batch of pipeline {name!r}; partition = batch id.",
        executor_def=dg.in_process_executor,
        partitions_def=batches,
        tags={PIPELINE_TAG: name},
    )
