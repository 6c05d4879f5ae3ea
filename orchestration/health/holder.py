"""Who holds a batch that stopped moving, and the one action that frees it.

Why: "the re-drive sensor retries" was the stuck alert's word for every voted batch, and it
is false in three common cases. Recovery leaves a batch to its owner while the owner may be
alive (its process runs on this host, or its lease is fresh): taking over a live attempt
would race its commit, so a hung owner holds its batch until someone stops it. The re-drive
sensor launches nothing while Dagster shows a run of the batch as queued or running, and a
run whose process died unseen (a worker killed by the OOM killer) shows as running until
it is terminated. And the re-drive sensor ships stopped. So an operator told to wait waited
for ever.

`release_text` says, from three facts gathered by `holder_of`, who holds the batch and the
one thing to do: release a hung run's batch with the `<pipeline>_abandon` job, or a hung
process's with `exactly abandon` (ledger/coordinator/release.py: both fence its attempt and
abandon or finish the batch); terminate a run whose process died unseen; turn the re-drive
sensor on or run `exactly recover`; or nothing (the sensor is about to finish it). The stuck alert
(orchestration/health/stuck_sensor.py) and the `no_stuck_batch` check
(orchestration/health/table_checks.py) both say it; the check links the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dagster as dg

from jobs.wiring.pipeline import Pipeline
from ledger.core.batch import Batch, BatchKind
from ledger.core.errors import CONFIG_PLACEHOLDER
from ledger.core.protocol import BatchState
from orchestration.health.liveness import ALIVE, batch_run_tags
from orchestration.names import dagster_name
from orchestration.tags import BATCH_TAG, PIPELINE_TAG

S = BatchState


@dataclass(frozen=True)
class Holder:
    """What holds a batch in flight now."""

    #: the coordinator's view: the owner's process runs (this host) or its lease is fresh
    owner_alive: bool
    #: Dagster runs of the batch that are queued or running, newest first
    runs: tuple[str, ...] = ()
    #: whether `<pipeline>_redrive_sensor` is running; None when Dagster was not asked
    redrive_on: bool | None = None


def holder_of(pipeline: Pipeline, batch: Batch, instance: dg.DagsterInstance | None) -> Holder:
    """The facts `release_text` decides on, asked of the ledger, this host and Dagster."""
    coordinator = pipeline.live if batch.kind == BatchKind.LIVE else pipeline.backfill()
    alive = coordinator.may_be_alive(batch)
    if instance is None:
        return Holder(alive)
    pipeline_tag, batch_tag = batch_run_tags(pipeline.config.pipeline, batch)
    runs = instance.get_runs(
        dg.RunsFilter(tags={PIPELINE_TAG: pipeline_tag, BATCH_TAG: batch_tag}, statuses=ALIVE),
        limit=3,
    )
    return Holder(alive, tuple(r.run_id for r in runs), _sensor_running(instance, pipeline))


def _sensor_running(instance: dg.DagsterInstance, pipeline: Pipeline) -> bool:
    """Whether the pipeline's re-drive sensor was turned on (it ships stopped, so a sensor
    with no stored state is stopped)."""
    from dagster._core.scheduler.instigation import InstigatorStatus, InstigatorType

    name = f"{pipeline.config.pipeline}_redrive_sensor"
    states = instance.all_instigator_state(instigator_type=InstigatorType.SENSOR)
    on = (InstigatorStatus.RUNNING, InstigatorStatus.DECLARED_IN_CODE)
    return any(s.name == name and s.status in on for s in states)


def _finishes(batch: Batch) -> str:
    """What recovery does to `batch` once nothing holds it."""
    if batch.state is S.COMMITTED:
        return "acks it"
    if batch.state is S.PREPARED:
        return "commits it"
    if batch.voted_once:
        return "stages it again"
    return "abandons it, and the next batch reads its ranges again"


def _who_finishes(batch: Batch, holder: Holder, pipeline: str, when: str) -> str:
    sensor = f"{dagster_name(pipeline)}_redrive_sensor"
    recover = f"`exactly recover -c {CONFIG_PLACEHOLDER}`"
    if holder.redrive_on:
        return f"{sensor} {_finishes(batch)} {when}"
    if holder.redrive_on is False:
        return f"{sensor} is stopped: turn it on, or run {recover}, which {_finishes(batch)}"
    return f"{sensor} (when it runs) or {recover} {_finishes(batch)}"


def abandon_command(batch: Batch) -> str:
    """The command that releases `batch` from a hung owner (exactly_cli/abandon_cmd.py);
    shown in Dagster as the `<pipeline>_abandon` job (orchestration/decisions/spelling.py)."""
    backfill = " --backfill" if batch.kind == BatchKind.BACKFILL else ""
    return f"`exactly abandon -c {CONFIG_PLACEHOLDER} {batch.batch_id}{backfill} --reason '...'`"


def abandon_job_text(batch: Batch, pipeline: str) -> str:
    """The abandon job and its Launchpad config for `batch`, for a run that holds it."""
    backfill = ", backfill: true" if batch.kind == BatchKind.BACKFILL else ""
    return (
        f"the {dagster_name(pipeline)}_abandon job with `batch_id: {batch.batch_id}"
        f"{backfill}, reason: <why>`"
    )


def run_url(dagster_url: str | None, run_id: str) -> str | None:
    """The run's page in the Dagster UI at `dagster_url` (alerts.dagster_url), if set."""
    return f"{dagster_url.rstrip('/')}/runs/{run_id}" if dagster_url else None


