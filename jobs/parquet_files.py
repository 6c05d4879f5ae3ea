"""Describe staged Parquet files for the prepare vote: size, record count, Delta statistics.

Each footer is read once, here; the vote stores the result and the commit reuses it, so
publishing never touches the data files again.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from decimal import Decimal
from typing import Any

import pyarrow.parquet as pq

from ledger.store import StagedFile
from resources import storage

#: Longer strings are left out of min/max: a truncated max would be smaller than the real
#: value and make data skipping drop rows that match.
_MAX_STAT_STRING = 64


def _json_value(value: Any) -> Any:
    if isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return value if len(value) <= _MAX_STAT_STRING else None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return None
    return None


def delta_stats(meta: pq.FileMetaData) -> dict[str, Any]:
    """Delta `stats` for one file from its footer: numRecords, and min/max/nullCount for
    top-level primitive columns whose every row group carries statistics."""
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    schema = meta.schema
    for col_index in range(meta.num_columns):
        path = schema.column(col_index).path
        if "." in path:
            continue
        lo = hi = None
        null_count = 0
        complete = True
        for rg in range(meta.num_row_groups):
            st = meta.row_group(rg).column(col_index).statistics
            if st is None:
                complete = False
                break
            null_count += st.null_count or 0
            if st.has_min_max:
                lo = st.min if lo is None else min(lo, st.min)
                hi = st.max if hi is None else max(hi, st.max)
        if not complete:
            continue
        nulls[path] = null_count
        lo_json, hi_json = _json_value(lo), _json_value(hi)
        if lo_json is not None and hi_json is not None:
            mins[path], maxs[path] = lo_json, hi_json
    return {"numRecords": meta.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}


def describe(folder: str, table_root: str, target: str) -> list[StagedFile]:
    """The Parquet files in one attempt's own staging folder, as the vote records them."""
    files = []
    for info in storage.list_data_files(folder):
        meta = pq.read_metadata(info.uri)
        files.append(
            StagedFile(
                target=target,
                path=storage.relative(info.uri, table_root),
                size=info.size,
                records=meta.num_rows,
                modification_time=info.modification_time_ms,
                stats=json.dumps(delta_stats(meta), separators=(",", ":")),
            )
        )
    return files
