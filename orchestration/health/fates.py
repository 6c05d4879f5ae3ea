"""What became of a batch whose run did not finish it, told where an operator looks: on the
batch's partition of the table asset, and at the end of each run that worked on it.

Why: a run killed or terminated mid-batch ended in Dagster's words ("out of memory", a
`DagsterExecutionInterruptedError`, a step "Executing" for ever) and nothing said whether
its batch voted; an abandoned batch stayed a Missing partition with no word of why, and a
voted batch finished by the re-drive sensor showed no link between the run that died and
the run that finished it. The ledger knows each of these fates; the history sensor
(orchestration/health/history_sensor.py) tells them once each:

- ABORTED: the partition gets an observation saying so, why (the ledger's `error`: owner
  gone, refused before the vote, abandoned by an operator), when, and which later batch read
  its offsets again; each failed or canceled run of the batch gets the same sentence as the
  last event of its log.
- Voted and finished under a later attempt (its run died after its vote, or its ack was
  refused and retried): the partition's observation and each dead run's log say who
  finished it, the run (linked) when a Dagster run did, else recovery outside Dagster, and
  under which attempt.

- A replace backfill: each live batch whose rows it replaced gets a new materialization on
  its partition naming it (`reprocessed_by`), unless the run that replaced them logged one.

Told means the observation exists in the event log (its `fate_of` label), so a sensor
evaluation that dies halfway tells it again rather than never; a second telling repeats a
true sentence, which is harmless.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import dagster as dg

from jobs.wiring.pipeline import Pipeline
from ledger.core.actions import OperatorAction
from ledger.core.batch import Batch, BatchKind
from ledger.core.decisions import Decision
from ledger.core.protocol import PUBLISHED, BatchState
from orchestration.health.liveness import batch_run_tags
from orchestration.tags import BATCH_TAG, PIPELINE_TAG

#: the metadata key of a fate's observation: the batch's label (`app/id`)
FATE_OF = "fate_of"
_ENDED = [dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]


def has_fate(batch: Batch) -> bool:
    """Pure: whether `batch` has a fate to tell: abandoned, or finished by a later attempt
    than the one that planned it (its first owner died or was fenced)."""
    return batch.state is BatchState.ABORTED or (batch.state in PUBLISHED and batch.attempt > 1)


def to_tell(batch: Batch) -> bool:
    """Pure: whether the history sensor has something to tell of `batch`: its fate, or the
    batches a replace replaced."""
    return has_fate(batch) or is_replace(batch)


def overlaps(a: Batch, b: Batch) -> bool:
    """Pure: whether the two batches' ranges share an offset."""
    return any(
        (r.topic, r.partition) == (s.topic, s.partition) and r.start < s.end and s.start < r.end
        for r in a.ranges
        for s in b.ranges
    )


def rereader(aborted: Batch, later: Iterable[Batch]) -> Batch | None:
    """Pure: the first batch after `aborted`, of its application id, that read any of its
    offsets again; None if none did (yet)."""
    after = sorted(
        (b for b in later if b.app_id == aborted.app_id and b.batch_id > aborted.batch_id),
        key=lambda b: b.batch_id,
    )
    return next((b for b in after if overlaps(aborted, b)), None)


def fate_text(batch: Batch, *, reread_by: Batch | None = None, finished_by: str | None) -> str:
    """Pure: the fate of `batch` in one sentence. `finished_by`: the Dagster run that
    finished a voted batch, None if recovery outside Dagster did."""
    label = f"{batch.app_id}/{batch.batch_id}"
    when = batch.updated_at.isoformat(timespec="seconds")
    if batch.state is BatchState.ABORTED:
        if reread_by is not None:
            then = f"its offsets were read again by batch {reread_by.batch_id} ({reread_by.state})"
        elif not any(r.span for r in batch.ranges):
            then = "it held no offsets, so none were to be read again"
        else:
            then = "no later batch read its offsets (a decision skipped them)"
        return f"batch {label} was abandoned (ABORTED at {when}): {batch.error}; {then}"
    who = f"run {finished_by}" if finished_by else "recovery outside Dagster"
    return (
        f"batch {label} voted, and its first attempt did not finish it: {who} finished it "
        f"under attempt {batch.attempt} ({batch.state} at {when}); the table holds it once"
    )


