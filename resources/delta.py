"""Publishing staged files to a Delta table with delta-rs: the commit half of the protocol.

The commit is a compare-and-set on the table's application transaction version: read the
version, publish only if the batch id is above it, and let the commit fail (no automatic
retry) if anyone else committed in between; then read again and decide again. delta-rs does
not enforce the version for you (protocol.md, invariant 2).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction

from ledger.batch import StagedFile
from ledger.errors import InconsistencyError
from ledger.protocol import OffsetRange
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


#: The key under which every exactly commit stores its batch in the commit info.
METADATA_KEY = "exactly"


def encode_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def decode_schema(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


@dataclass(frozen=True)
class CommitOutcome:
    """What one publish did. `published` is False when the table already had the batch."""

    published: bool
    table_version: int
    tries: int
    seconds: float


@dataclass(frozen=True)
class TableStats:
    """What an operator sees of a table: its version, its rows, and an application's last batch."""

    version: int
    row_count: int
    #: the last batch id the application committed, or None if it never committed
    app_version: int | None


class DeltaTarget:
    """One Delta table location and the operations the protocol needs on it."""

    def __init__(self, uri: str, storage_options: Mapping[str, str] | None = None) -> None:
        self.uri = uri
        self.storage_options = dict(storage_options or {})

    def load(self) -> DeltaTable | None:
        try:
            return DeltaTable(self.uri, storage_options=self.storage_options or None)
        except TableNotFoundError:
            return None

    def transaction_version(self, app_id: str) -> int | None:
        """The last batch id committed by `app_id`, or None (no table, or never committed)."""
        table = self.load()
        return None if table is None else table.transaction_version(app_id)

    def stats(self, app_id: str) -> TableStats | None:
        """The table's version, its row count (from the files' statistics) and `app_id`'s
        last batch; None while the table does not exist."""
        table = self.load()
        if table is None:
            return None
        actions = table.get_add_actions(flatten=True)
        return TableStats(
            version=table.version(),
            row_count=int(sum(actions.column("num_records").to_pylist() or [0])),
            app_version=table.transaction_version(app_id),
        )

    def _create(self, schema: pa.Schema) -> None:
        try:
            DeltaTable.create(
                self.uri,
                schema=schema,
                mode="ignore",
                storage_options=self.storage_options or None,
            )
        except Exception:
            if self.load() is None:
                raise

    def publish(
        self,
        *,
        app_id: str,
        batch_id: int,
        files: Iterable[StagedFile],
        schema: pa.Schema,
        metadata: Mapping[str, Any],
    ) -> CommitOutcome:
        """Add exactly `files` and the app transaction (app_id, batch_id) in one commit.

        Idempotent: a batch at or below the table's version for `app_id` publishes nothing.
        Protects invariants 1, 2 and 3.
        """
        adds = _adds(files)
        return self._commit(app_id, batch_id, schema, metadata, lambda _table, _try: adds)

    def replace(
        self,
        *,
        app_id: str,
        batch_id: int,
        files: Iterable[StagedFile],
        schema: pa.Schema,
        metadata: Mapping[str, Any],
        ranges: Sequence[OffsetRange],
        rewrite_dir: str,
    ) -> CommitOutcome:
        """In one commit: remove every row whose coordinates fall in `ranges` and add `files`.

        Rows are removed by predicate, not by file: a file that also holds rows outside the
        ranges (after compaction merged several batches, say) is rewritten without them
        into `rewrite_dir`, and the commit swaps it. Readers see the old rows or the new
        ones, never both and never neither. Which files to rewrite is decided again on
        every try, from the table as it is then.
        """
        adds = _adds(files)

        def actions(table: DeltaTable, attempt: int) -> list[Any]:
            return [*adds, *self._remove_rows(table, ranges, rewrite_dir, attempt)]

        return self._commit(app_id, batch_id, schema, metadata, actions)

    def _remove_rows(
        self, table: DeltaTable, ranges: Sequence[OffsetRange], rewrite_dir: str, attempt: int
    ) -> list[Any]:
        actions: list[Any] = []
        now_ms = int(time.time() * 1000)
        for entry in _files_touching(table, ranges):
            path = entry["path"]
            data = pq.read_table(storage.join(self.uri, path))
            hit = _in_ranges(data, ranges)
            removed = pc.sum(hit.cast(pa.int64())).as_py() or 0
            if removed == 0:
                continue
            actions.append(RemoveAction(path, True, now_ms, entry["size_bytes"], {}))
            kept = data.filter(pc.invert(hit))
            if kept.num_rows == 0:
                continue
            digest = hashlib.sha1(path.encode()).hexdigest()[:16]
            target = storage.join(rewrite_dir, f"rewrite-{attempt}-{digest}.parquet")
            storage.ensure_parent(target)
            pq.write_table(kept, target)
            meta = pq.read_metadata(target)
            info = storage.file_info(target)
            actions.append(
                AddAction(
                    storage.relative(target, self.uri),
                    info.size,
                    {},
                    info.modification_time_ms,
                    True,
                    json.dumps(delta_stats(meta), separators=(",", ":")),
                )
            )
        return actions

    def _commit(
        self,
        app_id: str,
        batch_id: int,
        schema: pa.Schema,
        metadata: Mapping[str, Any],
        actions_for: Callable[[DeltaTable, int], list[Any]],
        max_tries: int = 50,
    ) -> CommitOutcome:
        """The compare-and-set loop every commit goes through.

        Read the table; if its version for `app_id` is at or past `batch_id` the batch is
        already there. Otherwise commit with no automatic retry: if anyone committed in
        between, the commit fails and the next try re-reads and decides again, so a
        concurrent commit of the same batch ends here as `published=False`, never a second
        copy (invariant 2).
        """
        started = time.perf_counter()
        last_error: Exception | None = None
        for tries in range(1, max_tries + 1):
            table = self.load()
            if table is None:
                self._create(schema)
                continue
            version = table.transaction_version(app_id)
            if version is not None and version >= batch_id:
                return CommitOutcome(False, table.version(), tries, time.perf_counter() - started)
            try:
                table.create_write_transaction(
                    actions_for(table, tries),
                    "append",
                    schema,
                    commit_properties=CommitProperties(
                        app_transactions=[Transaction(app_id, batch_id)],
                        custom_metadata={METADATA_KEY: dict(metadata)},
                        max_commit_retries=0,
                    ),
                )
            except CommitFailedError as exc:
                last_error = exc
                time.sleep(min(0.05 * tries, 1.0))
                continue
            table.update_incremental()
            return CommitOutcome(True, table.version(), tries, time.perf_counter() - started)
        raise InconsistencyError(
            f"{self.uri}: batch {app_id}/{batch_id} lost {max_tries} commit races in a row; "
            f"last error: {last_error}"
        )

    def offset_reach(self, topic: str) -> dict[int, int]:
        """Per partition, one past the highest `_kafka_offset` of `topic` in the table's rows.

        From the files' statistics where a file holds one partition of this topic only;
        other files are read (their coordinate columns only). For an operator deciding
        where to continue when the log no longer says (ledger/decisions.py).
        """
        table = self.load()
        if table is None:
            return {}
        reach: dict[int, int] = {}
        actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
        for row in actions:
            t_lo, t_hi = row.get("min._kafka_topic"), row.get("max._kafka_topic")
            p_lo, p_hi = row.get("min._kafka_partition"), row.get("max._kafka_partition")
            o_hi = row.get("max._kafka_offset")
            if t_lo is not None and t_hi is not None and not t_lo <= topic <= t_hi:
                continue
            if t_lo == t_hi == topic and p_lo is not None and p_lo == p_hi and o_hi is not None:
                reach[p_lo] = max(reach.get(p_lo, 0), o_hi + 1)
                continue
            data = pq.read_table(
                storage.join(self.uri, row["path"]),
                columns=["_kafka_topic", "_kafka_partition", "_kafka_offset"],
            )
            data = data.filter(pc.fill_null(pc.equal(data["_kafka_topic"], topic), False))
            for p, o in zip(
                data.column("_kafka_partition").to_pylist(),
                data.column("_kafka_offset").to_pylist(),
                strict=True,
            ):
                if p is not None and o is not None:
                    reach[p] = max(reach.get(p, 0), o + 1)
        return reach

    def committed_batches(self, app_id: str) -> list[dict[str, Any]]:
        """The exactly metadata of every commit by `app_id` still in the log, oldest first.

        Enough to rebuild the ledger's committed history (invariant 7).
        """
        table = self.load()
        if table is None:
            return []
        found = []
        for entry in table.history():
            meta = entry.get(METADATA_KEY)
            if isinstance(meta, str):
                meta = json.loads(meta)
            if isinstance(meta, dict) and meta.get("app_id") == app_id:
                found.append({**meta, "table_version": entry.get("version")})
        found.sort(key=lambda m: m["batch_id"])
        return found


def _adds(files: Iterable[StagedFile]) -> list[AddAction]:
    return [
        AddAction(f.path, f.size, {}, f.modification_time, True, f.stats)
        for f in files
        if f.records > 0
    ]


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


def _in_ranges(data: pa.Table, ranges: Sequence[OffsetRange]) -> pa.ChunkedArray:
    """Per row: do its coordinates fall in one of `ranges`?"""
    hit = pa.chunked_array([pa.array([False] * data.num_rows)])
    for r in ranges:
        one = pc.and_(
            pc.and_(
                pc.equal(data["_kafka_topic"], r.topic),
                pc.equal(data["_kafka_partition"], r.partition),
            ),
            pc.and_(
                pc.greater_equal(data["_kafka_offset"], r.start),
                pc.less(data["_kafka_offset"], r.end),
            ),
        )
        hit = pc.or_(hit, pc.fill_null(one, False))
    return hit
