"""Applying a batch's partial to a derived output's Delta table, idempotently (delta-rs MERGE).

Through the raw table's compare-and-set loop (resources/delta/commit.py, invariant 2), on the
output's own application id: read the table's app-transaction version, skip if it is at or
past the batch id, else MERGE with the app transaction (app id, batch id) and no automatic
retry. Two writers of one batch race for one table version: one commits, the other fails
with CommitFailedError, re-reads, finds the batch applied, and adds nothing.

Retries must stay off: delta-rs retrying a MERGE rebases it onto the newer version, and the
MERGE it re-runs was planned before the other commit, so a batch's counts could be added
twice (the app transaction is checked by delta-rs only against a concurrent commit of the
same app id, never against the stored version). Every decision is ours, on a fresh read.
This module owns what is the MERGE's own: its SQL per output kind, the schema rule for a
partial, and the commit of a MERGE that changed no row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable
from deltalake.table import TableMerger

from ledger.core.errors import InconsistencyError, RefusedBatchError
from ledger.core.layout import OFFSET, PARTITION, TOPIC
from ledger.core.protocol import OffsetRange
from resources.config.derived_spec import (
    ABSENT,
    DELETED,
    AggregateOutput,
    UpsertOutput,
    correction_count,
)
from resources.config.partitioning import check_layout
from resources.delta.checkpoints import NO_CHECKPOINT
from resources.delta.commit import Try, checkpoint_if_due, commit_batch
from resources.delta.features import refuse_unwritable
from resources.delta.options import store_failure
from resources.delta.schema import widen_schema
from resources.delta.table import DeltaTarget
from resources.delta.upsert_pruning import pruned_partial
from resources.delta.window_dates import held_partitions, with_window_dates
from resources.delta.writer_stats import sound_writer_properties

SOURCE, TARGET = "s", "t"


@dataclass(frozen=True)
class MergeOutcome:
    """What one apply did. `applied` is False when the table held the batch already."""

    applied: bool
    table_version: int
    tries: int
    seconds: float
    #: delta-rs's metrics of the MERGE that applied the batch (rows inserted, updated,
    #: deleted, files rewritten); empty when this call applied nothing
    metrics: Mapping[str, Any] = field(default_factory=dict)


def _q(alias: str, column: str) -> str:
    """A column in the MERGE's SQL, quoted: Delta names keep their case, SQL's do not."""
    return f"{alias}.`{column}`"


def _keys_match(keys: list[str]) -> str:
    """Null-safe equality: a group or key whose value is null is one row, not a new row on
    every batch (`=` is never true for null). Each comparison in parentheses: the SQL parser
    delta-rs uses binds `IS NOT DISTINCT FROM` looser than AND (`a IS NOT DISTINCT FROM b AND
    c` compares a with `b AND c`; tests/test_derived_merge.py's windowed test found it)."""
    return " AND ".join(f"({_q(TARGET, k)} IS NOT DISTINCT FROM {_q(SOURCE, k)})" for k in keys)


def _combined(fn: str, column: str) -> str:
    """How a measure of the table and the batch's partial combine; a null (a sum, min or max
    over nulls only) is no contribution."""
    t, s = _q(TARGET, column), _q(SOURCE, column)
    if fn == "count":
        return f"{t} + {s}"
    if fn == "sum":
        both = f"{t} + {s}"
    else:
        pick = "<" if fn == "min" else ">"
        both = f"CASE WHEN {s} {pick} {t} THEN {s} ELSE {t} END"
    return f"CASE WHEN {t} IS NULL THEN {s} WHEN {s} IS NULL THEN {t} ELSE {both} END"


def _newer(with_topic: bool) -> str:
    """The batch's record comes later in Kafka order than the table's (jobs/derived/partials.py
    says why the order is (partition, offset), then the topic's name: `with_topic`, when the
    partial has the column)."""
    sp, tp = _q(SOURCE, PARTITION), _q(TARGET, PARTITION)
    so, to = _q(SOURCE, OFFSET), _q(TARGET, OFFSET)
    later = f"{so} > {to}"
    if with_topic:
        st, tt = _q(SOURCE, TOPIC), _q(TARGET, TOPIC)
        later = f"({later} OR ({so} = {to} AND {st} > {tt}))"
    return f"({sp} > {tp} OR ({sp} = {tp} AND {later}))"


def merge_aggregate(
    target: DeltaTarget,
    spec: AggregateOutput,
    partial: pa.Table,
    *,
    app_id: str,
    batch_id: int,
    metadata: Mapping[str, Any] | None = None,
    max_tries: int = 20,
    before_commit: Callable[[], None] | None = None,
    correction: bool = False,
) -> MergeOutcome:
    """Add the batch's partial aggregate (jobs/derived/partials.py `aggregate_partial`) to the
    table: counts and sums add, min and max combine, new groups are inserted.

    `correction=True` is for a replace batch's correction partial (jobs/derived/replace.py
    `correction_partial`: new rows minus old, so counts may be negative): a group whose
    count reaches 0 is deleted, as a recomputation over the raw rows after the replace would
    not have it. Only for corrections: an ordinary partial never lowers a count, and an
    output refused by `replace_refusal` (min/max, or no count) is refused here too, since
    its correction cannot be right. Idempotent by the same app transaction as any batch.
    """
    measures = {m.name: _combined(m.fn, m.name) for m in spec.measures}
    count = correction_count(spec) if correction else None
    partial = with_window_dates(partial, spec.partition_by)

    def plan(table: DeltaTable, properties: CommitProperties) -> TableMerger:
        check_aggregate_layout(table, target.uri, spec)
        held = held_partitions(partial, spec.partition_by, TARGET)
        merger = _merger(table, partial, spec.key_columns, properties, held)
        if count is not None:
            emptied = f"{_q(TARGET, count)} + {_q(SOURCE, count)} = 0"
            merger = merger.when_matched_delete(predicate=emptied)
        return merger.when_matched_update(updates=measures).when_not_matched_insert_all()

    return _apply(
        target, spec.name, partial, partial.schema, plan, app_id, batch_id, metadata,
        max_tries, before_commit,
    )  # fmt: skip


def merge_upsert(
    target: DeltaTarget,
    spec: UpsertOutput,
    partial: pa.Table,
    *,
    app_id: str,
    batch_id: int,
    metadata: Mapping[str, Any] | None = None,
    max_tries: int = 20,
    before_commit: Callable[[], None] | None = None,
    replaced: Sequence[OffsetRange] | None = None,
) -> MergeOutcome:
    """Apply the batch's latest record per key (jobs/derived/partials.py `latest_per_key`): a
    record or tombstone later in Kafka order than the table's row for its key replaces it,
    an earlier one changes nothing (a fill backfill of older offsets never overwrites newer
    ones), and a key the table lacks is inserted, tombstone or not.

    Tombstones are kept as rows: `_deleted` true, with the tombstone's coordinates. A hard
    delete would forget where the key was deleted, and a later fill of older offsets would
    insert the key again as one never seen (tests/test_derived_merge.py
    `a_fill_of_older_offsets_never_brings_a_deleted_key_back`); a tombstone row keeps the
    order compare blocking it, also for a key whose only record is the tombstone. So the
    table's columns are the partial's, `_deleted` included, and readers take its live rows
    (jobs/derived/invariants.py `live_rows`, SQL `WHERE NOT _deleted`).

    `replaced` (the ranges of a replace batch) is for jobs/derived/replace.py
    `upsert_replacement`'s partial, the affected keys' new state. A table row whose
    coordinates the ranges hold is the replaced record: it is overwritten whatever the
    order (what now stands may be older), or deleted outright for a row flagged `_absent`
    (no raw row of that key is left, so there is no tombstone to keep). Any other table row
    keeps the order compare: it is either the record the partial was computed from, or a
    newer one a live batch committed after the replace read the raw rows, which must stay
    (tests/test_derived_replace.py `a_live_batch_committed_between_...`). No backfill
    batch can commit in between: fills and replaces share the backfill app id, one batch
    in flight at a time.
    """
    replace = replaced is not None
    partial = _upsert_partial(spec, partial, replace)
    schema = partial.schema
    if replace:
        schema = schema.remove(schema.get_field_index(ABSENT))
    columns = {c: _q(SOURCE, c) for c in schema.names}
    absent = _q(SOURCE, ABSENT)
    if replaced is not None:
        # invariant 1: only the replaced records may be overwritten regardless of order
        if TOPIC not in schema.names:
            raise InconsistencyError(
                f"derived output {spec.name}: the replace partial has no {TOPIC} column, so "
                "the table's rows in the replaced ranges cannot be told apart"
            )
        held = _in_ranges(TARGET, replaced)

    newer = _newer(TOPIC in schema.names)

    def plan(table: DeltaTable, properties: CommitProperties) -> TableMerger:
        # a batch's rows this snapshot's own keep out, dropped (resources/delta/upsert_pruning.py)
        source = (
            partial
            if replace
            else pruned_partial(table, target.uri, partial, spec.key_columns, TOPIC in schema.names)
        )
        merger = _merger(table, source, spec.key_columns, properties)
        if not replace:
            return merger.when_matched_update(
                updates=columns, predicate=newer
            ).when_not_matched_insert(updates=columns)
        return (
            merger.when_matched_delete(predicate=f"{absent} AND {held}")
            .when_matched_update(updates=columns, predicate=f"NOT {absent} AND ({held} OR {newer})")
            .when_not_matched_insert(updates=columns, predicate=f"NOT {absent}")
        )

    return _apply(
        target, spec.name, partial, schema, plan, app_id, batch_id, metadata, max_tries,
        before_commit,
    )  # fmt: skip


def _upsert_partial(spec: UpsertOutput, partial: pa.Table, replace: bool) -> pa.Table:
    """`partial` with a `_deleted` flag that is never null, once it is checked to be the
    kind of partial this merge takes: a replace's, or an ordinary batch's."""
    if DELETED not in partial.column_names:
        raise InconsistencyError(
            f"derived output {spec.name}: the partial has no {DELETED} column "
            "(jobs/derived/partials.py latest_per_key adds it)"
        )
    # invariant 1 on the output: an ordinary batch merged as a replace would overwrite
    # newer rows, a replace merged as a batch would keep the replaced records
    if replace != (ABSENT in partial.column_names):
        raise InconsistencyError(
            f"derived output {spec.name}: a {'replace' if replace else 'batch'} partial "
            f"{'without' if replace else 'with'} an {ABSENT} column (jobs/derived/replace.py "
            "upsert_replacement adds it, and only a replace merges it)"
        )
    # a null flag would make a row neither live nor deleted for readers
    return partial.set_column(
        partial.schema.get_field_index(DELETED),
        pa.field(DELETED, pa.bool_(), nullable=False),
        pc.fill_null(partial[DELETED].cast(pa.bool_()), False),
    )


def _in_ranges(alias: str, ranges: Sequence[OffsetRange]) -> str:
    """SQL: the row's coordinates fall in one of `ranges` (false for none); the same rule
    as the raw table's replace (resources/delta/rewrite.py `in_ranges`)."""
    if not ranges:
        return "FALSE"
    parts = []
    for r in ranges:
        topic = r.topic.replace("'", "''")
        parts.append(
            f"({_q(alias, TOPIC)} = '{topic}' AND {_q(alias, PARTITION)} = {int(r.partition)} "
            f"AND {_q(alias, OFFSET)} >= {int(r.start)} AND {_q(alias, OFFSET)} < {int(r.end)})"
        )
    return "(" + " OR ".join(parts) + ")"


def _merger(
    table: DeltaTable,
    partial: pa.Table,
    keys: list[str],
    properties: CommitProperties,
    held: str | None = None,
) -> TableMerger:
    """The MERGE on `keys`; `held`, a predicate on the target's partitions that every row
    the keys match satisfies anyway, only spares delta-rs reading the other partitions."""
    predicate = _keys_match(keys) + (f" AND {held}" if held else "")
    return table.merge(
        partial,
        predicate=predicate,
        source_alias=SOURCE,
        target_alias=TARGET,
        # no float bounds for wide decimals, a sum's above all (resources/delta/writer_stats.py)
        writer_properties=sound_writer_properties(table.schema().to_arrow()),
        commit_properties=properties,
        post_commithook_properties=NO_CHECKPOINT,  # written beside the batch, as a publish's
    )


def _apply(
    target: DeltaTarget,
    name: str,
    partial: pa.Table,
    schema: pa.Schema,
    plan: Callable[[DeltaTable, CommitProperties], TableMerger],
    app_id: str,
    batch_id: int,
    metadata: Mapping[str, Any] | None,
    max_tries: int,
    before_commit: Callable[[], None] | None,
) -> MergeOutcome:
    """The MERGE through the one compare-and-set loop (resources/delta/commit.py).

    A try whose outcome is unknown (a DeltaError other than a lost race, an OSError: the
    store may have written the entry and lost the answer) is decided the same way, by the
    next read of the app-transaction version, which lands in the same commit as the MERGE's
    rows: the version says whether the rows are there, and the commit info of the version
    that holds them whether this call wrote them (commit.py `TOKEN_KEY`). Each try
    checks the partial's schema against the table as read, then runs `before_commit`
    between the read and the MERGE (tests use it to make two writers race).
    """

    def planned(table: DeltaTable, _try: int) -> Try:
        before = table.version()
        refuse_unwritable(
            table, target.uri, voted=True, generated=target.generated_columns, merged=True
        )
        _check_schema(table, schema, target.uri, name)
        if before_commit is not None:
            before_commit()

        def commit(properties: CommitProperties) -> Mapping[str, Any]:
            metrics = plan(table, properties).execute()
            if table.version() == before:
                _record_only(table, properties)
            checkpoint_if_due(target, table, before)
            return dict(metrics)

        return Try(frozenset(), commit)

    def give_up(exc: Exception, unknown: int) -> Exception:
        if isinstance(exc, OSError):
            return store_failure(target.uri, exc)
        # a MERGE that cannot be planned fails the same way every time: not the store
        return InconsistencyError(
            f"derived output {name}: the MERGE of batch {app_id}/{batch_id} failed "
            f"{unknown} times in a row: {store_failure(target.uri, exc)}"
        )

    outcome, metrics = commit_batch(
        target,
        app_id=app_id,
        batch_id=batch_id,
        schema=schema,
        metadata={**(metadata or {}), "app_id": app_id, "batch_id": batch_id},
        plan=planned,
        max_tries=max_tries,
        subject=f"derived output {name}, batch {app_id}/{batch_id},",
        give_up=give_up,
    )
    return MergeOutcome(
        outcome.published, outcome.table_version, outcome.tries, outcome.seconds, dict(metrics)
    )


def _record_only(table: DeltaTable, properties: CommitProperties) -> None:
    """Commit the app transaction alone, for a MERGE that changed no row.

    delta-rs makes no commit at all for such a MERGE (an empty partial, or an upsert whose
    records are all older than the table's), so its app transaction would never be written:
    the output would not show it holds the batch, and a recovery would take it for
    unfinished. An empty append carries the transaction (and the commit info) instead.
    """
    table.create_write_transaction(
        [],
        "append",
        table.schema(),
        commit_properties=properties,
        post_commithook_properties=NO_CHECKPOINT,
    )
    table.update_incremental()


def check_aggregate_layout(table: DeltaTable, uri: str, spec: AggregateOutput) -> None:
    """Refuse an aggregate's table partitioned otherwise than its config says: the MERGE's
    rows with no partition value would land in the null partition, silently. Checked at
    each MERGE and, by the publisher, before the vote, so a table another writer created is
    refused before anything of the batch is held."""
    where = f"derived.{spec.name}.partition_by"
    check_layout(uri, table.metadata().partition_columns, spec.partition_by, where)


def _check_schema(table: DeltaTable, schema: pa.Schema, uri: str, name: str) -> None:
    """The partial must fit the table as it is (invariant 14's rules). A partial that brings
    new columns is refused too: MERGE with schema evolution is not wired yet."""
    where = f"derived output {name} ({uri})"
    widened = widen_schema(table.schema(), schema, where=where)
    if widened is not None:
        known = {f.name for f in table.schema().fields}
        new = [f.name for f in widened.fields if f.name not in known]
        raise RefusedBatchError(
            f"{where}: the partial brings new column(s) {', '.join(new)}; a derived output's "
            "schema cannot grow yet (rebuild it with the new columns)"
        )
