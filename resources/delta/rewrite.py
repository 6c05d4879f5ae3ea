"""Removing rows from a Delta table by their Kafka coordinates: the rule a replace removes
rows by, and the remove and rewrite actions that take a replace's ranges out of the table.

Their own module because rows are removed by predicate, not by file: a file that also holds
rows outside the ranges is rewritten without them, and that rewrite (reading the files the
statistics point at, writing the kept rows with their own statistics) is a concern of its
own beside the commit that swaps the files (resources/delta/commit.py). Derived outputs
remove rows by the same rule (`in_ranges`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.transaction import AddAction, RemoveAction

from ledger.core.layout import OFFSET, PARTITION, TOPIC
from ledger.core.protocol import OffsetRange
from resources.config.partitioning import entry_values, folders
from resources.delta.stats import delta_stats, nan_columns, stats_json
from resources.object_storage import storage


def remove_rows(
    table: DeltaTable,
    uri: str,
    ranges: Sequence[OffsetRange],
    rewrite_dir: str,
    attempt: int,
    partitions: Sequence[str] = (),
) -> list[Any]:
    """The remove (and rewrite) actions that take the rows in `ranges` out of the table.
    In a partitioned table each file is rewritten into its own partition: its rows stay
    under the partition values of the file they came from, in that partition's folder."""
    actions: list[Any] = []
    now_ms = int(time.time() * 1000)
    # a staged file may hold columns the table does not have (jobs/stage/routing.py: `routed`);
    # the rewrite keeps only the table's
    columns = {f.name for f in table.schema().fields}
    for entry in _files_touching(table, ranges):
        path = entry["path"]
        data = storage.read_parquet(storage.join(uri, path))
        data = data.select([c for c in data.column_names if c in columns])
        hit = in_ranges(data, ranges)
        removed = pc.sum(hit.cast(pa.int64())).as_py() or 0
        if removed == 0:
            continue
        values = entry_values(entry, partitions)
        actions.append(RemoveAction(path, True, now_ms, entry["size_bytes"], values))
        kept = data.filter(pc.invert(hit))
        if kept.num_rows == 0:
            continue
        digest = hashlib.sha1(path.encode()).hexdigest()[:16]
        name = f"{folders(values)}rewrite-{attempt}-{digest}.parquet"
        target = storage.join(rewrite_dir, name)
        storage.write_parquet(kept, target)
        meta = storage.read_parquet_metadata(target)
        info = storage.file_info(target)
        stats = delta_stats(meta, nan=nan_columns(kept))
        actions.append(
            AddAction(
                storage.relative(target, uri),
                info.size,
                values,
                info.modification_time_ms,
                True,
                stats_json(stats),
            )
        )
    return actions


def _files_touching(table: DeltaTable, ranges: Sequence[OffsetRange]) -> list[dict[str, Any]]:
    """Files whose statistics say they may hold rows in `ranges` (all, without statistics)."""
    actions = pa.table(table.get_add_actions(flatten=True))
    found = []
    for row in actions.to_pylist():
        p_lo, p_hi = row.get("min._kafka_partition"), row.get("max._kafka_partition")
        o_lo, o_hi = row.get("min._kafka_offset"), row.get("max._kafka_offset")
        if None in (p_lo, p_hi, o_lo, o_hi) or any(
            p_lo <= r.partition <= p_hi and o_lo < r.end and r.start <= o_hi for r in ranges
        ):
            found.append(row)
    return found


def in_ranges(data: pa.Table, ranges: Sequence[OffsetRange]) -> pa.ChunkedArray:
    """Per row: do its coordinates fall in one of `ranges`? The rule a replace removes rows
    by, here and in every derived output (jobs/derived/replace.py `in_ranges`)."""
    hit = pa.chunked_array([pa.array([False] * data.num_rows, pa.bool_())])
    for r in ranges:
        one = pc.and_(
            pc.and_(
                pc.equal(data[TOPIC], r.topic),
                pc.equal(data[PARTITION], r.partition),
            ),
            pc.and_(
                pc.greater_equal(data[OFFSET], r.start),
                pc.less(data[OFFSET], r.end),
            ),
        )
        hit = pc.or_(hit, pc.fill_null(one, False))
    return hit
