"""What a derived output must equal, recomputed from the raw rows without Spark.

An aggregate maintained by merging partials batch after batch must hold what one aggregate
over every raw row gives; an upsert table's live rows (`live_rows`: its tombstone rows left
out) must be the latest record per key over every raw row, tombstones applied. The tests
check it now; a Dagster asset check on the derived table's asset will later
(docs/derived-tables.md), reading the raw table with delta-rs, so this is pyarrow only: no
JVM in a check.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ledger.core.errors import ConfigError
from ledger.core.layout import OFFSET, PARTITION, TOPIC
from resources.config.derived_spec import (
    DELETED,
    STAGE_ONLY,
    WINDOW_END,
    WINDOW_START,
    AggregateOutput,
    PostgresOutput,
    UpsertOutput,
)


def _window_starts(times: pa.ChunkedArray, size_us: int) -> tuple[pa.Array, pa.Array]:
    """Epoch-aligned tumbling windows, as jobs/derived/partials.py computes them: the start is the
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


def aggregate_columns(spec: AggregateOutput | PostgresOutput) -> set[str]:
    """The raw columns an aggregate reads: its keys, its measures' and its window's
    columns, and the two that leave rows out (`_error`, `_deleted`)."""
    used = {*spec.group_by, *(m.column for m in spec.measures if m.column), "_error", DELETED}
    return used | ({spec.window.column} if spec.window is not None else set())


def recompute_aggregate(raw_rows: pa.Table, spec: AggregateOutput) -> pa.Table:
    """The aggregate `spec` describes, over `raw_rows` in one pass: the table's rows (or the
    stage's, whose quarantined rows, with an `_error`, are left out as `aggregate_partial`
    leaves them out). Columns as the aggregate table's: group-by, window, measures."""
    # only the columns the aggregate reads: each filter below copies every column it keeps,
    # and a raw row's payload (a URL, a body) is most of its bytes
    used = aggregate_columns(spec)
    rows = raw_rows.select([c for c in raw_rows.column_names if c in used])
    if "_error" in rows.column_names:
        rows = rows.filter(pc.is_null(rows["_error"]))
    if DELETED in rows.column_names:
        # an upsert's tombstones in the raw table are delete markers, not events
        rows = rows.filter(pc.invert(pc.fill_null(rows[DELETED], False)))
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


def _by_key(
    want: dict[tuple[Any, ...], dict[str, Any]],
    have: dict[tuple[Any, ...], dict[str, Any]],
    keys: list[str],
    unit: str,
    extra: str,
    problems: list[str],
) -> Iterator[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """Every key either side holds, in key order: a key one side lacks adds its line to
    `problems` (missing from the derived table, or in it but `extra`); a key both hold is
    yielded as (the key by column, the recomputed row, the held row) for the caller to
    compare, so the lines stay in key order."""
    for key in sorted(set(want) | set(have)):
        row = want.get(key) or have[key]
        named = {k: row[k] for k in keys}
        if key not in have:
            problems.append(f"{unit} {named}: missing from the derived table")
        elif key not in want:
            problems.append(f"{unit} {named}: in the derived table, {extra}")
        else:
            yield named, want[key], have[key]


def aggregate_differences(
    expected: pa.Table, actual: pa.Table, spec: AggregateOutput, rel_tol: float = 1e-9
) -> list[str]:
    """How `actual` (the derived table) differs from `expected` (recompute_aggregate), one
    line per group, empty when they agree. Floating sums are compared with `rel_tol`: adding
    partials in another order rounds differently."""
    keys = spec.key_columns
    want = {_sort_key(r, keys): r for r in expected.to_pylist()}
    have = {_sort_key(r, keys): r for r in actual.to_pylist()}
    problems: list[str] = []
    extra = "not in the raw rows"
    for group, wanted, held in _by_key(want, have, keys, "group", extra, problems):
        for m in spec.measures:
            w, h = wanted[m.name], held[m.name]
            same = (
                math.isclose(w, h, rel_tol=rel_tol)
                if isinstance(w, float) and isinstance(h, float)
                else w == h
            )
            if not same:
                problems.append(f"group {group}: {m.name} is {h!r}, recomputed {w!r}")
    return problems


def live_rows(table: pa.Table) -> pa.Table:
    """An upsert table's rows as a reader must see them: without its tombstone rows
    (`_deleted` true) and without the `_deleted` column.

    The table keeps a tombstone as a row with the tombstone's coordinates (resources/delta/merge.py
    `merge_upsert`) so that a later fill of older offsets is still compared against it and
    cannot bring the deleted key back; every reader filters them out, as here (SQL: `WHERE
    NOT _deleted`). A table without the column (an aggregate) is returned as it is.
    """
    if DELETED not in table.column_names:
        return table
    kept = table.filter(pc.invert(pc.fill_null(table[DELETED], False)))
    return kept.drop_columns([DELETED])


def tombstones(rows: pa.Table, name: str) -> pa.ChunkedArray:
    """Per row, whether it is a tombstone, as jobs/derived/partials.py `tombstone` decides it:
    `_deleted` if the rows have it (null is not a tombstone), else a null Kafka `value`; rows
    with neither are refused, since their columns cannot tell a tombstone from a record
    whose fields are all null."""
    if DELETED in rows.column_names:
        return pc.fill_null(rows[DELETED].cast(pa.bool_()), False)
    if "value" in rows.column_names:
        return pc.is_null(rows["value"])
    raise ConfigError(
        f"derived output {name}: the rows have neither `value` nor `{DELETED}`, so a "
        "tombstone cannot be told from a record whose fields are all null"
    )


def raw_table_rows(rows: pa.Table) -> pa.Table:
    """The raw table's rows as the recomputations take them: with a `_deleted` column, all
    false, when the table has none. The raw table keeps tombstones (and the column) only
    since the pipeline has an upsert output (jobs/stage/routing.py `carries_tombstones`); rows
    written before were published as records, so records they are. Only for the raw
    table's rows: a stage's frame always has Kafka's `value` (`tombstones`)."""
    if DELETED in rows.column_names or "value" in rows.column_names:
        return rows
    return rows.append_column(DELETED, pa.array([False] * rows.num_rows, pa.bool_()))


def _require(rows: pa.Table, columns: list[str], name: str) -> None:
    missing = [c for c in columns if c not in rows.column_names]
    if missing:
        raise ConfigError(
            f"derived output {name}: the rows have no column(s) {', '.join(missing)} "
            f"(they have {', '.join(rows.column_names)})"
        )


def flagged_rows(rows: pa.Table, spec: UpsertOutput) -> pa.Table:
    """The rows an upsert output takes, in one shape whatever their source (the raw table's
    rows with `_deleted`, the stage's with Kafka's `value`): quarantined rows (with an
    `_error`) left out, the stage's columns dropped, `_deleted` last and never null."""
    _require(rows, [*spec.key, PARTITION, OFFSET], spec.name)
    if "_error" in rows.column_names:
        rows = rows.filter(pc.is_null(rows["_error"]))
    flags = tombstones(rows, spec.name)
    rows = rows.drop_columns([c for c in (*STAGE_ONLY, DELETED) if c in rows.column_names])
    return rows.append_column(DELETED, flags)


def latest_of(rows: pa.Table, spec: UpsertOutput) -> pa.Table:
    """Per key, the row of `rows` (already `flagged_rows`) latest by (`_kafka_partition`,
    `_kafka_offset`, `_kafka_topic`), the order jobs/derived/partials.py gives its reasons
    for. Null keys are one key, as the MERGE's `IS NOT DISTINCT FROM` makes them (pyarrow's
    group_by groups nulls together)."""
    keys = [(c, "ascending") for c in (PARTITION, OFFSET, TOPIC) if c in rows.column_names]
    # the rows' ranks in that order, without sorting the rows themselves (a take of every
    # column of every row): only each key's last row is taken, once
    order = pc.sort_indices(rows.select([c for c, _ in keys]), sort_keys=keys).to_numpy()
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order), dtype=np.int64)
    ranked = rows.select(list(spec.key)).append_column("__rank", pa.array(rank))
    last = ranked.group_by(list(spec.key), use_threads=False).aggregate([("__rank", "max")])
    return rows.take(pa.array(order[last["__rank_max"].to_numpy()]))


