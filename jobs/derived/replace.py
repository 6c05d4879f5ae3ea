"""What a `replace` backfill batch applies to each derived output (docs/derived-tables.md).

A replace swaps the raw table's rows in some committed offset ranges for a new stage's rows,
in one commit (resources/delta/table.py `DeltaTarget.replace`). A derived output cannot simply
merge the new rows' partial: the old rows' contributions are in it already. So:

- an aggregate gets a **correction partial**: the new rows' partial minus the old rows'
  (counts and sums negated), summed per group, merged with `merge_aggregate(...,
  correction=True)`, which deletes a group whose count reaches 0;
- an upsert gets the **affected keys' new state**: for every key of an old or a new row, the
  latest record over the raw rows outside the ranges plus the new rows (a tombstone kept
  as one), or, for a key left with no record at all, its removal; merged with
  `merge_upsert(..., replaced=ranges)`, which replaces the rows those ranges hold whatever
  their order (and keeps the order compare for the others).

Pyarrow only, no Spark: the old rows come from the raw table, read with delta-rs when the
replace is published, before the raw table's own replace commit (jobs/publish/derived_outputs.py
`merge_replace`; docs/derived-tables.md#replace-correction argues why those are the rows that
commit removes), and these are the same
pure functions of rows as the check's recomputation (jobs/derived/invariants.py), so what is
applied and what is checked cannot drift apart. The old rows are one replaced range's (a
batch's worth), not the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from jobs.derived.invariants import flagged_rows, latest_of, recompute_aggregate
from ledger.core.errors import ConfigError
from ledger.core.layout import OFFSET, PARTITION, TOPIC
from ledger.core.protocol import OffsetRange
from resources.config.derived_spec import (
    ABSENT,
    DELETED,
    AggregateOutput,
    UpsertOutput,
    correction_count,
)
from resources.delta.rewrite import in_ranges as rows_in_ranges


def in_ranges(rows: pa.Table, ranges: Sequence[OffsetRange]) -> pa.ChunkedArray:
    """Per row: do its coordinates (topic, partition, offset) fall in one of `ranges`? The
    same rule as the raw table's replace (resources/delta/rewrite.py `in_ranges`, called), so the
    rows taken out of a derived output are exactly the rows the raw table's commit removes
    (invariant
    1: a row counted twice, or not taken out, is a record held twice or lost)."""
    missing = [c for c in (TOPIC, PARTITION, OFFSET) if c not in rows.column_names]
    if missing:
        raise ConfigError(
            f"the raw rows have no column(s) {', '.join(missing)}: a replace finds its old "
            "rows by coordinates"
        )
    return rows_in_ranges(rows, ranges)


def correction_partial(
    old_partial: pa.Table, new_partial: pa.Table, spec: AggregateOutput
) -> pa.Table:
    """The correction a replace applies to an aggregate: per group, the new rows' measures
    minus the old rows' (counts and sums only), in `new_partial`'s schema.

    `new_partial` may come from the stage's Spark (`aggregate_partial`) or from
    `recompute_aggregate`; `old_partial` is cast to its types. A group where old and new
    cancel exactly (every measure 0 or null) is left out: it would change nothing. A group
    whose count is negative is one the replace empties in part or whole; merged with
    `correction=True`, a group whose count reaches 0 is deleted.
    """
    correction_count(spec)
    keys = spec.key_columns
    measures = [m.name for m in spec.measures]
    old = old_partial.select([*keys, *measures])
    new = new_partial.select([*keys, *measures])
    negated = old
    for name in measures:
        i = negated.schema.get_field_index(name)
        negated = negated.set_column(i, name, pc.negate_checked(negated[name]))
    both = pa.concat_tables([new, negated.cast(new.schema)])
    summed = both.group_by(keys, use_threads=False).aggregate([(m, "sum") for m in measures])
    columns: dict[str, Any] = {k: summed[k] for k in keys}
    for name in measures:
        columns[name] = summed[f"{name}_sum"].cast(new.schema.field(name).type)
    result = pa.table(columns).cast(new.schema)
    changes = pa.chunked_array([pa.array([False] * result.num_rows, pa.bool_())])
    for name in measures:
        nonzero = pc.fill_null(pc.not_equal(result[name], 0), False)
        changes = pc.or_(changes, nonzero)
    return result.filter(changes)


def aggregate_correction(old_rows: pa.Table, new_rows: pa.Table, spec: AggregateOutput) -> pa.Table:
    """The correction partial from rows: `old_rows` are the raw table's rows in the replaced
    ranges (before the replace), `new_rows` the replace's staged rows (quarantined ones, with
    an `_error`, are left out as everywhere)."""
    return correction_partial(
        recompute_aggregate(old_rows, spec), recompute_aggregate(new_rows, spec), spec
    )


def _key_tuples(rows: pa.Table, keys: list[str]) -> list[tuple[Any, ...]]:
    columns = [rows[k].to_pylist() for k in keys]
    return list(zip(*columns, strict=True))


def upsert_replacement(
    raw_rows: pa.Table,
    ranges: Sequence[OffsetRange],
    new_rows: pa.Table,
    spec: UpsertOutput,
) -> pa.Table:
    """The new state of every key a replace touches, for `merge_upsert(..., replaced=ranges)`.

    `raw_rows`: the raw table's rows before the replace (with `_deleted`), at least every
    row of the affected keys (rows of other keys are ignored, so the caller may filter by
    key to read less). `ranges`: the replaced ranges. `new_rows`: the replace's staged rows
    (`_deleted` or Kafka's `value` tells their tombstones).

    Affected keys are those of the old rows (raw rows in the ranges) and of the new rows.
    Each gets the latest record by (partition, offset) over the raw rows outside the ranges
    plus the new rows, a tombstone kept as a `_deleted` row (it must keep blocking older
    fills); a key with no record left gets a row with `_absent` true, which the MERGE turns
    into a delete: nothing in the raw table says anything about that key any more. The
    order compare must be off for the table rows the ranges hold, since the replaced record
    may be newer than the one that now stands (merge.py says why only for those).
    """
    keys = spec.key_columns
    hit = in_ranges(raw_rows, ranges)
    old = flagged_rows(raw_rows.filter(hit), spec)
    kept = raw_rows.filter(pc.invert(hit))
    fresh = flagged_rows(new_rows, spec)
    affected = set(_key_tuples(old, keys)) | set(_key_tuples(fresh, keys))
    kept = flagged_rows(kept, spec)
    kept = kept.filter(pa.array([k in affected for k in _key_tuples(kept, keys)], pa.bool_()))
    candidates = pa.concat_tables([kept, fresh], promote_options="default")
    latest = latest_of(candidates, spec)
    standing = set(_key_tuples(latest, keys))
    gone = sorted(affected - standing, key=lambda key: tuple((v is not None, v) for v in key))
    latest = latest.append_column(ABSENT, pa.array([False] * latest.num_rows, pa.bool_()))
    if not gone:
        return latest
    absent: dict[str, pa.Array] = {}
    for field in latest.schema:
        if field.name in keys:
            values = [key[keys.index(field.name)] for key in gone]
            absent[field.name] = pa.array(values, field.type)
        elif field.name in (DELETED, ABSENT):
            absent[field.name] = pa.array([field.name == ABSENT] * len(gone), pa.bool_())
        else:
            absent[field.name] = pa.nulls(len(gone), field.type)
    return pa.concat_tables([latest, pa.table(absent, schema=latest.schema)])
