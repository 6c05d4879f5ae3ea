"""The protocol's publisher (ledger/coordinator/two_phase.py `Publisher`): a pipeline's data table,
its
quarantine table and its derived outputs (derived/), published together, batch by batch,
with delta-rs.

Every commit carries the batch's offsets in its metadata, so any output's log can rebuild a
lost ledger (invariant 7); each output is idempotent on its own by its application
transaction version (a derived output's is `<app id>.derived.<name>`), and a batch found in
some outputs' logs but not the data table's, published last (a crash between the commits),
is reported unfinished, never forgotten (invariant 12).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from jobs.derived.invariants import recompute_aggregate
from jobs.derived.rebuild import behind_reason
from jobs.derived.replace import correction_partial, in_ranges, upsert_replacement
from jobs.stage.staging import attempt_folder
from ledger.coordinator.crash import crashpoint
from ledger.core.backfill import backfill_app_id
from ledger.core.batch import Batch, StagedFile
from ledger.core.errors import InconsistencyError, RefusedBatchError
from ledger.core.layout import (
    BATCH_ID,
    OFFSET,
    PARTITION,
    QUARANTINE,
    TABLE,
    TOPIC,
    derived_target,
    is_derived,
)
from ledger.core.ports import PublishResult
from ledger.core.protocol import OffsetRange
from resources.config.derived_spec import (
    ABSENT,
    DELETED,
    AggregateOutput,
    AnyOutput,
    PostgresOutput,
    UpsertOutput,
)
from resources.config.pipeline_config import PipelineConfig
from resources.delta.merge import MergeOutcome, _check_schema, merge_aggregate, merge_upsert
from resources.delta.table import Compaction, DeltaTarget, TableLayout, TableStats, decode_schema
from resources.object_storage import storage
from resources.postgres.outputs import PostgresOutcome, PostgresTarget, apply_partial, held_state

#: The batch metrics key of what each derived output's commit did (`merge_outcome`).
DERIVED_METRICS = "derived"


def commit_metadata(batch: Batch) -> dict[str, Any]:
    """What every commit carries so the Delta log alone can rebuild the ledger: with the
    ranges, the topic incarnation they were read from (invariant 10) and the operator
    decisions taken since the previous batch (invariant 15)."""
    return {
        "app_id": batch.app_id,
        "pipeline": batch.pipeline,
        "kind": batch.kind,
        "batch_id": batch.batch_id,
        "attempt": batch.attempt,
        "ranges": [r.as_dict() for r in batch.ranges],
        "params": batch.params,
        "topic_id": batch.topic_id,
        # every topic's id, by name (a batch on several topics; invariant 10)
        "topic_ids": batch.topic_ids,
        "decisions": [d.as_dict() for d in batch.decisions],
    }


def held_state_of(pg: PostgresTarget, app_id: str) -> tuple[int | None, dict[str, Any] | None]:
    """The batch PostgreSQL output `pg` holds of the pipeline's `app_id`, and its commit
    info (resources/postgres/outputs.py `held_state`)."""
    return held_state(pg.engine, pg.spec, pg.spec.app_id(app_id))


def postgres_outcome(outcome: PostgresOutcome) -> dict[str, Any]:
    """What a PostgreSQL output's transaction did, as `merge_outcome` says a MERGE's: the
    state's batch id stands for the version."""
    return {
        "applied": outcome.applied,
        "held_batch_id": outcome.held_batch_id,
        "seconds": round(outcome.seconds, 4),
        "tries": outcome.tries,
        "rows_upserted": int(outcome.metrics.get("rows_upserted", 0) or 0),
    }