def runs_of(instance: dg.DagsterInstance, pipeline: str, batch: Batch) -> Sequence[dg.DagsterRun]:
    tag, key = batch_run_tags(pipeline, batch)
    return instance.get_runs(dg.RunsFilter(tags={PIPELINE_TAG: tag, BATCH_TAG: key}))


def tell_fate(
    instance: dg.DagsterInstance,
    table: dg.AssetKey,
    pipeline: str,
    batch: Batch,
    *,
    reread_by: Batch | None,
) -> str:
    """Tell `batch`'s fate on its partition and at the end of each of its runs that failed
    or was canceled; returns the sentence."""
    runs = runs_of(instance, pipeline, batch)
    finisher = next((r for r in runs if r.status is dg.DagsterRunStatus.SUCCESS), None)
    finished_by = finisher.run_id if finisher and batch.state in PUBLISHED else None
    text = fate_text(batch, reread_by=reread_by, finished_by=finished_by)
    label = f"{batch.app_id}/{batch.batch_id}"
    metadata: dict[str, object] = {
        FATE_OF: label,
        "state": str(batch.state),
        "attempt": str(batch.attempt),
        "at": batch.updated_at.isoformat(timespec="seconds"),
    }
    if batch.state is BatchState.ABORTED:
        metadata["why"] = batch.error or "not recorded"
        metadata["reread_by"] = (
            f"{reread_by.app_id}/{reread_by.batch_id}" if reread_by is not None else "none"
        )
    if finished_by:
        metadata["finished_by_run"] = dg.MetadataValue.dagster_run(finished_by)
    for run in runs:
        if run.status in _ENDED:
            instance.report_engine_event(f"What became of its batch: {text}", dagster_run=run)
    instance.report_runless_asset_event(
        dg.AssetObservation(
            asset_key=table,
            partition=str(batch.batch_id) if batch.kind == BatchKind.LIVE else None,
            description=text,
            metadata=metadata,  # type: ignore[arg-type]
        )
    )
    return text


def terminated_text(batch: Batch | None) -> str:
    """Pure: what a run terminated mid-batch leaves, as its step's one sentence: whether the
    batch voted, and who finishes it or reads its offsets again (told on the run again, as
    done, once it is)."""
    if batch is None:
        return "Terminated before it planned a batch: nothing was written."
    head = f"Terminated while batch {batch.app_id}/{batch.batch_id} was {batch.state}"
    if batch.state in PUBLISHED:
        return f"{head}: it is in the table, once; nothing is lost."
    if batch.state is BatchState.ABORTED:
        return f"{head}: nothing of it is published, and the next batch reads its offsets."
    if batch.state is BatchState.PREPARED or batch.voted_once:
        return (
            f"{head}: it voted, so it is never abandoned; the re-drive sensor (or the recover "
            "job) finishes it under a new attempt, and this run's log then says which run did."
        )
    return (
        f"{head}: it did not vote, so nothing of it is published; recovery abandons it and the "
        "next batch reads its offsets again, which this run's log then says."
    )


def is_replace(batch: Batch) -> bool:
    """Pure: whether `batch` is a published replace backfill, whose fate is the live
    batches whose rows it replaced."""
    return (
        batch.kind == BatchKind.BACKFILL
        and batch.params.get("mode") == "replace"
        and batch.state in PUBLISHED
    )


