"""An aggregate table partitioned by its window's date (`partition_by` of an aggregate
output): the partition columns of the rows a MERGE brings.

Computed here, in pyarrow, at the one place every partial goes through on its way into the
table (resources/delta/merge.py `merge_aggregate`): the stage's partials, a replace's corrections
and a recovery's partials alike, so no path can bring a row without its partition value.

Not a Delta generated column, unlike the raw table's: delta-rs, which runs the MERGE,
evaluates a generated column's expression itself (DataFusion) and knows none of Spark's
time-zone functions, so it refuses the MERGE; the column is a plain partition column whose
value is a function of `window_start` (part of the MERGE's key), so a group never moves
between partitions.

For the same reason a MERGE may name the partitions its rows fall in (`held_partitions`)
without changing which rows match: delta-rs then reads only those partitions' files, so a
batch's MERGE costs its windows' days, not the table's whole history (issue 31, item 5).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from resources.config.partitioning import PartitionColumn


def window_date(starts: pa.ChunkedArray | pa.Array, time_zone: str) -> pa.ChunkedArray:
    """The calendar day, in `time_zone`, of each instant in `starts` (null stays null)."""
    zoned = starts.cast(pa.timestamp("us", tz=time_zone))
    return pc.local_timestamp(zoned).cast(pa.date32())


def with_window_dates(partial: pa.Table, columns: Sequence[PartitionColumn]) -> pa.Table:
    """`partial` with each partition column (re)computed from its source column."""
    for column in columns:
        value = window_date(partial[column.date_of], column.time_zone)
        if column.name in partial.column_names:
            partial = partial.drop_columns([column.name])
        partial = partial.append_column(pa.field(column.name, pa.date32()), value)
    return partial


def held_partitions(
    partial: pa.Table, columns: Sequence[PartitionColumn], alias: str
) -> str | None:
    """A MERGE predicate naming the partitions the rows of `partial` fall in, on the table
    aliased `alias` (`t.`window_date` IN ('2026-03-01', ...)`), or None for no rows.

    A row whose partition value is null (a group whose event time was null: Spark's window
    of null is null) is in the null partition, which no `IN` list matches: the predicate
    names it with `IS NULL`, or that group would be inserted again by every batch.
    Literal values, not `t.col = s.col`: delta-rs prunes files by a predicate on the
    target's partition columns with constants only, and a join on the column made the MERGE
    slower, not faster (measured: 30 daily partitions, 307 ms of scan against 2 ms).
    """
    if partial.num_rows == 0:
        return None
    clauses = []
    for column in columns:
        values = pc.unique(partial[column.name]).to_pylist()
        quoted = f"{alias}.`{column.name}`"
        days = sorted(f"'{v.isoformat()}'" for v in values if v is not None)
        held = [f"{quoted} IN ({', '.join(days)})"] if days else []
        if None in values:
            held.append(f"{quoted} IS NULL")
        clauses.append(f"({' OR '.join(held)})")
    return " AND ".join(clauses) or None