def merge_outcome(outcome: MergeOutcome) -> dict[str, Any]:
    """What a derived output's commit did, as the batch's metrics keep it (for `exactly
    ledger` and the Dagster materializations)."""
    rows = {
        "rows_inserted": "num_target_rows_inserted",
        "rows_updated": "num_target_rows_updated",
        "rows_deleted": "num_target_rows_deleted",
    }
    return {
        "applied": outcome.applied,
        "version": outcome.table_version,
        "seconds": round(outcome.seconds, 4),
        "tries": outcome.tries,
        **{name: int(outcome.metrics.get(key, 0) or 0) for name, key in rows.items()},
    }


class DeltaPublisher:
    """The data table, its quarantine table and its derived outputs, published batch by
    batch."""

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

    @classmethod
    def for_config(cls, config: PipelineConfig) -> DeltaPublisher:
        """The pipeline's tables, all opened with its storage options."""
        options = config.delta.resolved_storage_options()
        return cls(
            DeltaTarget(config.delta.table_uri, options, config.delta.partition_by),
            DeltaTarget(config.delta.quarantine_uri, options),
            [
                (spec, DeltaTarget(spec.table_uri, options, **_partitioning(spec)))
                for spec in config.derived
                if not isinstance(spec, PostgresOutput)
            ],
            [
                PostgresTarget(spec, config.delta.table_uri)
                for spec in config.derived
                if isinstance(spec, PostgresOutput)
            ],
            [derived_target(spec.name) for spec in config.derived],
            (config.app_id, backfill_app_id(config.pipeline)),
        )

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
        self._postgres_batches(app_id, table_version, merged)
        for entry in merged.values():
            entry["complete"] = table_version is not None and entry["batch_id"] <= table_version
        return [merged[b] for b in sorted(merged)]

    def _postgres_batches(
        self, app_id: str, table_version: int | None, merged: dict[int, dict[str, Any]]
    ) -> None:
        """Add to `merged` the batch a PostgreSQL output holds past the data table.

        Its state row keeps only the last batch applied, with that batch's commit info; that
        is enough: an output is applied before the data table, batch after batch in order,
        so it is at most one batch past it, and a batch at or below the table's version is
        complete whatever the other logs say. A batch the output holds past the table is
        entered incomplete (invariant 12: re-staged and finished, never forgotten).
        """
        for target, pg in self.postgres.items():
            held, meta = held_state_of(pg, app_id)
            if held is None or (table_version is not None and held <= table_version):
                continue
            if meta is None or "ranges" not in meta:
                raise InconsistencyError(
                    f"{pg.where} holds batch {app_id}/{held}, past the data table, but its "
                    "state row has no commit info to rebuild the batch from (invariant 7)"
                )
            entry = {**meta, "app_id": app_id, "batch_id": held}
            found = merged.setdefault(held, {**entry, "outputs": []})
            found["outputs"].append(target)
            found.setdefault("table_version", None)

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
        output, whose rows are groups or latest records, not the batch's records.

        Files are pruned by partition and offset only. A topic name longer than the
        statistics keep (resources/delta/table.py) has no min/max, and delta-rs 1.6 then prunes
        every file on a topic filter (it compares with null), so the topic is matched on
        the rows read.
        """
        if is_derived(target):
            return None
        table = dict(self._outputs())[target].load()
        if table is None:
            return 0
        dataset = table.to_pyarrow_dataset()
        held = 0
        for topic in sorted({r.topic for r in batch.ranges if r.span}):
            wanted = _offsets_filter(r for r in batch.ranges if r.span and r.topic == topic)
            if not_by and wanted is not None:
                wanted = wanted & ~pc.field(BATCH_ID).isin(sorted(not_by))
            rows = dataset.to_table(columns=[TOPIC], filter=wanted)
            held += pc.sum(pc.equal(rows[TOPIC], topic).cast("int64")).as_py() or 0
        return held

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
        behind the raw table (`check_not_behind`).
        """
        self.check_not_behind(self.app_ids)
        for target, delta in ((QUARANTINE, self.quarantine), (TABLE, self.table)):
            if target in schemas:
                delta.check_schema(decode_schema(schemas[target]))
        for spec, delta in self.derived:
            target = derived_target(spec.name)
            table = delta.load() if target in schemas else None
            if table is not None:
                _check_schema(
                    table, self._table_schema(spec, schemas[target]), delta.uri, spec.name
                )
        for target, pg in self.postgres.items():
            if target in schemas:
                pg.check_schema(decode_schema(schemas[target]))

    def check_not_behind(self, app_ids: Collection[str]) -> None:
        """Refuse to merge into a derived output that holds no batch of an application id
        whose batches the raw table holds: a new output on a pipeline with history, or an
        output whose table was deleted. Merged from here it would miss every earlier batch
        for ever, silently (a MERGE into a missing table creates it); it must be built
        from the raw table first (jobs/derived/rebuild.py). Checked before the vote, where the
        refusal abandons the batch, and again at the commit, where it keeps a voted batch
        waiting (invariant 5) for the rebuild."""
        for spec, delta in self.derived:
            reason = self._behind(spec, delta, app_ids)
            if reason is not None:
                raise RefusedBatchError(reason)

    def _behind(
        self, spec: AggregateOutput | UpsertOutput, delta: DeltaTarget, app_ids: Iterable[str]
    ) -> str | None:
        """Why the output is behind the raw table on one of `app_ids`, or None."""
        for app_id in app_ids:
            reason = behind_reason(spec, delta, self.table, app_id)
            if reason is not None:
                return reason
        return None

    @staticmethod
    def _table_schema(spec: AggregateOutput | UpsertOutput, encoded: str) -> pa.Schema:
        """The columns a partial brings to its table. An upsert table keeps its tombstones
        as rows, so `_deleted` is one of them, never null there (resources/delta/merge.py
        `merge_upsert` writes it so): a partial's nullable flag must not read as a change."""
        schema = decode_schema(encoded)
        if isinstance(spec, UpsertOutput) and DELETED in schema.names:
            at = schema.get_field_index(DELETED)
            schema = schema.set(at, pa.field(DELETED, pa.bool_(), nullable=False))
        return schema

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
        """Quarantine first, then the derived outputs in config order, the data table last.

        The data table's log is what says a batch is complete (invariant 7); publishing the
        other outputs first means a batch found there has its quarantined records and its
        derived changes published too, so a rebuild never forgets them. Each derived
        output MERGEs the batch's voted partial (resources/delta/merge.py), skipped when its own
        app transaction holds the batch already; what each did is in the result's
        metrics. A replace backfill removes the old rows of its ranges from both tables in
        the same commit that adds the new ones, and applies to each derived output the
        correction that keeps it equal to its recomputation (`_merge_replace`).
        """
        meta = commit_metadata(batch)
        replace = batch.params.get("mode") == "replace"
        if replace and self.postgres:
            raise InconsistencyError(
                f"batch {batch.label} is a replace backfill, and a replace cannot correct a "
                "PostgreSQL output (resources/config/derived_spec.py replace_refusal); it "
                "should have been refused"
            )
        by_target: dict[str, list[StagedFile]] = {t: [] for t, _d in self._outputs()}
        by_target.update({t: [] for t in self.postgres})
        for f in files:
            if f.target not in by_target:
                raise InconsistencyError(
                    f"batch {batch.label} voted files for output {f.target}, which the "
                    "config no longer has: restore the output to publish the batch"
                )
            by_target[f.target].append(f)
        lacking = [t for t in self._order if t not in batch.schemas]
        if lacking:
            raise InconsistencyError(
                f"batch {batch.label} voted before output(s) {', '.join(lacking)} were "
                "configured, so it has no partial for them: remove them until it is published"
            )
        outcome = None
        merged: dict[str, Any] = {}
        for target, delta in self._publish_order():
            if target == TABLE:
                crashpoint("between_table_commits")
            pg = self.postgres.get(target)
            if pg is not None:
                crashpoint("between_derived_commits")
                merged[pg.spec.name] = postgres_outcome(
                    self._apply_postgres(batch, pg, by_target[target], meta)
                )
                continue
            spec = self._specs.get(target)
            if spec is not None:
                crashpoint("between_derived_commits")
                merged[spec.name] = merge_outcome(
                    self._merge(batch, spec, delta, by_target[target], meta, by_target[TABLE])
                )
                continue
            has_rows = any(f.records for f in by_target[target])
            if target == QUARANTINE and not has_rows and not (replace and delta.load()):
                continue
            common = {
                "app_id": batch.app_id,
                "batch_id": batch.batch_id,
                "files": by_target[target],
                "schema": decode_schema(batch.schemas[target]),
                "metadata": meta,
            }
            if replace:
                rewrites = attempt_folder(
                    delta.uri, batch.app_id, batch.batch_id, batch.attempt, batch.token
                )
                outcome = delta.replace(
                    **common, ranges=batch.ranges, rewrite_dir=f"{rewrites}-rewrites"
                )
            else:
                outcome = delta.publish(**common)
        assert outcome is not None
        metrics = {DERIVED_METRICS: merged} if merged else {}
        return PublishResult(outcome.published, outcome.table_version, metrics)

    def _publish_order(self) -> list[tuple[str, DeltaTarget]]:
        """`_outputs` with the PostgreSQL outputs among the derived ones in config order
        (their entry's DeltaTarget is the data table's, never used: `publish` dispatches
        them by target first)."""
        delta = dict(self._outputs())
        derived = [(t, delta.get(t, self.table)) for t in self._order]
        return [(QUARANTINE, self.quarantine), *derived, (TABLE, self.table)]

    def _apply_postgres(
        self,
        batch: Batch,
        pg: PostgresTarget,
        files: Sequence[StagedFile],
        metadata: Mapping[str, Any],
    ) -> PostgresOutcome:
        """Apply the batch's voted partial to PostgreSQL output `pg`, by the compare-and-set
        on the batch id (resources/postgres/outputs.py), which needs the previous committed batch of
        the app id. It is read from the data table, not passed in (the Publisher protocol
        stays as it is): the data table is published last, batch after batch, so while it
        does not hold this batch its app-transaction version IS the last batch of the app
        id committed whole (invariant 5: one batch in flight per app id, in order).

        - first batch of the app id: the table has no version (None); the output's state
          has none either, and the batch applies;
        - ABORTED ids leave gaps (batch 7 after 4): the table says 4, the state holds 4;
        - a re-drive after the data table already holds the batch (a crash after the table
          commit; a racing committer that finished first): every output before the table
          holds it, so nothing is applied; the output must hold it, or it was reset behind
          the pipeline's back (a restored backup, a dropped state row) and that is refused
          loudly rather than applied against the wrong previous id;
        - a lost ledger: nothing here reads the ledger; a rebuilt batch the output holds
          past the table (`_postgres_batches`) is re-driven and skipped by the state's id;
        - a backfill (fill) batch: its app id (`<pipeline>.backfill`) has its own version
          in the data table and its own state row (resources/config/derived_spec.py `app_id`), so
          live and
          backfill ids never meet; a replace is refused before it is planned;
        - a racing committer that read the table's version before the other finished: the
          row lock serialises them and the state's id (at or past the batch) skips it.

        An output whose state does not hold the table's previous batch (a state row
        deleted, a PostgreSQL output added to a pipeline with history) is refused by the
        compare-and-set (InconsistencyError): the batch stays PREPARED, the pipeline stops
        and alerts; it is never skipped.
        """
        app_id = pg.spec.app_id(batch.app_id)
        previous = self.table.transaction_version(batch.app_id)
        if previous is not None and previous >= batch.batch_id:
            held = pg.held_batch(app_id)
            if held is None or held < batch.batch_id:
                raise InconsistencyError(
                    f"{pg.where}: the data table holds batch {batch.label} but the output "
                    f"holds {'none' if held is None else held} of {app_id}: it was reset "
                    "behind the pipeline (invariant 12); rebuild it from the raw table"
                )
            return PostgresOutcome(applied=False, held_batch_id=held, tries=0, seconds=0.0)
        partial = self.read_partial(batch, pg.spec, pg.root, files)
        return apply_partial(
            pg.engine, pg.spec, app_id, batch.batch_id, previous, partial, metadata
        )

    def _merge(
        self,
        batch: Batch,
        spec: AggregateOutput | UpsertOutput,
        delta: DeltaTarget,
        files: Sequence[StagedFile],
        metadata: Mapping[str, Any],
        table_files: Sequence[StagedFile] = (),
    ) -> MergeOutcome:
        """MERGE the batch's voted partial into derived output `spec`'s table, under the
        output's own app transaction, carrying the batch's commit info (invariant 7); for a
        replace batch, the correction `_merge_replace` computes (`table_files`: the batch's
        voted raw-table files, its new rows)."""
        # every app id of the pipeline, not only the batch's: a fill merged into a deleted
        # table would re-create it short of every live batch
        reason = self._behind(spec, delta, dict.fromkeys((batch.app_id, *self.app_ids)))
        if reason is not None:
            raise InconsistencyError(reason)
        partial = self.read_partial(batch, spec, delta.uri, files)
        common: dict[str, Any] = {
            "app_id": spec.app_id(batch.app_id),
            "batch_id": batch.batch_id,
            "metadata": metadata,
        }
        if batch.params.get("mode") == "replace":
            return self._merge_replace(batch, spec, delta, partial, table_files, common)
        if isinstance(spec, AggregateOutput):
            return merge_aggregate(delta, spec, partial, **common)
        return merge_upsert(delta, spec, partial, **common)

    def _merge_replace(
        self,
        batch: Batch,
        spec: AggregateOutput | UpsertOutput,
        delta: DeltaTarget,
        partial: pa.Table,
        table_files: Sequence[StagedFile],
        common: Mapping[str, Any],
    ) -> MergeOutcome:
        """Apply a replace batch to derived output `spec`: the correction that makes it
        equal its recomputation over the raw rows as the raw table's replace leaves them.

        What is applied (jobs/derived/replace.py):
        - an aggregate: the correction partial, the batch's voted partial (its new rows)
          minus the old rows' partial, merged with `correction=True` (a group whose count
          reaches 0 is deleted);
        - an upsert: the affected keys' new state (the latest record over the raw rows
          outside the ranges plus the new rows, or `_absent`), merged with
          `replaced=ranges` (the rows the ranges hold are overwritten whatever their order).

        The old rows are the raw table's rows whose coordinates fall in the batch's ranges,
        read from the raw table's latest snapshot, which must not hold the batch yet
        (checked on that same snapshot). They must be exactly the rows the raw table's own
        replace removes (resources/delta/table.py `DeltaTarget.replace`, which finds them on the
        snapshot it commits on, later): a row subtracted here and not removed there, or
        the other way round, is a record counted twice or lost in the output (invariant
        1). Why the latest snapshot, and not one pinned when the replace was planned or
        voted, and why every case below ends equal:

        - Nothing but this batch's own raw-table commit changes the raw rows in its
          ranges. Live batches and fills only add rows at offsets no committed batch
          holds (ledger/core/backfill.py: a fill takes only uncovered offsets below the live
          position, the live pipeline reads on from its own), and the replace's ranges
          are all committed; a replace is refused while any batch over its ranges is in
          flight, and fills and replaces share the backfill app id, one batch in flight at
          a time, so no second replace of overlapping ranges can commit in between (its
          planning first finishes this one: `plan_backfill` recovers before it plans;
          tests/test_backfill_plan.py `test_two_replaces_of_overlapping_ranges_...`).
          Compaction rewrites files but keeps every row; vacuum removes only files the
          latest snapshot no longer references. So the rows in the ranges are the same at the
          plan, at the vote, now, and on the snapshot the raw table's replace commits on;
          the latest snapshot reads them without needing an old version's files to be
          kept (a version pinned at planning could be vacuumed before a late re-drive).
        - The raw table is committed last (`_outputs`). While any derived output lacks the
          batch, the raw table lacks it too, so every output's correction is computed
          before the replace has removed anything, on a snapshot that does not hold the
          batch. A snapshot that holds it while this output does not cannot happen in
          order; it is refused (InconsistencyError), never merged as a zero correction.
        - A crash between derived commits (`between_derived_commits`), then a re-drive with
          the ledger kept: the outputs that committed skip by their own app transaction
          (here, before the raw table is even read); each output left computes its
          correction afresh from the same voted files and the same old rows (the raw
          table still lacks the batch), so the same correction it would have applied.
          A crash after the derived commits (`between_table_commits`) leaves only the raw
          table's replace, which is idempotent by its own app transaction.
        - The ledger lost: the logs that hold the batch re-create it
        (ledger/coordinator/two_phase.py
          recovery) and it is staged again over the same ranges with the transform its
          params name, so its new rows are the same records; the old rows are read as
          above; outputs that hold the batch skip. The correction is a function of
          (new rows, old rows), not of which attempt staged them.
        - A live batch committing between the replace's plan and its publish, or between
          two of its derived commits: it adds rows outside the ranges only. An aggregate
          correction is a sum of deltas, which commutes with the live batch's partial. An
          upsert's affected keys may meanwhile have a newer record a live batch merged
          (it is outside the ranges, so the MERGE's order compare keeps it over the
          replacement computed without it), or the live batch may merge after the
          replace (its order compare then sees the replacement). Two processes publishing
          the same replace (a stale attempt: fencing stops it at the ledger, but its reads
          may already have happened): the MERGE re-checks the app transaction in its own
          loop on the table it commits on, and a raw table that already holds the batch
          means every derived output held it first.
        - Types: the old rows' partial is recomputed with pyarrow (the check's own
          functions, jobs/derived/invariants.py) and cast to the voted partial's schema
          (`correction_partial`); the upsert replacement is cast to the voted partial's
          columns and types, plus `_absent`. The new side of an aggregate is the voted
          partial itself, so what Spark computed and the vote fixed is what is added.

        Computing the correction at stage time and voting it as the partial would make the
        vote fix the exact correction too, but only by reading the old rows before the
        vote, and they must still be the rows the replace removes at commit time: by the
        first point they are, so both are equally safe; reading them here keeps the stage
        a function of Kafka alone and needs no second partial kind in the vote.
        """
        app_id = str(common["app_id"])
        started = time.perf_counter()
        held = delta.transaction_version(app_id)
        if held is not None and held >= batch.batch_id:
            table = delta.load()
            version = -1 if table is None else table.version()
            return MergeOutcome(False, version, 1, time.perf_counter() - started)
        raw = self.table.load()
        raw_held = None if raw is None else raw.transaction_version(batch.app_id)
        if raw is None or (raw_held is not None and raw_held >= batch.batch_id):
            raise InconsistencyError(
                f"batch {batch.label} is a replace the raw table at {self.table.uri} "
                f"{'does not exist for' if raw is None else 'holds already'}, but derived "
                f"output {spec.name} does not hold it: its correction can no longer be "
                "computed (the old rows are gone); rebuild the output from the raw table"
            )
        dataset = raw.to_pyarrow_dataset()
        old = _rows_in_ranges(dataset, batch.ranges)
        new = self._staged_rows(table_files, old.schema)
        if isinstance(spec, AggregateOutput):
            correction = correction_partial(recompute_aggregate(old, spec), partial, spec)
            return merge_aggregate(delta, spec, correction, correction=True, **common)
        # every old row's key is affected, so the rows of the affected keys hold the old rows
        candidates = _rows_of_keys(dataset, spec.key_columns, [old, new])
        replacement = upsert_replacement(candidates, batch.ranges, new, spec)
        schema = partial.schema.append(pa.field(ABSENT, pa.bool_()))
        columns = {
            f.name: replacement[f.name].cast(f.type)
            if f.name in replacement.column_names
            else pa.nulls(replacement.num_rows, f.type)
            for f in schema
        }
        shaped = pa.table(columns, schema=schema)
        return merge_upsert(delta, spec, shaped, replaced=batch.ranges, **common)

    def _staged_rows(self, files: Sequence[StagedFile], like: pa.Schema) -> pa.Table:
        """The batch's voted raw-table files read back (its new rows), the columns the raw
        table has cast to its types; a staged file's own columns (`routed`) kept as they
        are (the derived functions drop them)."""
        parts = [
            storage.read_parquet(storage.join(self.table.uri, f.path)) for f in files if f.records
        ]
        if not parts:
            return like.empty_table()
        rows = pa.concat_tables(parts, promote_options="default")
        for i, name in enumerate(rows.column_names):
            if name in like.names:
                rows = rows.set_column(i, name, rows[name].cast(like.field(name).type))
        return rows

    @staticmethod
    def read_partial(
        batch: Batch,
        spec: AggregateOutput | UpsertOutput | PostgresOutput,
        root: str,
        files: Sequence[StagedFile],
    ) -> pa.Table:
        """The voted partial files of the output, read back whole (a partial holds one row
        per group or key, small beside the batch), as the vote's schema says; no file or
        only empty ones is the empty partial, which still records the batch."""
        schema = decode_schema(batch.schemas[derived_target(spec.name)])
        parts = [
            storage.read_parquet(storage.join(root, f.path), schema.names).cast(schema)
            for f in files
            if f.records
        ]
        return pa.concat_tables(parts) if parts else schema.empty_table()