def latest_records(raw_rows: pa.Table, spec: UpsertOutput) -> pa.Table:
    """Per key, the raw row latest by (`_kafka_partition`, `_kafka_offset`), tombstones
    included and flagged in `_deleted`: what jobs/derived/partials.py `latest_per_key` gives for
    the same rows, in pyarrow (a check runs no JVM), and what the upsert table holds
    tombstone rows included."""
    return latest_of(flagged_rows(raw_rows, spec), spec)


def recompute_latest(raw_rows: pa.Table, spec: UpsertOutput) -> pa.Table:
    """What the upsert output's live rows must be over `raw_rows` (the raw table's rows with
    their `_deleted` flag, or the stage's with Kafka's `value`): per key, the latest record
    by (`_kafka_partition`, `_kafka_offset`); a key whose latest record is a tombstone is
    absent. Columns: the rows' own without the stage's and without `_deleted`, as
    `live_rows` gives the table's."""
    return live_rows(latest_records(raw_rows, spec))


def upsert_differences(expected: pa.Table, actual: pa.Table, spec: UpsertOutput) -> list[str]:
    """How `actual` (the upsert table, tombstone rows included or not) differs from
    `expected` (recompute_latest), one line per key, empty when they agree.

    Only live rows are compared (`live_rows` on both sides): a key is in the output exactly
    when its latest raw record is not a tombstone, with that record's columns. Every column
    of `expected` is compared, the coordinates included, so a right value from the wrong
    record is a difference too.
    """
    want_rows, have_rows = live_rows(expected), live_rows(actual)
    absent = [c for c in want_rows.column_names if c not in have_rows.column_names]
    if absent:
        return [f"the derived table has no column(s) {', '.join(absent)}"]
    keys = spec.key_columns
    columns = want_rows.column_names
    want = {_sort_key(r, keys): r for r in want_rows.to_pylist()}
    have: dict[tuple[Any, ...], dict[str, Any]] = {}
    problems = []
    for r in have_rows.select(columns).to_pylist():
        key = _sort_key(r, keys)
        if key in have:
            problems.append(f"key { ({k: r[k] for k in keys}) }: twice in the derived table")
        have[key] = r
    extra = "absent or deleted in the raw rows"
    for named, wanted, held in _by_key(want, have, keys, "key", extra, problems):
        for c in columns:
            if c not in keys and wanted[c] != held[c]:
                problems.append(f"key {named}: {c} is {held[c]!r}, recomputed {wanted[c]!r}")
    return problems