def replaced(backfill: Batch, live: Iterable[Batch]) -> list[Batch]:
    """Pure: the published live batches whose rows `backfill` replaced: they hold offsets of
    its ranges, in the same incarnation of the topic (a re-created topic's offsets restart
    at 0, so the old incarnation's batches overlap by number only)."""

    def same_topic(a: Batch, b: Batch, topic: str) -> bool:
        ids = a.topic_ids.get(topic), b.topic_ids.get(topic)
        return None in ids or ids[0] == ids[1]

    found = [
        b
        for b in live
        if b.state in PUBLISHED
        and overlaps(backfill, b)
        and all(same_topic(backfill, b, r.topic) for r in backfill.ranges)
    ]
    return sorted(found, key=lambda b: b.batch_id)


def tell_replaced(
    instance: dg.DagsterInstance,
    table: dg.AssetKey,
    pipeline: Pipeline,
    backfill: Batch,
    already: set[str],
    materialized: set[str],
) -> str | None:
    """Materialize, on the partition of each live batch whose rows `backfill` replaced, the
    commit that replaced them (`reprocessed_by` it), unless a run did (`already`: the
    partitions it materialized); then observe the table once with the whole fate. None,
    and nothing told, while a replaced batch's own commit is not yet materialized
    (`materialized`: the labels that are), so a partition's history stays in order."""
    from orchestration.metadata import commit_materialization

    live = pipeline.store.batches(app_id=pipeline.config.app_id, states=PUBLISHED)
    ids = [b.batch_id for b in replaced(backfill, live)]
    if any(f"{pipeline.config.app_id}/{i}" not in materialized for i in ids):
        return None
    for batch_id in ids:
        if str(batch_id) in already:
            continue
        extra = {"replaced_batch": f"{pipeline.config.app_id}/{batch_id}"}
        instance.report_runless_asset_event(
            commit_materialization(
                table, pipeline, backfill, partition=str(batch_id), with_lag=False, extra=extra
            )
        )
    label = f"{backfill.app_id}/{backfill.batch_id}"
    text = (
        f"replace backfill {label} replaced the rows of batch(es) "
        f"{', '.join(map(str, ids)) or 'none'}; each of their partitions has a materialization "
        "that names it"
    )
    instance.report_runless_asset_event(
        dg.AssetObservation(
            asset_key=table,
            description=text,
            metadata={FATE_OF: label, "replaced": ", ".join(map(str, ids)) or "none"},
        )
    )
    return text


def decision_observation(
    table: dg.AssetKey, decision: Decision, run_id: str | None = None
) -> dg.AssetObservation:
    """An operator's decision (ledger/core/decisions.py) as an observation of the table
    asset: who skipped what and why, on the asset's page, whether the decide job or
    `exactly skip` recorded it (the history sensor reports the latter's)."""
    metadata: dict[str, Any] = {
        "decision": decision.describe(),
        "decision_id": decision.id,
        "decided_by": decision.decided_by,
        "reason": decision.reason,
    }
    if run_id is not None:
        metadata["run"] = dg.MetadataValue.dagster_run(run_id)
    return dg.AssetObservation(
        asset_key=table,
        description=f"decision {decision.id[:8]}: {decision.describe()}",
        metadata=metadata,
    )


def action_observation(
    table: dg.AssetKey, action: OperatorAction, run_id: str | None = None
) -> dg.AssetObservation:
    """An operator action that moved no position (ledger/core/actions.py: a recovery asked
    for, a derived output rebuilt) as an observation of the table asset, as decisions are:
    by its job, or by the history sensor for `exactly recover` and `exactly derived
    rebuild`."""
    metadata: dict[str, Any] = {
        "action": str(action.kind),
        "action_id": action.id,
        "decided_by": action.decided_by,
        "reason": action.reason,
        "outcome": action.outcome,
    }
    if action.subject:
        metadata["subject"] = action.subject
    if run_id is not None:
        metadata["run"] = dg.MetadataValue.dagster_run(run_id)
    return dg.AssetObservation(asset_key=table, description=action.text(), metadata=metadata)
