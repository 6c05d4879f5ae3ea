"""Sparing an upsert's MERGE the rows of its partial that it would leave unchanged.

An upsert's MERGE updates a matched row only when the batch's record comes later in Kafka
order than the table's (resources/delta/merge.py `_newer`). When that predicate holds for
some matched rows and not for others, delta-rs's MERGE was 2.4x slower than when it held
for all of them: 118 ms against 43 ms for the derived-cost bench's 10,000 users, where 29%
of the keys' table rows were later than the batch's (BENCHMARKS.md, "An upsert's MERGE
without the rows it would keep"). That mix is what a topic whose producers do not key by
the upsert's key gives (one key's records in several partitions, whose order is partition
first), and what a fill backfill of older offsets gives. So the MERGE is given only the
rows it may change, found from the table's key and coordinate columns.

Why it is exact: a row is dropped only when the snapshot the MERGE plans on holds a row of
its key (every key column non-null and equal) whose coordinates are not before the
partial's; the MERGE's predicate is false for that pair, so the row would change nothing.
The MERGE keeps its predicate and its null-safe keys, so a row kept that could have been
dropped (a null key, an unreadable comparison) only costs time. The snapshot is the try's
own: a commit after it makes the try lose its compare-and-set (resources/delta/commit.py),
and the next try prunes again against its own read. Exactly's tables carry no deletion
vectors (resources/delta/features.py), so a live file's rows are the table's rows.

Only where the read costs less than it can save: an unpartitioned table holding at most
MAX_TABLE_ROWS_PER_PARTIAL_ROW times the partial's rows, by its files' statistics. A table
far larger than a batch is left to the MERGE, which skips files by the keys' bounds.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from ledger.core.layout import OFFSET, PARTITION, TOPIC
from resources.object_storage import storage

#: The largest table, in rows per row of the partial, whose key and coordinate columns are
#: read to prune the partial (module docstring).
MAX_TABLE_ROWS_PER_PARTIAL_ROW = 4
_ROW = "_exactly_partial_row"
_THEIRS = "_exactly_table_"


def unchanged_rows_dropped(
    partial: pa.Table, table_rows: pa.Table, keys: Sequence[str], with_topic: bool
) -> pa.Table:
    """`partial` without the rows whose key `table_rows` (the table's key and coordinate
    columns) holds at coordinates not before the row's: the rows the upsert's MERGE would
    not update. The partial's row order is kept; a partial holds one row per key."""
    coords = _coordinates(with_topic)
    theirs = table_rows.select([*keys, *coords]).rename_columns(
        [*keys, *(_THEIRS + c for c in coords)]
    )
    # in the partial's types: delta-rs's files read back as views, which a join refuses
    theirs = theirs.cast(
        pa.schema(
            [partial.schema.field(k).with_nullable(True) for k in keys]
            + [partial.schema.field(c).with_name(_THEIRS + c).with_nullable(True) for c in coords]
        )
    )
    positions = pa.array(range(partial.num_rows), pa.int64())
    ours = partial.select([*keys, *coords]).append_column(_ROW, positions)
    # an inner join matches non-null keys only: a null key is kept, for the MERGE to decide
    pairs = ours.join(theirs, keys=list(keys), join_type="inner")
    if pairs.num_rows == 0:
        return partial
    # a row the MERGE may change for any table row of its key is kept: a table a writer
    # other than exactly gave two rows of one key has each updated where the row is later
    kept = pc.fill_null(_later(pairs, coords), True)
    spared = pc.is_in(pairs[_ROW], value_set=pairs.filter(kept)[_ROW])
    dropped = pairs.filter(pc.invert(spared))[_ROW]
    if len(dropped) == 0:
        return partial
    return partial.filter(pc.invert(pc.is_in(positions, dropped)))


def _coordinates(with_topic: bool) -> list[str]:
    """The columns that order two records of a key, as merge.py `_newer` compares them."""
    return [PARTITION, OFFSET, *([TOPIC] if with_topic else [])]


def _later(pairs: pa.Table, coords: Sequence[str]) -> pa.ChunkedArray:
    """Per pair: the partial's record comes later in Kafka order than the table's, as
    merge.py `_newer` says in SQL (partition, then offset, then the topic's name)."""
    last = coords[-1]
    later = pc.greater(pairs[last], pairs[_THEIRS + last])
    for column in reversed(coords[:-1]):
        ours, theirs = pairs[column], pairs[_THEIRS + column]
        later = pc.or_kleene(pc.greater(ours, theirs), pc.and_kleene(pc.equal(ours, theirs), later))
    return later


def pruned_partial(
    table: DeltaTable, uri: str, partial: pa.Table, keys: Sequence[str], with_topic: bool
) -> pa.Table:
    """`partial` pruned against `table` (the snapshot the MERGE plans on, at `uri`) where
    that is worth a read (module docstring), else `partial` as it is."""
    if partial.num_rows == 0 or table.metadata().partition_columns:
        return partial
    actions = pa.table(table.get_add_actions(flatten=True))
    counts = actions.column("num_records")
    if actions.num_rows == 0 or counts.null_count:
        return partial
    if pc.sum(counts).as_py() > MAX_TABLE_ROWS_PER_PARTIAL_ROW * partial.num_rows:
        return partial
    columns = [*keys, *_coordinates(with_topic)]
    try:
        rows = pa.concat_tables(
            storage.read_parquet(storage.join(uri, path), columns)
            for path in actions.column("path").to_pylist()
        )
        return unchanged_rows_dropped(partial, rows, keys, with_topic)
    except Exception:
        # only a saving: whatever failed here, the MERGE over the whole partial decides
        # alone (and meets a store that failed itself, with the error the commit names)
        return partial
