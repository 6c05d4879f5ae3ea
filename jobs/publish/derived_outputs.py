"""Publishing a batch to a derived Delta output: the MERGE of its voted partial, or for a
replace batch the correction that keeps the output equal to its recomputation over the raw
table; and the checks that keep an output from being merged into when it cannot take the
partial or lacks the raw table's history.

The publisher (jobs/publish/delta_publisher.py) decides the order and what is skipped; this
module owns what one derived output's commit is. Why a replace's correction is exact is
docs/derived-tables.md#replace-correction.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from jobs.derived.invariants import recompute_aggregate
from jobs.derived.rebuild import behind_reason
from jobs.derived.replace import correction_partial, upsert_replacement
from jobs.publish.raw_rows import rows_in_ranges, rows_of_keys, staged_rows
from ledger.core.batch import Batch, StagedFile
from ledger.core.errors import CONFIG_PLACEHOLDER, InconsistencyError
from ledger.core.layout import derived_target
from resources.config.derived_spec import (
    ABSENT,
    DELETED,
    AggregateOutput,
    AnyOutput,
    PostgresOutput,
    UpsertOutput,
)
from resources.delta.merge import MergeOutcome, merge_aggregate, merge_upsert
from resources.delta.schema import decode_schema
from resources.delta.table import DeltaTarget
from resources.object_storage import storage


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


def partitioning(spec: AnyOutput) -> dict[str, Any]:
    """A derived Delta output's partition columns (an aggregate's window dates, plain
    columns: resources/delta/window_dates.py), as DeltaTarget takes them; none for the others."""
    columns = getattr(spec, "partition_by", None)
    return {"partition_by": list(columns), "generated": False} if columns else {}


def behind(
    spec: AggregateOutput | UpsertOutput,
    delta: DeltaTarget,
    raw_holds: Mapping[str, int | None],
) -> str | None:
    """Why the output is behind the raw table on one of the application ids of `raw_holds`
    (each id's last batch in the raw table, None for none), or restored behind its own
    history (`restored_reason`), or None."""
    for app_id, held in raw_holds.items():
        reason = behind_reason(spec, delta, held, app_id)
        if reason is not None:
            return reason
    return restored_reason(spec, delta, raw_holds)


def restored_reason(
    spec: AggregateOutput | UpsertOutput, delta: DeltaTarget, app_ids: Iterable[str]
) -> str | None:
    """Why the output cannot take a batch while a RESTORE of its table took out merges of
    the pipeline's batches (of `app_ids`) that its history does not hold again, or None.

    A RESTORE keeps the application transactions of the commits it takes out (delta-rs
    1.6, delta-spark 4.4), so the output's versions would go on claiming those batches
    while its groups or latest records lack them, and merging on would leave it short of
    them for good, past what its version check can see. Told from the log alone
    (resources/delta/restores.py `LogWalk`): a derived table's rows carry no coordinates."""
    table = delta.load()
    if table is None:
        return None
    taken = delta.log_walk.taken_out(table, delta.uri, {spec.app_id(a) for a in app_ids})
    if taken is None:
        return None
    what = (
        "which batches it took out cannot be told (it names no version)"
        if taken.to < 0
        else "which took out its merges of batch(es) "
        + ", ".join(f"{m['app_id']}/{m['batch_id']}" for m in reversed(taken.removed))
    )
    rebuild = f"`exactly derived rebuild -c {CONFIG_PLACEHOLDER} {spec.name}`"
    return (
        f"derived output {spec.name} ({delta.uri}) was restored at log version {taken.at} "
        f"(to version {taken.to}), {what}, while its application transactions still say it "
        "holds them: merging on would leave it short of them for good. Restore it to "
        f"version {taken.at - 1}, the version just before that restore (delta-spark: "
        f"RESTORE TABLE ... TO VERSION AS OF {taken.at - 1}), or delete its table and "
        f"build it from the raw table: {rebuild}"
    )


def table_schema(spec: AggregateOutput | UpsertOutput, encoded: str) -> pa.Schema:
    """The columns a partial brings to its table. An upsert table keeps its tombstones
    as rows, so `_deleted` is one of them, never null there (resources/delta/merge.py
    `merge_upsert` writes it so): a partial's nullable flag must not read as a change."""
    schema = decode_schema(encoded)
    if isinstance(spec, UpsertOutput) and DELETED in schema.names:
        at = schema.get_field_index(DELETED)
        schema = schema.set(at, pa.field(DELETED, pa.bool_(), nullable=False))
    return schema


def merge_replace(
    batch: Batch,
    spec: AggregateOutput | UpsertOutput,
    delta: DeltaTarget,
    raw_table: DeltaTarget,
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
    read from `raw_table`'s latest snapshot, which must not hold the batch yet (checked on
    that same snapshot); `table_files` are the batch's voted raw-table files, its new rows.
    Why those are exactly the rows the raw table's replace removes, in every interleaving:
    docs/derived-tables.md#replace-correction.
    """
    app_id = str(common["app_id"])
    started = time.perf_counter()
    held = delta.transaction_version(app_id)
    if held is not None and held >= batch.batch_id:
        table = delta.load()
        version = -1 if table is None else table.version()
        return MergeOutcome(False, version, 1, time.perf_counter() - started)
    raw = raw_table.load()
    raw_held = None if raw is None else raw.transaction_version(batch.app_id)
    if raw is None or (raw_held is not None and raw_held >= batch.batch_id):
        raise InconsistencyError(
            f"batch {batch.label} is a replace the raw table at {raw_table.uri} "
            f"{'does not exist for' if raw is None else 'holds already'}, but derived "
            f"output {spec.name} does not hold it: its correction can no longer be "
            "computed (the old rows are gone); rebuild the output from the raw table"
        )
    dataset = raw.to_pyarrow_dataset()
    old = rows_in_ranges(dataset, batch.ranges)
    new = staged_rows(raw_table.uri, table_files, old.schema)
    if isinstance(spec, AggregateOutput):
        correction = correction_partial(recompute_aggregate(old, spec), partial, spec)
        return merge_aggregate(delta, spec, correction, correction=True, **common)
    # every old row's key is affected, so the rows of the affected keys hold the old rows
    candidates = rows_of_keys(dataset, spec.key_columns, [old, new])
    replacement = _shaped(upsert_replacement(candidates, batch.ranges, new, spec), partial)
    return merge_upsert(delta, spec, replacement, replaced=batch.ranges, **common)


def _shaped(replacement: pa.Table, partial: pa.Table) -> pa.Table:
    """An upsert's replacement cast to the voted partial's columns and types, plus
    `_absent`; a column it lacks is null."""
    schema = partial.schema.append(pa.field(ABSENT, pa.bool_()))
    columns = {
        f.name: replacement[f.name].cast(f.type)
        if f.name in replacement.column_names
        else pa.nulls(replacement.num_rows, f.type)
        for f in schema
    }
    return pa.table(columns, schema=schema)


def merge_batch(
    batch: Batch,
    spec: AggregateOutput | UpsertOutput,
    delta: DeltaTarget,
    raw_table: DeltaTarget,
    files: Sequence[StagedFile],
    metadata: Mapping[str, Any],
    table_files: Sequence[StagedFile],
    raw_holds: Mapping[str, int | None],
) -> MergeOutcome:
    """MERGE the batch's voted partial (`files`) into derived output `spec`'s table, under
    the output's own app transaction, carrying the batch's commit info (invariant 7); for a
    replace batch, the correction `merge_replace` computes (`table_files`: the batch's voted
    raw-table files, its new rows). Refused while the output is behind the raw table
    (`behind`, on `raw_holds`: the raw table's last batch per application id)."""
    reason = behind(spec, delta, raw_holds)
    if reason is not None:
        raise InconsistencyError(reason)
    partial = read_partial(batch, spec, delta.uri, files)
    common: dict[str, Any] = {
        "app_id": spec.app_id(batch.app_id),
        "batch_id": batch.batch_id,
        "metadata": metadata,
    }
    if batch.params.get("mode") == "replace":
        return merge_replace(batch, spec, delta, raw_table, partial, table_files, common)
    if isinstance(spec, AggregateOutput):
        return merge_aggregate(delta, spec, partial, **common)
    return merge_upsert(delta, spec, partial, **common)


def read_partial(
    batch: Batch,
    spec: AggregateOutput | UpsertOutput | PostgresOutput,
    root: str,
    files: Sequence[StagedFile],
) -> pa.Table:
    """The voted partial files of the output, read back whole (a partial holds one row per
    group or key, small beside the batch), as the vote's schema says; no file or only empty
    ones is the empty partial, which still records the batch."""
    schema = decode_schema(batch.schemas[derived_target(spec.name)])
    parts = [
        storage.read_parquet(storage.join(root, f.path), schema.names).cast(schema)
        for f in files
        if f.records
    ]
    return pa.concat_tables(parts) if parts else schema.empty_table()
