"""What a derived output must equal, recomputed from the raw rows without Spark.

An aggregate maintained by merging partials batch after batch must hold what one aggregate
over every raw row gives. The tests check it now; a Dagster asset check on the derived
table's asset will later (docs/derived-tables.md), reading the raw table with delta-rs, so
this is pyarrow only: no JVM in a check.
"""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from derived.spec import (
    DELETED,
    OFFSET,
    PARTITION,
    STAGE_ONLY,
    WINDOW_END,
    WINDOW_START,
    AggregateOutput,
    UpsertOutput,
)


def _window_starts(times: pa.ChunkedArray, size_us: int) -> tuple[pa.Array, pa.Array]:
    """Epoch-aligned tumbling windows, as derived/partials.py computes them: the start is the
    time rounded down (towards minus infinity, also before 1970) to a multiple of the size;
    a null time has a null window."""
    as_utc = times.cast(pa.timestamp("us", tz="UTC"))
    micros = as_utc.cast(pa.int64())
    quotient = pc.divide(micros, size_us)  # truncates towards zero
    below = pc.and_(pc.less(micros, 0), pc.not_equal(pc.multiply(quotient, size_us), micros))
    quotient = pc.if_else(below, pc.subtract(quotient, 1), quotient)
    start = pc.multiply(quotient, size_us)
    end = pc.add(start, size_us)
    kind = pa.timestamp("us", tz="UTC")
    return start.cast(kind), end.cast(kind)


def recompute_aggregate(raw_rows: pa.Table, spec: AggregateOutput) -> pa.Table:
    """The aggregate `spec` describes, over `raw_rows` in one pass: the table's rows (or the
    stage's, whose quarantined rows, with an `_error`, are left out as `aggregate_partial`
    leaves them out). Columns as the aggregate table's: group-by, window, measures."""
    rows = raw_rows
    if "_error" in rows.column_names:
        rows = rows.filter(pc.is_null(rows["_error"]))
    rows = rows.drop_columns([c for c in STAGE_ONLY if c in rows.column_names])
    keys = list(spec.group_by)
    if spec.window is not None:
        start, end = _window_starts(rows[spec.window.column], spec.window.micros)
        rows = rows.append_column(WINDOW_START, start).append_column(WINDOW_END, end)
        keys += [WINDOW_START, WINDOW_END]
    aggregations: list[tuple[Any, ...]] = []
    names: list[str] = []
    for m in spec.measures:
        if m.fn == "count":
            aggregations.append(([], "count_all"))
            names.append("count_all")
        else:
            aggregations.append((m.column, m.fn))
            names.append(f"{m.column}_{m.fn}")
    grouped = rows.group_by(keys, use_threads=False).aggregate(aggregations)
    columns = {k: grouped[k] for k in keys}
    for m, name in zip(spec.measures, names, strict=True):
        columns[m.name] = grouped[name]
    return pa.table(columns)


def _sort_key(row: dict[str, Any], keys: list[str]) -> tuple[Any, ...]:
    # None sorts first, and values of one column are of one type
    return tuple((row[k] is not None, row[k]) for k in keys)


def aggregate_differences(
    expected: pa.Table, actual: pa.Table, spec: AggregateOutput, rel_tol: float = 1e-9
) -> list[str]:
    """How `actual` (the derived table) differs from `expected` (recompute_aggregate), one
    line per group, empty when they agree. Floating sums are compared with `rel_tol`: adding
    partials in another order rounds differently."""
    keys = spec.key_columns
    want = {_sort_key(r, keys): r for r in expected.to_pylist()}
    have = {_sort_key(r, keys): r for r in actual.to_pylist()}
    problems = []
    for key in sorted(set(want) | set(have)):
        group = {k: v for k, v in (want.get(key) or have[key]).items() if k in keys}
        if key not in have:
            problems.append(f"group {group}: missing from the derived table")
            continue
        if key not in want:
            problems.append(f"group {group}: in the derived table, not in the raw rows")
            continue
        for m in spec.measures:
            w, h = want[key][m.name], have[key][m.name]
            same = (
                math.isclose(w, h, rel_tol=rel_tol)
                if isinstance(w, float) and isinstance(h, float)
                else w == h
            )
            if not same:
                problems.append(f"group {group}: {m.name} is {h!r}, recomputed {w!r}")
    return problems


def recompute_latest(raw_rows: pa.Table, spec: UpsertOutput) -> pa.Table:
    """What the upsert table `spec` describes must hold, from `raw_rows` in one pass: per
    key, the row latest in Kafka order (partition, offset), left out when it is a tombstone
    (`_deleted`, or a null `value` on the stage's rows); quarantined rows take no part.
    Columns as the upsert table's: the rows' own without `_deleted` and the stage's."""
    rows = raw_rows
    if "_error" in rows.column_names:
        rows = rows.filter(pc.is_null(rows["_error"]))
    if DELETED in rows.column_names:
        deleted = pc.fill_null(rows[DELETED], False)
    elif "value" in rows.column_names:
        deleted = pc.is_null(rows["value"])
    else:
        raise ValueError(f"the rows have neither `value` nor `{DELETED}`: tombstones unknown")
    rows = rows.append_column("_tomb", deleted)
    rows = rows.sort_by([(PARTITION, "ascending"), (OFFSET, "ascending")])
    rows = rows.append_column("_at", pa.array(range(rows.num_rows), pa.int64()))
    latest = rows.group_by(spec.key, use_threads=False).aggregate([("_at", "max")])
    rows = rows.take(latest["_at_max"])  # `_at` is the row's index
    rows = rows.filter(pc.invert(rows["_tomb"]))
    dropped = [c for c in (*STAGE_ONLY, DELETED, "_tomb", "_at") if c in rows.column_names]
    return rows.drop_columns(dropped)
