"""Delta per-file statistics from Parquet footers: numRecords and min/max/nullCount as the
log holds them, and their JSON.

Their own module because two writers need the same statistics: the stage, which computes
them once per staged file and keeps them with the vote (jobs/stage/parquet_files.py), and the
replace's row rewrite (resources/delta/rewrite.py). Pure pyarrow: no table, no store.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Collection, Mapping, Sequence
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

#: Longer strings are left out of min/max: a truncated max would be smaller than the real
#: value and make data skipping drop rows that match.
_MAX_STAT_STRING = 64


def _json_value(value: Any, kind: pa.DataType, nan_free: bool) -> Any:
    """A Parquet footer's min or max as the Delta log writes it (PROTOCOL.md, per-file
    statistics, as delta-spark writes them), or None where the log must carry no bound.

    - a decimal stays a Decimal, written as a JSON number with every digit (`stats_json`):
      delta-rs and delta-spark both read such a number exactly into the column's decimal;
    - a float or double only while it is finite and the file holds no NaN (`nan_free`):
      JSON has no NaN or infinity, and a footer's max may leave NaN out (Arrow's writer
      does), where a `> max` filter that Spark's ordering (NaN above every number) matches
      on a NaN row would have the file skipped;
    - a timestamp with a zone in UTC with a `Z`, a timestamp_ntz without a zone (a zone
      there is a parse error for delta-spark), both to the microsecond, as stored;
    - a boolean as it is (delta-spark writes none and ignores them; delta-rs reads them);
    - a string only up to _MAX_STAT_STRING characters; binary and anything else not at all
      (Delta has no min/max for them).
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if nan_free and math.isfinite(value) else None
    if isinstance(value, str):
        return value if len(value) <= _MAX_STAT_STRING else None
    if isinstance(value, dt.datetime):
        if getattr(kind, "tz", None) is None:
            return value.replace(tzinfo=None).isoformat(timespec="microseconds")
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return value if value.is_finite() else None
    return None


def _stats_leaf(schema: pa.Schema, path: str) -> pa.DataType | None:
    """The Arrow type of the Parquet column `path` (dot-separated) if only structs lead to
    it, as Delta keeps statistics for struct fields (nested objects in the log) but for
    nothing inside an array or a map; None otherwise (or for a name with a dot in it)."""
    parts = path.split(".")
    index = schema.get_field_index(parts[0])
    if index < 0:
        return None
    kind = schema.field(index).type
    for part in parts[1:]:
        if not pa.types.is_struct(kind):
            return None
        index = kind.get_field_index(part)
        if index < 0:
            return None
        kind = kind.field(index).type
    return None if pa.types.is_nested(kind) else kind


def float_columns(meta: pq.FileMetaData, columns: Sequence[str] | None = None) -> list[str]:
    """The top-level columns holding a float or double that may get a min/max: what
    `nan_columns` must read of the file for `delta_stats`."""
    schema = meta.schema.to_arrow_schema()
    found: list[str] = []
    for col_index in range(meta.num_columns):
        path = meta.schema.column(col_index).path
        top = path.split(".")[0]
        kind = _stats_leaf(schema, path)
        wanted = columns is None or top in columns
        if wanted and kind is not None and pa.types.is_floating(kind) and top not in found:
            found.append(top)
    return found


def nan_columns(data: pa.Table) -> set[str]:
    """The float and double columns of `data` holding a NaN, struct fields as `a.b`."""
    flat = data
    while any(pa.types.is_struct(f.type) for f in flat.schema):
        flat = flat.flatten()
    return {
        name
        for name, column in zip(flat.column_names, flat.columns, strict=True)
        if pa.types.is_floating(column.type) and pc.any(pc.is_nan(column)).as_py()
    }


def delta_stats(
    meta: pq.FileMetaData,
    columns: Sequence[str] | None = None,
    nan: Collection[str] | None = None,
) -> dict[str, Any]:
    """Delta `stats` for one file from its footer: numRecords, and min/max/nullCount for
    every column that is not inside an array or a map (struct fields nested, as Delta
    writes them), of the top-level `columns` if given. Serialize with `stats_json`.

    `nan` names the float columns holding a NaN (`nan_columns`); None means unknown, and
    then no float column gets a min/max (`_json_value` says why). A bound or count is left
    out wherever the footer cannot vouch for it: a row group without statistics, without
    a null count, without min/max while holding values, or whose statistics pyarrow cannot
    read (pyarrow 22 could not read Spark's INT32/INT64 decimals: a column without
    statistics is better than a batch that fails).
    """
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, Any] = {}
    schema = meta.schema.to_arrow_schema()
    wanted = None if columns is None else set(columns)
    for col_index in range(meta.num_columns):
        path = meta.schema.column(col_index).path
        kind = _stats_leaf(schema, path)
        if kind is None or (wanted is not None and path.split(".")[0] not in wanted):
            continue
        lo = hi = None
        null_count: int | None = 0
        bounded = True
        for rg in range(meta.num_row_groups):
            group = meta.row_group(rg)
            try:
                st = group.column(col_index).statistics
                bounds = (st.min, st.max) if st is not None and st.has_min_max else None
            except (pa.ArrowException, ValueError, OverflowError):
                st = None
            if st is None:
                null_count, bounded = None, False
                break
            if null_count is not None:
                null_count = null_count + st.null_count if st.has_null_count else None
            if bounds is not None:
                lo = bounds[0] if lo is None else min(lo, bounds[0])
                hi = bounds[1] if hi is None else max(hi, bounds[1])
            elif not (st.has_null_count and st.null_count == group.num_rows):
                bounded = False  # values, but no bounds for them
        if null_count is not None:
            _put(nulls, path, null_count)
        nan_free = nan is not None and path not in nan
        lo_json, hi_json = _json_value(lo, kind, nan_free), _json_value(hi, kind, nan_free)
        if bounded and lo_json is not None and hi_json is not None:
            _put(mins, path, lo_json)
            _put(maxs, path, hi_json)
    return {"numRecords": meta.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}


def _put(tree: dict[str, Any], path: str, value: Any) -> None:
    """Set `a.b.c` in nested objects, as the log holds a struct's fields."""
    *parents, leaf = path.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[leaf] = value


def stats_json(stats: Mapping[str, Any]) -> str:
    """`stats` as the log's JSON: decimals as numbers with every digit (json.dumps has no
    way to write a Decimal, and a float would round a decimal(38) bound), no NaN or
    infinity (they are not JSON; `_json_value` keeps them out)."""
    if isinstance(stats, Mapping):
        inner = ",".join(f"{json.dumps(k)}:{stats_json(v)}" for k, v in stats.items())
        return "{" + inner + "}"
    if isinstance(stats, Decimal):
        return format(stats, "f")
    return json.dumps(stats, allow_nan=False)
