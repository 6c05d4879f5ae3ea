"""The `<pipeline>_history_sensor`: the ledger is the source of truth of the UI's history.

Runs materialize the batches they commit, but batches are also committed where Dagster does
not see it: by the CLI, by recovery inside another run, or by a run that died between its
commit and its log. Each evaluation makes the asset agree with the ledger: every live batch
has its dynamic partition, and every published (COMMITTED or ACKED) batch, live or backfill,
has one materialization of the table asset with the metadata a run would have logged
(orchestration/metadata.py) and its original timings from the ledger, and with it the
quarantine's and each derived output's for the same commit.

Never twice: what has been materialized is read from the event log itself (the `batch` label
of each materialization since the cursor's storage id), not assumed from the cursor, and a
batch one of whose runs is still queued or running is left to that run. A run that is no
longer alive has logged everything it will, so reading the event log after that check
cannot miss its materialization. The sensor writes partitions and materializations itself,
before it moves its cursor, so an evaluation that dies halfway is repeated without doubles.

It is cheap, so it runs by default: per evaluation, the new events of one asset and, per
application id, the ledger's batches above a floor (every batch at or below it is final and
in the history).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from jobs.wiring.pipeline import Pipeline
from ledger.core.backfill import backfill_app_id
from ledger.core.batch import Batch, BatchKind
from ledger.core.protocol import PUBLISHED, BatchState
from orchestration.batches.partitions import add_batch_partition
from orchestration.health.fates import (
    FATE_OF,
    action_observation,
    decision_observation,
    is_replace,
    rereader,
    tell_fate,
    tell_replaced,
    to_tell,
)
from orchestration.health.liveness import batch_run_tags, run_alive
from orchestration.metadata import (
    batch_label,
    commit_materialization,
    derived_materializations,
    quarantine_materialization,
)
from orchestration.names import dagster_name
from orchestration.resources import pipeline_in, pipeline_key
from resources.config.pipeline_config import PipelineConfig


@dataclass
class HistoryCursor:
    """Where the last evaluation left the history."""

    #: the last event-log record of the table asset read
    after_storage_id: int | None = None
    #: per application id, the batch id at or below which every batch is final and recorded
    floors: dict[str, int] = field(default_factory=dict)
    #: labels (`app/id`) of batches above their floor known to be materialized
    seen: set[str] = field(default_factory=set)
    #: the last observation of the table asset read (fates told: orchestration/health/fates.py)
    after_observation_id: int | None = None
    #: labels of batches above their floor whose fate is told
    told: set[str] = field(default_factory=set)

    @classmethod
    def parse(cls, text: str | None) -> HistoryCursor:
        if not text:
            return cls()
        data = json.loads(text)
        return cls(
            data["after_storage_id"],
            data["floors"],
            set(data["seen"]),
            data.get("after_observation_id"),
            set(data.get("told", ())),
        )

    def dump(self) -> str:
        return json.dumps(
            {
                "after_storage_id": self.after_storage_id,
                "floors": self.floors,
                "seen": sorted(self.seen),
                "after_observation_id": self.after_observation_id,
                "told": sorted(self.told),
            }
        )


def _label_of(materialization: dg.AssetMaterialization, live_app_id: str) -> str | None:
    """The batch a materialization records; materializations logged before the `batch` label
    existed are live batches on their partition, or the backfill batch that reprocessed it."""
    meta = materialization.metadata
    for key in ("batch", "reprocessed_by"):
        if key in meta:
            return str(meta[key].value)
    if materialization.partition is not None:
        return f"{live_app_id}/{materialization.partition}"
    return None


class _EventLog:
    """The table asset's materializations and fate observations as far as read, and the
    batches they record."""

    def __init__(
        self, instance: dg.DagsterInstance, table: dg.AssetKey, cursor: HistoryCursor, app: str
    ) -> None:
        self.instance, self.table, self.app = instance, table, app
        self.after = cursor.after_storage_id
        self.seen = set(cursor.seen)
        self.after_observation = cursor.after_observation_id
        self.told = set(cursor.told)
        #: per replace backfill's label, the live partitions materialized `reprocessed_by` it
        self.reprocessed: dict[str, set[str]] = {}

    def read(self) -> None:
        """Read the materializations and observations logged since the last read."""
        self._read_observations()
        while True:
            page = self.instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=self.table, after_storage_id=self.after),
                limit=500,
                ascending=True,
            )
            for record in page.records:
                materialization = record.asset_materialization
                label = materialization and _label_of(materialization, self.app)
                if label:
                    self.seen.add(label)
                if materialization and "reprocessed_by" in materialization.metadata:
                    by = str(materialization.metadata["reprocessed_by"].value)
                    self.reprocessed.setdefault(by, set()).add(str(materialization.partition))
                self.after = record.storage_id
            if not page.has_more:
                return

    def _read_observations(self) -> None:
        while True:
            page = self.instance.fetch_observations(
                dg.AssetRecordsFilter(
                    asset_key=self.table, after_storage_id=self.after_observation
                ),
                limit=500,
                ascending=True,
            )
            for record in page.records:
                observation = record.asset_observation
                if observation is not None and FATE_OF in observation.metadata:
                    self.told.add(str(observation.metadata[FATE_OF].value))
                if observation is not None and "decision_id" in observation.metadata:
                    self.told.add(f"decision:{observation.metadata['decision_id'].value}")
                if observation is not None and "action_id" in observation.metadata:
                    self.told.add(f"action:{observation.metadata['action_id'].value}")
                self.after_observation = record.storage_id
            if not page.has_more:
                return


def _run_may_log(instance: dg.DagsterInstance, pipeline: str, batch: Batch) -> bool:
    """Whether a queued or running run works on `batch` and may still materialize it: its
    own kind of run, or a micro-batch run reprocessing a partition as this backfill batch."""
    own_tag, key = batch_run_tags(pipeline, batch)
    return any(run_alive(instance, tag, key) for tag in {own_tag, pipeline})


def _tell(
    pipeline: Pipeline,
    instance: dg.DagsterInstance,
    table: dg.AssetKey,
    events: _EventLog,
    batch: Batch,
    found: list[Batch],
    last: int,
) -> str | None:
    """Tell `batch`'s fate (orchestration/health/fates.py) and return the sentence; None,
    nothing told, while it is not time yet."""
    name, label = pipeline.config.pipeline, batch_label(batch)
    again = rereader(batch, found)
    if batch.state is BatchState.ABORTED and again is None and batch.batch_id == last:
        return None  # told once the next batch reads its offsets again
    if _run_may_log(instance, name, batch):
        return None  # a run of it may still be working: tell it after
    if is_replace(batch):
        done = events.reprocessed.get(label, set())
        text = tell_replaced(instance, table, pipeline, batch, done, events.seen)
        if text is None:
            return None  # once the batches it replaced are in the history
    else:
        text = tell_fate(instance, table, name, batch, reread_by=again)
    events.told.add(label)
    return text


def _show_decisions(
    pipeline: Pipeline, instance: dg.DagsterInstance, table: dg.AssetKey, events: _EventLog
) -> list[str]:
    """Observe every decision and operator action the event log does not show yet (recorded
    by `exactly skip`, `recover` or `derived rebuild`, or by a job whose run died before its
    observation)."""
    shown = []
    for decision in pipeline.store.decisions(pipeline=pipeline.config.pipeline):
        if f"decision:{decision.id}" not in events.told:
            instance.report_runless_asset_event(decision_observation(table, decision))
            events.told.add(f"decision:{decision.id}")
            shown.append(f"decision {decision.id[:8]} shown")
    for action in pipeline.store.actions(pipeline.config.pipeline):
        if f"action:{action.id}" not in events.told:
            instance.report_runless_asset_event(action_observation(table, action))
            events.told.add(f"action:{action.id}")
            shown.append(f"{action.kind} {action.id[:8]} shown")
    return shown


def record_history(
    pipeline: Pipeline,
    instance: dg.DagsterInstance,
    *,
    table: dg.AssetKey,
    partitions: str,
    cursor: HistoryCursor,
    log: Callable[[str], None] = lambda _msg: None,
) -> tuple[HistoryCursor, list[str]]:
    """Add the missing partitions and materializations; returns the new cursor and what was
    recorded, one line each."""
    name = pipeline.config.pipeline
    events = _EventLog(instance, table, cursor, pipeline.config.app_id)
    events.read()
    floors = dict(cursor.floors)
    recorded: list[str] = []
    for app_id in (pipeline.config.app_id, backfill_app_id(name)):
        floor = floors.get(app_id, 0)
        last = pipeline.store.last_batch_id(app_id)
        if last is None or last <= floor:
            continue
        found = pipeline.store.batches(app_id=app_id, limit=last - floor)
        settled = True
        for batch in sorted((b for b in found if b.batch_id > floor), key=lambda b: b.batch_id):
            key, label = str(batch.batch_id), batch_label(batch)
            if batch.kind == BatchKind.LIVE and add_batch_partition(instance, partitions, key):
                recorded.append(f"partition {key} added ({batch.state})")
            if batch.state in PUBLISHED and label not in events.seen:
                if _run_may_log(instance, name, batch):
                    settled = False
                    continue
                events.read()  # the run that committed it, now finished, may have logged it
                if label not in events.seen:
                    materialization = commit_materialization(table, pipeline, batch, with_lag=False)
                    instance.report_runless_asset_event(materialization)
                    partition = materialization.partition
                    for side in (
                        quarantine_materialization(pipeline, batch, partition),
                        *derived_materializations(pipeline, batch, partition),
                    ):
                        instance.report_runless_asset_event(side)
                    events.seen.add(label)
                    recorded.append(f"batch {label} ({batch.state}) materialized from the ledger")
            telling = to_tell(batch)
            if telling and label not in events.told:
                text = _tell(pipeline, instance, table, events, batch, found, last)
                if text is None:
                    settled = False  # not yet: see _tell
                    continue
                recorded.append(f"told: {text}")
            told = not telling or label in events.told
            final = (batch.state is BatchState.ABORTED or label in events.seen) and told
            settled = settled and final
            if settled:
                floor = batch.batch_id
        floors[app_id] = floor
    recorded += _show_decisions(pipeline, instance, table, events)
    for line in recorded:
        log(line)
    events.read()  # past our own reports, so the next evaluation does not read them again

    def above_floor(label: str) -> bool:
        app_id, _, batch_id = label.rpartition("/")
        return not batch_id.isdigit() or int(batch_id) > floors.get(app_id, 0)

    seen = {label for label in events.seen if above_floor(label)}
    told = {label for label in events.told if above_floor(label)}
    return HistoryCursor(events.after, floors, seen, events.after_observation, told), recorded


def build_history_sensor(
    config: PipelineConfig, batches: dg.DynamicPartitionsDefinition, table: dg.AssetSpec
) -> dg.SensorDefinition:
    name = config.pipeline

    @dg.sensor(
        name=f"{dagster_name(name)}_history_sensor",
        minimum_interval_seconds=config.schedule.sensor_interval(30),
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Makes the ledger the source of truth of the UI: adds the partition of every live "
            "batch and materializes the table asset for every committed batch no run "
            "materialized (committed by the CLI, by recovery, or by a run that died)."
        ),
        # shown as the automation of the assets it keeps (it launches no run)
        asset_selection=dg.AssetSelection.assets(table.key),
        required_resource_keys={pipeline_key(name)},
    )
    def history_sensor(context: dg.SensorEvaluationContext, **_passed: Any) -> dg.SkipReason:
        cursor, recorded = record_history(
            pipeline_in(context, name),
            context.instance,
            table=table.key,
            partitions=batches.name,
            cursor=HistoryCursor.parse(context.cursor),
            log=context.log.info,
        )
        context.update_cursor(cursor.dump())
        if recorded:
            return dg.SkipReason(f"recorded from the ledger: {'; '.join(recorded)}")
        return dg.SkipReason("the asset's history agrees with the ledger")

    return history_sensor
