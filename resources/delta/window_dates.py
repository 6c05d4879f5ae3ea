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