def release_text(
    batch: Batch, holder: Holder, pipeline: str, dagster_url: str | None = None
) -> str:
    """Pure: who holds `batch` and the one action that frees it, as one or two sentences;
    a run it names is linked when the Dagster UI's address is known."""
    owner = f"Its owner, process {batch.owner.pid} on {batch.owner.host},"
    then = _who_finishes(batch, holder, pipeline, "after that")
    if holder.runs:
        url = run_url(dagster_url, holder.runs[0])
        run = f"{holder.runs[0]} ({url})" if url else holder.runs[0]
    if holder.runs and holder.owner_alive:
        return (
            f"{owner} is alive, in Dagster run {run}, and recovery leaves a live owner its "
            f"batch: if that run is hung, launch {abandon_job_text(batch, pipeline)}, which "
            f"terminates the run, fences its attempt and {_finishes(batch)}."
        )
    if holder.runs:
        return (
            f"{owner} is gone, but Dagster still shows run {run} as running (its process "
            f"died unseen): terminate that run; then {then}."
        )
    if holder.owner_alive:
        return (
            f"{owner} is alive outside Dagster (a command line or a continuous run), and "
            f"recovery leaves a live owner its batch: if it is hung, run "
            f"{abandon_command(batch)}, which fences its attempt and {_finishes(batch)}; "
            "then stop the process."
        )
    now = _who_finishes(batch, holder, pipeline, "on its next tick")
    return f"{owner} is gone and no Dagster run holds it: {now}."


def holder_metadata(holder: Holder) -> dict[str, Any]:
    """The facts as check metadata; the holding run as a link to it in the UI."""
    found: dict[str, Any] = {"owner_alive": holder.owner_alive}
    if holder.runs:
        found["holding_run"] = dg.MetadataValue.dagster_run(holder.runs[0])
    if holder.redrive_on is not None:
        found["redrive_sensor_on"] = holder.redrive_on
    return found


def stuck_text(
    pipeline: str,
    batch: Batch,
    minutes: float,
    heard: float,
    holder: Holder,
    dagster_url: str | None = None,
) -> str:
    """Pure: the stuck alert's text: how long, what is at stake, who holds the batch and
    the one action that frees it. `minutes` in its state, `heard` since its heartbeat."""
    ranges = " ".join(str(r) for r in batch.ranges if r.span) or "(empty)"
    head = f"batch {batch.batch_id} (attempt {batch.attempt})"
    release = release_text(batch, holder, pipeline, dagster_url)
    if batch.state is S.PREPARED:
        return (
            f"{head} voted {minutes:.1f} min ago and is not committed; its ranges {ranges} must "
            f"be published before Kafka retention deletes them. {release}"
        )
    if batch.state is S.COMMITTED:
        return (
            f"{head} was committed {minutes:.1f} min ago and its consumer group was not moved "
            f"since: its records ({ranges}) are in the table, but the ack did not happen, so "
            f"lag tools show the group behind. {release}"
        )
    if batch.voted_once:
        return (
            f"{head} voted, then lost staged files and went back to be staged again "
            f"{minutes:.1f} min ago ({batch.error}); its ranges {ranges} must be read again "
            f"before Kafka retention deletes them. It is never abandoned. {release}"
        )
    what = (
        f"was planned {minutes:.1f} min ago and has not been staged"
        if batch.state is S.PLANNED
        else f"staged its files {minutes:.1f} min ago and has not voted"
    )
    return (
        f"{head} {what}; nothing is published, and its ranges {ranges} wait to be read "
        f"before Kafka retention deletes them. Its owner was last heard from {heard:.1f} min "
        f"ago. {release}"
    )