def _rows_in_ranges(dataset: Any, ranges: Sequence[OffsetRange]) -> pa.Table:
    """The raw rows whose coordinates fall in `ranges` (jobs/derived/replace.py `in_ranges`, the
    raw table's replace's own rule), files pruned by partition and offset first."""
    rows = dataset.to_table(filter=_offsets_filter(ranges))
    return rows.filter(in_ranges(rows, ranges))


def _offsets_filter(ranges: Iterable[OffsetRange]) -> pc.Expression | None:
    """A dataset filter on partition and offset only, which prunes files by their
    statistics; the topic is matched on the rows read (`rows_held` says why)."""
    wanted = None
    for r in ranges:
        one = (
            (pc.field(PARTITION) == r.partition)
            & (pc.field(OFFSET) >= r.start)
            & (pc.field(OFFSET) < r.end)
        )
        wanted = one if wanted is None else wanted | one
    return wanted


def _rows_of_keys(dataset: Any, keys: list[str], tables: Sequence[pa.Table]) -> pa.Table:
    """The raw rows whose key is one of those `tables` hold (a superset, per column: the
    caller ignores other keys), null keys included."""
    wanted = None
    for k in keys:
        values = pa.concat_arrays(
            [t[k].combine_chunks().cast(dataset.schema.field(k).type) for t in tables]
        )
        present = pc.unique(values.drop_null())
        one = pc.field(k).isin(present)
        if values.null_count:
            one = one | pc.field(k).is_null()
        wanted = one if wanted is None else wanted & one
    return dataset.to_table(filter=wanted)


def _partitioning(spec: AnyOutput) -> dict[str, Any]:
    """A derived Delta output's partition columns (an aggregate's window dates, plain
    columns: resources/delta/window_dates.py), as DeltaTarget takes them; none for the others."""
    columns = getattr(spec, "partition_by", None)
    return {"partition_by": list(columns), "generated": False} if columns else {}
