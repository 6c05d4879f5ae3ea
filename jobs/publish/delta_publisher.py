"""The protocol's publisher (ledger/core/ports.py `Publisher`, driven by
ledger/coordinator/two_phase.py): a pipeline's data table, its quarantine table and its
derived outputs, published together, batch by batch, with delta-rs (and a PostgreSQL
transaction for a PostgreSQL output).

It owns the order and what each output already holds: every commit carries the batch's
offsets in its metadata, so any output's log can rebuild a lost ledger (invariant 7); each
output is idempotent on its own by its application transaction version (a derived output's
is `<app id>.derived.<name>`), and a batch found in some outputs' logs but not the data
table's, published last (a crash between the commits), is reported unfinished, never
forgotten (invariant 12). What one derived output's commit is belongs to
jobs/publish/derived_outputs.py (Delta) and jobs/publish/postgres_outputs.py (PostgreSQL).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

import pyarrow as pa

from jobs.publish.config_targets import config_targets
from jobs.publish.derived_outputs import (
    behind,
    merge_batch,
    merge_outcome,
    read_partial,
    table_schema,
)
from jobs.publish.lanes import Lanes
from jobs.publish.postgres_outputs import (
    add_postgres_batches,
    apply_postgres,
    postgres_behind,
    postgres_outcome,
)
from jobs.publish.raw_rows import publish_rows, rows_held_in
from jobs.publish.replace_keeps import refuse_replace_losing_rows
from jobs.publish.restore_check import refuse_restored
from jobs.publish.voted_files import files_by_target
from ledger.coordinator.crash import crashpoint
from ledger.core.batch import Batch, StagedFile
from ledger.core.errors import InconsistencyError, RefusedBatchError
from ledger.core.layout import QUARANTINE, TABLE, derived_target, is_derived
from ledger.core.ports import PublishResult
from ledger.core.protocol import OffsetRange
from resources.config.derived_spec import AggregateOutput, UpsertOutput
from resources.config.pipeline_config import PipelineConfig
from resources.delta.features import refuse_unwritable
from resources.delta.figures import TableLayout, TableStats
from resources.delta.log import other_writers, topics_in_rows
from resources.delta.merge import MergeOutcome, _check_schema, check_aggregate_layout
from resources.delta.schema import decode_schema
from resources.delta.table import Compaction, DeltaTarget
from resources.delta.writers import refuse_before_publish
from resources.object_storage import storage
from resources.postgres.apply import PostgresOutcome
from resources.postgres.target import PostgresTarget

#: The batch metrics key of what each derived output's commit did (`merge_outcome`).
DERIVED_METRICS = "derived"
T = TypeVar("T")


class DeltaPublisher:
    """The data table, its quarantine and its derived outputs, published batch by batch."""

    def __init__(
        self,
        table: DeltaTarget,
        quarantine: DeltaTarget,
        derived: Sequence[tuple[AggregateOutput | UpsertOutput, DeltaTarget]] = (),
        postgres: Sequence[PostgresTarget] = (),
        order: Sequence[str] = (),
        app_ids: Sequence[str] = (),
    ) -> None:
        self.table = table
        self.quarantine = quarantine
        #: the Delta derived outputs; the PostgreSQL ones are `postgres`
        self.derived = tuple(derived)
        #: the pipeline's application ids (live, backfill): a derived output must hold the
        #: batches of each that the raw table holds (`check_not_behind`)
        self.app_ids = tuple(app_ids)
        self.postgres = {derived_target(t.spec.name): t for t in postgres}
        self._specs = {derived_target(spec.name): spec for spec, _d in self.derived}
        #: every derived output's target in config order (default: Delta ones, then these)
        self._order = tuple(order) or (*self._specs, *self.postgres)
        #: a thread per derived Delta output: their checks and MERGEs run at once, each
        #: output's on its own thread (jobs/publish/lanes.py says why)
        self._lanes = Lanes()

    @classmethod
    def for_config(cls, config: PipelineConfig) -> DeltaPublisher:
        """The pipeline's tables, all opened with its storage options."""
        return cls(**config_targets(config))

    def _outputs(self) -> tuple[tuple[str, DeltaTarget], ...]:
        """Every output, in the order a batch is published to them: the quarantine, the
        derived outputs in config order, the data table last (its log says a batch is
        complete: every output before it holds what it holds)."""
        derived = tuple((derived_target(spec.name), delta) for spec, delta in self.derived)
        return ((QUARANTINE, self.quarantine), *derived, (TABLE, self.table))

    def _app_id(self, target: str, app_id: str) -> str:
        """The application id `target`'s log records the batches of `app_id` under: a
        derived output has its own (resources/config/derived_spec.py `app_id`)."""
        spec = self._specs.get(target)
        return app_id if spec is None else spec.app_id(app_id)

    def committed_version(self, app_id: str) -> int | None:
        """The newest batch id any output holds for `app_id` (invariant 12)."""
        versions = [d.transaction_version(self._app_id(t, app_id)) for t, d in self._outputs()]
        versions += [pg.held_batch(pg.spec.app_id(app_id)) for pg in self.postgres.values()]
        return max((v for v in versions if v is not None), default=None)

    def table_location(self) -> str:
        return self.table.uri

    def quarantine_location(self) -> str:
        return self.quarantine.uri

    def missing_quarantine(self) -> str | None:
        return self.quarantine.uri if self.quarantine.load() is None else None

    def table_holds(self, batch: Batch) -> bool:
        held = self.table.transaction_version(batch.app_id)
        return held is not None and held >= batch.batch_id

    def committed_ranges(self, batch: Batch) -> list[OffsetRange] | None:
        """The ranges of the data table's commit of the batch's id (None: no such commit)."""
        found = self.table.batch_commit(batch.app_id, batch.batch_id)
        return None if found is None else [OffsetRange.from_dict(r) for r in found["ranges"]]

    def other_writers(self) -> dict[str, dict[str, Any]]:
        """Other pipelines' batches in the quarantine or the data table, by application id
        (resources/delta/log.py `other_writers`): the topics each read, its newest batch."""
        tables = [d.load() for d in (self.quarantine, self.table)]
        return other_writers([t for t in tables if t is not None], self.app_ids)

    def topics_in_rows(self, topics: Collection[str]) -> dict[str, set[str]]:
        """Which of `topics` the rows of the quarantine and the data table hold, by location,
        whoever wrote them (resources/delta/log.py `topics_in_rows`)."""
        loaded = [(d.uri, d.load()) for d in (self.quarantine, self.table)]
        held = {uri: topics_in_rows(t, uri, topics) for uri, t in loaded if t is not None}
        return {uri: found for uri, found in held.items() if found}

    def committed_batches(self, app_id: str) -> list[dict[str, Any]]:
        """Every batch of `app_id` in any output's log, oldest first, one entry each.

        `outputs` names the outputs whose log has the batch; `complete` is whether the data
        table, published last, holds it (its version is at or past the batch id; the
        version, not the log, decides, so a data-table log cleaned up by retention still
        counts). An incomplete batch was committed to the quarantine and/or some derived
        outputs only (invariant 12). `table_version` is the data table's version of the
        commit, when it has one. A derived output's entries carry the pipeline's app id,
        not the output's own (the commit info is the batch's, resources/delta/merge.py adds its).
        """
        merged: dict[int, dict[str, Any]] = {}
        for target, delta in self._outputs():
            for entry in delta.committed_batches(self._app_id(target, app_id)):
                entry = {**entry, "app_id": app_id}
                found = merged.setdefault(entry["batch_id"], {**entry, "outputs": []})
                found["outputs"].append(target)
                if target == TABLE:
                    found["table_version"] = entry.get("table_version")
                else:
                    found["table_version"] = None
        table_version = self.table.transaction_version(app_id)
        add_postgres_batches(self.postgres, app_id, table_version, merged)
        for entry in merged.values():
            entry["complete"] = table_version is not None and entry["batch_id"] <= table_version
        return [merged[b] for b in sorted(merged)]

    def outputs_holding(self, batch: Batch) -> set[str]:
        """The outputs whose app-transaction version for the batch's app id (a derived
        output's own) is at or past its id: they already hold the batch, and the commit
        leaves them alone."""
        delta = {
            target
            for target, delta in self._outputs()
            if (v := delta.transaction_version(self._app_id(target, batch.app_id))) is not None
            and v >= batch.batch_id
        }
        return delta | {
            target
            for target, pg in self.postgres.items()
            if (v := pg.held_batch(pg.spec.app_id(batch.app_id))) is not None
            and v >= batch.batch_id
        }

    def rows_held(self, batch: Batch, target: str, not_by: Collection[int] = ()) -> int | None:
        """Rows of the table `target` whose coordinates fall in the batch's ranges, leaving
        out rows written by the batches `not_by` (their `_batch_id`); None for a derived
        output, whose rows are groups or latest records, not the batch's records
        (jobs/publish/raw_rows.py `rows_held_in`)."""
        if is_derived(target):
            return None
        return rows_held_in(dict(self._outputs())[target].load(), batch.ranges, not_by)

    def file_size(self, target: str, path: str) -> int | None:
        """A staged file's size now (None if gone); `path` is relative to its table's root."""
        pg = self.postgres.get(target)
        root = pg.root if pg is not None else dict(self._outputs())[target].uri
        return storage.file_size(storage.join(root, path))

    def check_schemas(self, schemas: Mapping[str, str]) -> None:
        """Refuse, before the vote, staged schemas an output cannot take (invariant 14).

        Every output is checked on every batch, also a quarantine this batch leaves empty:
        a transform's incompatible quarantine schema then fails at once, not on the first
        batch that happens to hold a bad record. A table not created yet takes any schema.
        A derived output's partial must fit its table as it is (resources/delta/merge.py's rule,
        which the MERGE applies again: no new columns yet), and the output must not be
        behind the raw table (`check_not_behind`). The raw table and the quarantine must
        not have been restored behind the pipeline (jobs/publish/restore_check.py).
        """
        self.check_not_behind(self.app_ids)
        for target, delta in ((QUARANTINE, self.quarantine), (TABLE, self.table)):
            table = delta.load()  # once for both checks
            refuse_restored(delta, self.app_ids, table)
            if target in schemas:
                delta.check_schema(decode_schema(schemas[target]), table)

        def fits(spec: AggregateOutput | UpsertOutput, delta: DeltaTarget) -> None:
            target = derived_target(spec.name)
            table = delta.load() if target in schemas else None
            if table is not None:
                if isinstance(spec, AggregateOutput):
                    check_aggregate_layout(table, delta.uri, spec)
                generated = delta.generated_columns
                refuse_unwritable(table, delta.uri, voted=False, generated=generated, merged=True)
                _check_schema(table, table_schema(spec, schemas[target]), delta.uri, spec.name)

        self._each_derived(fits)
        for target, pg in self.postgres.items():
            if target in schemas:
                pg.check_schema(decode_schema(schemas[target]))

    def check_replace(self, batch: Batch, files: Sequence[StagedFile]) -> None:
        """Refuse, before the vote, a replace that would delete rows it does not stage again
        (records Kafka no longer holds: jobs/publish/replace_keeps.py)."""
        refuse_replace_losing_rows(
            batch, files, ((QUARANTINE, self.quarantine), (TABLE, self.table))
        )

    def replace_refusals(self) -> list[str]:
        """Why the raw table or the quarantine as they are now cannot take a replace (one
        sentence each): change data feed on, resources/delta/features.py. Derived outputs
        follow a replace by a MERGE, which writes its own change data."""
        reasons = (self.quarantine.replace_refusal(), self.table.replace_refusal())
        return [r for r in reasons if r is not None]

    def check_not_behind(self, app_ids: Collection[str]) -> None:
        """Refuse to merge into a derived output that holds no batch, or fewer, of an
        application id whose batches the raw table holds: a new output on a pipeline with
        history, an output whose table was deleted, one out of the config while batches
        committed. Merged from here it would miss those batches for ever, silently (a MERGE
        into a missing table creates it, and a Delta output's version check only skips
        what it holds); it must be built from the raw table first (jobs/derived/rebuild.py).
        A PostgreSQL output is asked too: its compare-and-set would refuse such a batch,
        but only at the commit. Checked before the vote, where the refusal abandons the
        batch, and again at the commit, where it keeps a voted batch waiting (invariant 5)
        for the rebuild."""
        holds = self._raw_holds(app_ids)
        reasons = self._each_derived(lambda spec, delta: behind(spec, delta, holds))
        for pg in self.postgres.values():
            reasons += [postgres_behind(pg, app_id, held) for app_id, held in holds.items()]
        for reason in reasons:
            if reason is not None:
                raise RefusedBatchError(reason)

    def _raw_holds(self, app_ids: Collection[str]) -> dict[str, int | None]:
        """Each of `app_ids`' last batch in the raw table, read here, once, for every
        derived output's check: the raw table stays this thread's, never a lane's."""
        return {app_id: self.table.transaction_version(app_id) for app_id in app_ids}

    def _each_derived(
        self, task: Callable[[AggregateOutput | UpsertOutput, DeltaTarget], T]
    ) -> list[T]:
        """`task` for every derived Delta output, each on the output's lane, all at once;
        the results in config order, the first failure in config order raised once all
        ended (jobs/publish/lanes.py)."""
        return self._lanes.run(
            [
                (derived_target(spec.name), functools.partial(task, spec, delta))
                for spec, delta in self.derived
            ]
        )

    def rows_reach(self, topic: str) -> dict[int, int]:
        """Per partition, one past the highest offset of `topic` in either table's rows:
        where reading continues without a gap or a duplicate, when the log cannot say."""
        reach = self.table.offset_reach(topic)
        for partition, end in self.quarantine.offset_reach(topic).items():
            reach[partition] = max(end, reach.get(partition, end))
        return reach

    def compact(self) -> dict[str, Compaction | None]:
        """Compact both tables (resources/delta/table.py `DeltaTarget.compact`), by target."""
        return {target: delta.compact() for target, delta in self._outputs()}

    def compact_one(self, target: str) -> Compaction | None:
        """Compact the output named `target` (a key of `layouts`)."""
        return dict(self._outputs())[target].compact()

    def layouts(self) -> dict[str, TableLayout | None]:
        """Both tables' file count and bytes, by target."""
        return {target: delta.layout() for target, delta in self._outputs()}

    def table_stats(self, app_id: str, version: int | None = None) -> TableStats | None:
        """The data table's version, row count and `app_id`'s last batch, for operators, as
        of `version` (default: the latest)."""
        return self.table.stats(app_id, version)

    def quarantine_stats(self, app_id: str) -> TableStats | None:
        """The quarantine table's version, row count and `app_id`'s last batch: the
        quarantine is an asset of its own in the UI, with its own history."""
        return self.quarantine.stats(app_id)

    def publish(self, batch: Batch, files: Sequence[StagedFile]) -> PublishResult:
        """Quarantine first, then the derived Delta outputs at once (each on its own thread:
        `_merge_derived`), then the PostgreSQL outputs in config order, the data table last;
        refused before any of them when the data table holds another pipeline's batches of
        its topics and none of this one's (resources/delta/writers.py), and while it or the
        quarantine is restored behind the pipeline (jobs/publish/restore_check.py).

        The data table's log is what says a batch is complete (invariant 7); publishing the
        other outputs first means a batch found there has its quarantined records and its
        derived changes published too, so a rebuild never forgets them. Each derived
        output MERGEs the batch's voted partial (resources/delta/merge.py), skipped when its own
        app transaction holds the batch already; what each did is in the result's
        metrics. A replace backfill removes the old rows of its ranges from both tables in
        the same commit that adds the new ones, and applies to each derived output the
        correction that keeps it equal to its recomputation (jobs/publish/derived_outputs.py).
        """
        meta = batch.commit_metadata()
        replace = batch.params.get("mode") == "replace"
        if replace and self.postgres:
            raise InconsistencyError(
                f"batch {batch.label} is a replace backfill, and a replace cannot correct a "
                "PostgreSQL output (resources/config/derived_spec.py replace_refusal); it "
                "should have been refused"
            )
        targets = [*(t for t, _d in self._outputs()), *self.postgres]
        by_target = files_by_target(batch, targets, self._order, files)
        raw = refuse_before_publish(self.table, batch.app_id, meta)
        refuse_restored(self.quarantine, self.app_ids, voted=True)
        refuse_restored(self.table, self.app_ids, raw, voted=True)
        if any(f.records for f in by_target[QUARANTINE]) or (replace and self.quarantine.load()):
            publish_rows(batch, QUARANTINE, self.quarantine, by_target[QUARANTINE], meta)
        merged = self._merge_derived(batch, by_target, meta)
        for target, pg in self.postgres.items():
            crashpoint("between_derived_commits", pg.spec.name)
            merged[pg.spec.name] = postgres_outcome(
                self._apply_postgres(batch, pg, by_target[target], meta)
            )
        crashpoint("between_table_commits")
        outcome = publish_rows(batch, TABLE, self.table, by_target[TABLE], meta)
        # what each derived output did, in config order, as `exactly ledger` lists them
        names = [t.removeprefix(derived_target("")) for t in self._order]
        ordered = {name: merged[name] for name in names if name in merged}
        metrics = {DERIVED_METRICS: ordered} if ordered else {}
        return PublishResult(outcome.published, outcome.table_version, metrics)

    def _merge_derived(
        self,
        batch: Batch,
        by_target: Mapping[str, Sequence[StagedFile]],
        metadata: Mapping[str, Any],
    ) -> dict[str, Any]:
        """MERGE the batch into every derived Delta output at once, each on its own lane
        (jobs/publish/lanes.py); what each did, by output name.

        Each lane reaches `between_derived_commits` before its MERGE and
        `after_derived_commit` after it, both for its output (ledger/coordinator/crash.py):
        a kill at the first before any lane's MERGE leaves no derived output holding the
        batch, since every lane passes it before committing; a kill anywhere later leaves
        any subset holding it, which recovery finishes output by output. Whether each
        output is behind the raw table is decided on the raw table's versions read once,
        here, before any lane starts, as one read per output did before: this batch's own
        raw-table commit comes only after every lane ended, and any other writer's batch
        reaches every derived output before the raw table, so a version read a little
        earlier cannot hide an output that lacks the raw table's history."""
        holds = self._raw_holds(dict.fromkeys((batch.app_id, *self.app_ids)))
        table_files = by_target[TABLE]

        def one(spec: AggregateOutput | UpsertOutput, delta: DeltaTarget) -> dict[str, Any]:
            crashpoint("between_derived_commits", spec.name)
            files = by_target[derived_target(spec.name)]
            outcome = self._merge(batch, spec, delta, files, metadata, table_files, holds)
            crashpoint("after_derived_commit", spec.name)
            return merge_outcome(outcome)

        done = self._each_derived(one)
        return {spec.name: d for (spec, _delta), d in zip(self.derived, done, strict=True)}

    def _apply_postgres(
        self,
        batch: Batch,
        pg: PostgresTarget,
        files: Sequence[StagedFile],
        metadata: Mapping[str, Any],
    ) -> PostgresOutcome:
        """Apply the batch's voted partial to PostgreSQL output `pg`: its previous batch is
        the data table's version (jobs/publish/postgres_outputs.py `apply_postgres`)."""

        def partial() -> pa.Table:
            return self.read_partial(batch, pg.spec, pg.root, files)

        return apply_postgres(batch, pg, self.table, partial, metadata)

    def _merge(
        self,
        batch: Batch,
        spec: AggregateOutput | UpsertOutput,
        delta: DeltaTarget,
        files: Sequence[StagedFile],
        metadata: Mapping[str, Any],
        table_files: Sequence[StagedFile] = (),
        raw_holds: Mapping[str, int | None] | None = None,
    ) -> MergeOutcome:
        """jobs/publish/derived_outputs.py `merge_batch` on this pipeline's raw table; the
        raw table's versions read here when the caller has none (`_raw_holds`)."""
        if raw_holds is None:
            # every app id of the pipeline, not only the batch's: a fill merged into a
            # deleted table would re-create it short of every live batch
            raw_holds = self._raw_holds(dict.fromkeys((batch.app_id, *self.app_ids)))
        return merge_batch(batch, spec, delta, self.table, files, metadata, table_files, raw_holds)

    #: the voted partial of an output, read back (jobs/publish/derived_outputs.py)
    read_partial = staticmethod(read_partial)
