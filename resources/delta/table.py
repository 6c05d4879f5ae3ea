"""Publishing staged files to a Delta table with delta-rs: the commit half of the protocol.

The commit is a compare-and-set on the table's application transaction version: read the
version, publish only if the batch id is above it, and let the commit fail (no automatic
retry) if anyone else committed in between; then read again and decide again. delta-rs does
not enforce the version for you (docs/protocol.md, invariant 2).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import hashlib
import json
import math
import os
import re
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, TableFeatures, Transaction
from deltalake import Field as DeltaField
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.schema import ArrayType, MapType, StructType
from deltalake.transaction import AddAction, RemoveAction

from ledger.core.batch import StagedFile
from ledger.core.errors import ConfigError, InconsistencyError, RefusedBatchError, UnreachableError
from ledger.core.protocol import OffsetRange
from resources.config.partitioning import (
    PartitionColumn,
    check_layout,
    entry_values,
    folders,
    names,
    partition_values,
    with_generation,
)
from resources.object_storage import storage

#: Commits in a row whose outcome is unknown (below) before the error is raised: a store
#: that keeps failing that way has a problem a retry will not fix.
MAX_UNKNOWN_OUTCOMES = 5

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


#: The key under which every exactly commit stores its batch in the commit info.
METADATA_KEY = "exactly"


def user_metadata(metadata: Mapping[str, Any]) -> str:
    """A batch's commit as one line in the commit info's `userMetadata`, the field
    delta-spark's DESCRIBE HISTORY shows as a column (our own key, METADATA_KEY, is kept
    for the ledger's rebuild but DESCRIBE HISTORY does not show it): the batch, its kind or
    backfill mode, and its ranges."""
    ranges = " ".join(
        f"{r['topic']}-{r['partition']}[{r['start']},{r['end']})"
        for r in metadata.get("ranges") or ()
    )
    kind = (metadata.get("params") or {}).get("mode") or metadata.get("kind") or "batch"
    return f"exactly {metadata.get('app_id')}/{metadata.get('batch_id')} {kind}: {ranges}".strip()


def encode_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def decode_schema(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


# -- schema changes (invariant 14) ---------------------------------------------------------

#: Types a table can hold only once its protocol has the named writer feature. A widening
#: commit does not add features, so a new column of such a type is refused instead.
_FEATURE_OF_TYPE = {"timestamp_ntz": "timestampNtz"}


def delta_type_name(dtype: Any) -> str:
    """A Delta type as an operator reads it: `long`, `array<string>`, `struct<a:int not null>`.

    Complex types spell out every nested name and nullability, so two types are the same
    exactly when their names are, and an error never shows two equal-looking types.
    """
    if isinstance(dtype, ArrayType):
        return f"array<{_nested(dtype.element_type, dtype.contains_null)}>"
    if isinstance(dtype, MapType):
        key, value = delta_type_name(dtype.key_type), dtype.value_type
        return f"map<{key},{_nested(value, dtype.value_contains_null)}>"
    if isinstance(dtype, StructType):
        fields = ",".join(f"{f.name}:{_nested(f.type, f.nullable)}" for f in dtype.fields)
        return f"struct<{fields}>"
    return str(getattr(dtype, "type", dtype))


def _nested(dtype: Any, nullable: bool) -> str:
    return delta_type_name(dtype) + ("" if nullable else " not null")


def _primitive_names(dtype: Any) -> set[str]:
    if isinstance(dtype, ArrayType):
        return _primitive_names(dtype.element_type)
    if isinstance(dtype, MapType):
        return _primitive_names(dtype.key_type) | _primitive_names(dtype.value_type)
    if isinstance(dtype, StructType):
        return set().union(*(_primitive_names(f.type) for f in dtype.fields))
    return {str(getattr(dtype, "type", dtype))}


def widen_schema(
    table_schema: DeltaSchema,
    batch_schema: pa.Schema,
    *,
    where: str,
    table_features: Iterable[str] = (),
) -> DeltaSchema | None:
    """The schema a batch's commit must carry: None if the batch fits the table as it is,
    else the table's columns followed by the batch's new ones, all nullable.

    Invariant 14. Compatible: every column the batch shares with the table has the table's
    type; a table column the batch lacks is nullable (its new rows read as null); a new
    column is added as nullable (the table's older rows read it as null). Anything else is
    refused with RefusedBatchError naming every offending column and both types: a type
    change (nested ones included), a NOT NULL column the batch lacks or may fill with
    nulls, a name that differs from a table column only in case (Delta column names are
    case-insensitive), a new column whose type needs a table feature the table lacks.
    """
    try:
        batch = DeltaSchema.from_arrow(batch_schema)
    except Exception as exc:  # delta-rs raises a bare Exception, e.g. for duplicate names
        raise RefusedBatchError(
            f"{where}: the batch's schema is not a valid Delta schema (invariant 14): {exc}"
        ) from exc
    table_fields = {f.name: f for f in table_schema.fields}
    by_lower = {name.lower(): name for name in table_fields}
    features = set(table_features)
    problems: list[str] = []
    added: list[DeltaField] = []
    for field in batch.fields:
        batch_type = delta_type_name(field.type)
        known = table_fields.get(field.name)
        if known is None:
            twin = by_lower.get(field.name.lower())
            lacking = sorted(
                feature
                for name, feature in _FEATURE_OF_TYPE.items()
                if name in _primitive_names(field.type) and feature not in features
            )
            if twin is not None:
                problems.append(
                    f"column {field.name}: the table has {twin} "
                    "(Delta column names are case-insensitive)"
                )
            elif lacking:
                problems.append(
                    f"column {field.name}: new {batch_type} column needs the table feature(s) "
                    f"{', '.join(lacking)}, which the table does not have"
                )
            else:
                added.append(DeltaField(field.name, field.type, nullable=True))
            continue
        table_type = delta_type_name(known.type)
        if table_type != batch_type:
            problems.append(
                f"column {field.name}: the table has {table_type}, the batch has {batch_type}"
            )
        elif not known.nullable and field.nullable:
            problems.append(
                f"column {field.name}: NOT NULL {table_type} in the table, nullable in the batch"
            )
    batch_names = {f.name.lower() for f in batch.fields}
    for known in table_schema.fields:
        if known.name.lower() not in batch_names and not known.nullable:
            problems.append(
                f"column {known.name}: NOT NULL {delta_type_name(known.type)} in the table, "
                "missing from the batch"
            )
    if problems:
        raise RefusedBatchError(
            f"{where}: the batch's schema is incompatible with the table's "
            f"(invariant 14): {'; '.join(problems)}"
        )
    if not added:
        return None
    return DeltaSchema([*table_schema.fields, *added])


def _table_widened(table: DeltaTable, schema: pa.Schema, uri: str) -> DeltaSchema | None:
    features = table.protocol().writer_features or ()
    return widen_schema(table.schema(), schema, where=f"Delta table {uri}", table_features=features)


#: What protocol writer version 2 implies, named once a table has writer version 7.
_LEGACY_WRITER_FEATURES = ("invariants", "appendOnly")


def _with_legacy_features(table: DeltaTable) -> None:
    """Name `invariants` and `appendOnly` in the protocol of a table delta-rs created at
    writer version 7 without them.

    delta-rs 1.6 creates a table with a timestamp_ntz column at writer version 7 with the
    single feature timestampNtz, dropping what writer version 2 implied; delta-spark then
    refuses to read the table at all (DELTA_FEATURES_PROTOCOL_METADATA_MISMATCH: every
    NOT NULL column, the coordinates included, is an invariant). delta-spark names both
    when it upgrades a table itself. Called right after the create, by every creator: a
    second creator's concurrent commit only makes this one fail, and then the features are
    there. A table created without them before this fix is left as it is: its repair is a
    commit of its own, delta-rs's `DeltaTable.alter.add_feature` with these two."""
    protocol = table.protocol()
    if protocol.min_writer_version < 7:
        return
    have = set(protocol.writer_features or ())
    if all(f in have for f in _LEGACY_WRITER_FEATURES):
        return
    try:
        table.alter.add_feature(
            [TableFeatures.Invariants, TableFeatures.AppendOnly],
            allow_protocol_versions_increase=True,
        )
    except CommitFailedError:
        table.update_incremental()
        have = set(table.protocol().writer_features or ())
        if not all(f in have for f in _LEGACY_WRITER_FEATURES):
            raise


def _no_file_filter(table: DeltaTable) -> list[tuple[str, str, list[str]]]:
    """A file filter that matches no file: an empty IN list, false with or without statistics.

    delta-rs 1.6 commits a new schema (a metaData action) only in mode "overwrite", which
    also removes every file its partition filter matches; with this filter, none.
    """
    for field in table.schema().fields:
        if not isinstance(field.type, ArrayType | MapType | StructType):
            return [(field.name, "in", [])]
    raise InconsistencyError(f"{table.table_uri}: no primitive column to filter files by")


# -- commits on S3 ----------------------------------------------------------------------------

#: How delta-rs 1.6 makes a commit on S3 atomic: it writes the log entry `N.json` with
#: `If-None-Match: *`, so of two writers of version N exactly one succeeds and the other
#: fails with CommitFailedError (then `_commit` re-reads and decides again). Set explicitly,
#: so a delta-rs default that changes can never silently make commits unconditional.
CONDITIONAL_PUT = ("aws_conditional_put", "etag")
#: delta-rs settings that make a commit something other than one conditional write: an
#: unconditional rename (two writers both "win" a version and one batch is lost), a lock
#: service we neither run nor test, or copy-if-not-exists in place of conditional put.
_UNSAFE_S3_SETTINGS = {
    "aws_s3_allow_unsafe_rename": "makes two writers of one log entry both succeed",
    "aws_s3_locking_provider": "exactly commits by conditional put and runs no lock service",
    "aws_copy_if_not_exists": "exactly commits by conditional put, not copy-if-not-exists",
    "copy_if_not_exists": "exactly commits by conditional put, not copy-if-not-exists",
}
_CONDITIONAL_PUT_NAMES = {"aws_conditional_put", "conditional_put"}
_FALSE = {"", "0", "false", "no", "off"}


def _unsafe(name: str, value: str, where: str) -> str | None:
    """Why setting `name` to `value` would make commits unsafe, or None."""
    key = name.lower()
    if key == "aws_s3_allow_unsafe_rename" and value.strip().lower() in _FALSE:
        return None
    if key in _UNSAFE_S3_SETTINGS and value.strip():
        return f"{where}{name}={value} is refused: it {_UNSAFE_S3_SETTINGS[key]}"
    if key in _CONDITIONAL_PUT_NAMES and value.strip().lower() != CONDITIONAL_PUT[1]:
        return (
            f"{where}{name}={value} is refused: commits on S3 need conditional put "
            f"({CONDITIONAL_PUT[1]}, If-None-Match), the only way exactly commits there"
        )
    return None


def storage_options_for(
    uri: str, configured: Mapping[str, str], env: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """delta-rs's options for the table at `uri`: for S3, the process's access (endpoint,
    region, keys: the same as boto3's and pyarrow's) under the config's own options, and
    conditional-put commits; elsewhere the config's options as they are.

    Raises ConfigError, one line, for any setting (in the config or the environment, which
    delta-rs also reads) that would let two writers both commit one table version.
    """
    if not storage.is_remote(uri):
        return dict(configured)
    storage.split_s3(uri)
    problems = [
        p
        for name, value in env.items()
        if name.startswith("AWS_") and (p := _unsafe(name, value, "environment variable "))
    ]
    problems += [
        p
        for name, value in configured.items()
        if (p := _unsafe(name, value, "delta.storage_options."))
    ]
    if problems:
        raise ConfigError(f"{uri}: {problems[0]}")
    name, value = CONDITIONAL_PUT
    return {**storage.s3_access().delta_storage_options(), **configured, name: value}


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


@dataclass(frozen=True)
class Compaction:
    """What one compaction of a table did."""

    files_removed: int
    files_added: int
    #: the table's version after it (the compaction's commit, when it made one)
    table_version: int
    tries: int


@dataclass(frozen=True)
class TableLayout:
    """How a table is stored now: the data files its snapshot reads, and their bytes."""

    files: int
    bytes: int


@dataclass
class _Kept:
    """One thread's table kept open between loads, and what vouches for it (DeltaTarget.load)."""

    table: DeltaTable
    #: the version whose log entry was fingerprinted: the table's version when a load last
    #: returned it, or older (a commit through the table moves the table on, not this)
    version: int
    #: storage.fingerprint of that version's log entry, taken after the table read it
    fingerprint: tuple[Any, ...]


class DeltaTarget:
    """One Delta table location and the operations the protocol needs on it.

    The table is kept open between calls, one delta-rs table per thread (load says why and
    when it is dropped); a DeltaTarget may be shared between threads.
    """

    def __init__(
        self,
        uri: str,
        storage_options: Mapping[str, str] | None = None,
        partition_by: Sequence[PartitionColumn] | None = None,
        *,
        generated: bool = True,
    ) -> None:
        self.uri = uri
        #: whether the partition columns are created as Delta generated columns: not for a
        #: table delta-rs MERGEs into (resources/delta/window_dates.py says why)
        self.generated = generated
        #: the partition columns the config gives this table (a new table is created with
        #: them; an existing one must have them), or None: take the table's as they are
        self.partition_by = None if partition_by is None else tuple(partition_by)
        self.storage_options = storage_options_for(uri, storage_options or {})
        #: `kept`: this thread's _Kept, or absent/None. Per thread because a delta-rs
        #: table is not safe to use from two threads at once, and one thread's update or
        #: failed commit must never change the table another thread is deciding on.
        self._local = threading.local()

    def load(self) -> DeltaTable | None:
        """The table's latest snapshot, None if there is no table.

        The table is kept open between calls (one per thread) and brought up to date with
        update_incremental(), which reads only the log entries committed since: a fresh
        load replays the log from the last checkpoint on every call, so a commit's cost
        grew with history (issue 13). The table returned is this thread's kept one: use it
        until the next load, and never time-travel it (stats opens a table of its own).

        update_incremental() trusts that the log it continues is the log it read. When the
        table was deleted and created again underneath it, that is false, and it does not
        always say so (tests/test_delta_commit.py):
        - the new table has fewer versions: delta-rs raises (a DeltaError);
        - as many: there is nothing newer to read, and the old snapshot (old files, old
          schema) is returned as current;
        - more: the new table's later entries are replayed on top of the old one's
          files, a mixture of both tables that no fresh load would ever read.
        So a kept table is used only while the log entry of a version it read is still the
        very file it read (storage.fingerprint; a new table writes new files, even at the
        same names). The check comes after the update, so that whatever the update read
        is covered: a new table can write an entry at or past that version only after
        the old entry was deleted, so if the old entry is still there after the update,
        every entry the update read was the old table's. The newest entry's fingerprint,
        taken before that check, is what the next load checks.
        The kept table is dropped, and the table loaded afresh, when:
        - that entry changed or vanished (re-created, deleted, or its log cleaned up
          by retention after the process kept the table for longer than it keeps logs);
        - update_incremental() raised (a DeltaError or OSError: a re-created table, or
          the store failing; a fresh load then says which);
        - a commit through the table raised (_commit: its outcome, and what delta-rs
          left in the table object, are unknown), or anything else went wrong between.
        This assumes a re-created table is written after the old log was deleted (or at
        least its entry of the kept version), as deleting and creating a table does; a
        tool that overwrote a live table's log in place, file by file, could be read as
        a mixture, as any reader of that table could.

        delta-rs retries the store itself (resources/object_storage/s3.py sizes its budget); a
        failure
        that outlasts it is an UnreachableError naming the table, one line.
        """
        kept: _Kept | None = getattr(self._local, "kept", None)
        if kept is not None:
            table = self._brought_up_to_date(kept)
            if table is not None:
                return table
        return self._load_fresh()

    def _brought_up_to_date(self, kept: _Kept) -> DeltaTable | None:
        """The kept table updated, or None (then dropped) when it cannot be vouched for."""
        self._forget()  # kept again below only once vouched for, whatever is raised
        try:
            kept.table.update_incremental()
        except (DeltaError, OSError):
            return None
        version = kept.table.version()
        try:
            latest = (
                kept.fingerprint
                if version == kept.version
                else storage.fingerprint(self._log_entry(version))
            )
            unchanged = storage.fingerprint(self._log_entry(kept.version)) == kept.fingerprint
        except OSError:
            return None  # a log entry we cannot read is no proof: a fresh load decides
        if not unchanged or latest is None:
            return None
        self._local.kept = _Kept(kept.table, version, latest)
        return kept.table

    def _load_fresh(self) -> DeltaTable | None:
        """A fresh load of the latest snapshot, kept for the next loads if it can be vouched
        for.

        Its newest log entry is fingerprinted after the load read it, so a table
        re-created in between would be fingerprinted with the new table's entry and its
        old snapshot kept for good. A second fresh load after the fingerprint closes that:
        a table's metadata id is random at creation, so if the second load's id is the
        first's, the table was never replaced between the two, and the entry
        fingerprinted in between is the first load's. This doubles the cost of a fresh
        load, which happens once per thread and after a failure, never per batch. A table
        that cannot be vouched for is returned all the same (it is what a fresh load
        reads, as before tables were kept), and the next load is fresh again.
        """
        self._forget()
        table = self._open()
        if table is None:
            return None
        version = table.version()
        try:
            fingerprint = storage.fingerprint(self._log_entry(version))
        except OSError:
            return table
        if fingerprint is None:
            return table
        try:
            again = DeltaTable(self.uri, storage_options=self.storage_options or None)
        except (DeltaError, OSError):
            # no proof either way (a table being deleted, a store that fails, a read racing
            # a concurrent commit on a store whose listing lags): the first load stands,
            # unkept, as any fresh load did before tables were kept
            return table
        if again.metadata().id == table.metadata().id:
            self._local.kept = _Kept(table, version, fingerprint)
        return table

    def _forget(self) -> None:
        """Drop this thread's kept table: the next load is fresh."""
        self._local.kept = None

    @contextlib.contextmanager
    def _dropped_if_raises(self) -> Iterator[None]:
        """Around a commit through the kept table: if it raises (whatever the error), the
        table is dropped, so the next load is fresh (_commit says why)."""
        try:
            yield
        except BaseException:
            self._forget()
            raise

    def _open(self, version: int | None = None) -> DeltaTable | None:
        """A new table object, at `version` or the latest; None if there is no table."""
        try:
            return DeltaTable(
                self.uri, version=version, storage_options=self.storage_options or None
            )
        except TableNotFoundError:
            return None
        except OSError as exc:
            raise store_failure(self.uri, exc) from exc

    def _log_entry(self, version: int) -> str:
        return storage.join(self.uri, "_delta_log", f"{version:020d}.json")

    def transaction_version(self, app_id: str) -> int | None:
        """The last batch id committed by `app_id`, or None (no table, or never committed)."""
        table = self.load()
        return None if table is None else table.transaction_version(app_id)

    def stats(self, app_id: str, version: int | None = None) -> TableStats | None:
        """The table's version, its row count (from the files' statistics) and `app_id`'s
        last batch, as of `version` (default: the latest), so a batch's history shows the
        table it committed, not the table as it is now; None while the table does not exist.
        """
        # time travel on a table of its own: the kept one stays at the latest version
        table = self.load() if version is None else self._open(version)
        if table is None:
            return None
        actions = table.get_add_actions(flatten=True)
        return TableStats(
            version=table.version(),
            row_count=int(sum(actions.column("num_records").to_pylist() or [0])),
            app_version=table.transaction_version(app_id),
        )

    def layout(self) -> TableLayout | None:
        """The snapshot's file count and bytes, what compaction brings down; None while the
        table does not exist."""
        table = self.load()
        if table is None:
            return None
        sizes = table.get_add_actions(flatten=True).column("size_bytes").to_pylist()
        return TableLayout(files=len(sizes), bytes=int(sum(sizes)))

    def compact(self, max_tries: int = 20) -> Compaction | None:
        """Merge the table's small files (delta-rs OPTIMIZE compact); None without a table.

        Safe beside commits (docs/protocol.md, invariants 1 and 2): the commit changes no
        row (dataChange false) and no application transaction, so every app's version, and
        with it the idempotence of a batch's commit, is as before. Its new files are written
        at the table's root, never under `staged/`, so the cleaner never lists them; the
        files it removes stay in the log as tombstones, which the cleaner keeps (rule 1 of
        ledger/core/cleaning.py). A replace that removed rows from a file this compaction read
        makes its commit fail (Delta's conflict check: a concurrent delete of data it read),
        never resurrect them: the compaction is then planned again from the table as it is,
        here, rather than retried by delta-rs, from a table loaded afresh (a failed commit
        drops the kept table, as in _commit).
        """
        last_error: Exception | None = None
        for tries in range(1, max_tries + 1):
            table = self.load()
            if table is None:
                return None
            try:
                with self._dropped_if_raises():
                    done = table.optimize.compact(
                        commit_properties=CommitProperties(max_commit_retries=0)
                    )
            except CommitFailedError as exc:
                last_error = exc
                time.sleep(min(0.05 * tries, 1.0))
                continue
            table.update_incremental()
            return Compaction(
                files_removed=int(done.get("numFilesRemoved", 0)),
                files_added=int(done.get("numFilesAdded", 0)),
                table_version=table.version(),
                tries=tries,
            )
        raise InconsistencyError(
            f"{self.uri}: compaction lost {max_tries} commit races in a row; "
            f"last error: {last_error}"
        )

    def check_schema(self, schema: pa.Schema) -> DeltaSchema | None:
        """Refuse (RefusedBatchError) a staged schema this table cannot take (invariant 14).

        Returns the widened schema the batch's commit will carry, or None when the batch
        fits as it is or the table does not exist yet (its first commit creates it).
        """
        table = self.load()
        if table is None:
            return None
        self._partition_columns(table)
        return _table_widened(table, schema, self.uri)

    def _partition_columns(self, table: DeltaTable) -> list[str]:
        """The table's partition columns, once checked against the config's: a staged file
        is added under the table's own layout or not at all (resources/config/partitioning.py)."""
        columns = list(table.metadata().partition_columns)
        check_layout(self.uri, columns, self.partition_by)
        return columns

    def named_files(self) -> set[str]:
        """Every data file the table's log still names, '/'-separated and relative to the
        table's root: the current snapshot's files and the files later commits removed
        whose tombstones the log still holds (time travel may read those). Empty while the
        table does not exist.

        delta-rs has no call that lists tombstones, so they come from its own VACUUM's dry run
        with zero retention in "lite" mode, which lists exactly the tombstoned files present
        in storage and deletes nothing. A tombstone stamped in the future by a committer
        whose clock runs ahead is missed by that dry run; callers keep such files by other
        means (the ledger's votes).
        """
        table = self.load()
        if table is None:
            return set()
        current = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
        removed = table.vacuum(retention_hours=0, dry_run=True, enforce_retention_duration=False)
        # Delta %-encodes paths; whether a reader decodes them varies, so keep both forms
        return {
            self._relative_log_path(form)
            for path in [*current, *removed]
            for form in (path, unquote(path))
        }

    def _relative_log_path(self, path: str) -> str:
        """A log's path as the ledger records it: relative to the root, '/'-separated."""
        if "://" in path or path.startswith("/"):
            try:
                return storage.relative(path.removeprefix("file://"), self.uri)
            except ValueError:
                return path  # outside the table's root: never under its staged/ folder
        return path

    def _create(self, schema: pa.Schema) -> None:
        try:
            DeltaTable.create(
                self.uri,
                schema=with_generation(schema, self.partition_by or ())
                if self.generated
                else schema,
                partition_by=names(self.partition_by or ()) or None,
                mode="ignore",
                storage_options=self.storage_options or None,
            )
        except Exception:
            if self.load() is None:
                raise
        table = self.load()
        if table is not None:
            _with_legacy_features(table)
            self._forget()  # the table object moved on by a commit of its own: load afresh

    def ensure_table(self, schema: pa.Schema) -> None:
        """Create the table with `schema` unless it exists; a concurrent creator wins
        harmlessly. For writers other than `publish` (resources/delta/merge.py), which create the
        table the same way before their first commit."""
        self._create(schema)

    def commit_scope(self) -> contextlib.AbstractContextManager[None]:
        """Around a commit another module makes through the table `load` returned
        (resources/delta/merge.py's MERGE): if it raises, the kept table is dropped and the next
        load is fresh, for the reasons `_commit` gives."""
        return self._dropped_if_raises()

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
        files = list(files)

        def actions(table: DeltaTable, _try: int) -> list[Any]:
            return _adds(files, self._partition_columns(table))

        return self._commit(app_id, batch_id, schema, metadata, actions)

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
        files = list(files)

        def actions(table: DeltaTable, attempt: int) -> list[Any]:
            partitions = self._partition_columns(table)
            removes = self._remove_rows(table, ranges, rewrite_dir, attempt, partitions)
            return [*_adds(files, partitions), *removes]

        return self._commit(app_id, batch_id, schema, metadata, actions)

    def _remove_rows(
        self,
        table: DeltaTable,
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
            data = storage.read_parquet(storage.join(self.uri, path))
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
                    storage.relative(target, self.uri),
                    info.size,
                    values,
                    info.modification_time_ms,
                    True,
                    stats_json(stats),
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

        A failed try may have committed all the same, so whose commit a batch found in the
        table is decided by content, never by which error a try saw: the batch is
        `published` by this call if the table holds the very files a try of this call added
        (an attempt's staged paths are its own; fencing keeps a second process off them).
        Ways a try commits and still fails:
        - the object store wrote the log entry and its answer was lost: the client retries
          the conditional PUT, which now finds its own entry there (412) and reports a
          commit conflict (CommitFailedError);
        - delta-rs lists the log right after its own write to read the new snapshot, and a
          listing that lags the write (the loopback S3 server's can) fails that read
          (another DeltaError, counted against MAX_UNKNOWN_OUTCOMES);
        - a post-commit hook fails after the entry is written (a checkpoint that cannot
          be written: also a DeltaError).
        After any failed try the table object the try went through is dropped
        (_dropped_if_raises), so the next try reads the table afresh: whether delta-rs
        moved that object to the version it may have committed, or left it half-way, is
        as unknown as the commit itself, and a conflict means the table moved on anyway.
        """
        started = time.perf_counter()
        last_error: Exception | None = None
        unknown = 0
        ours: set[str] = set()
        for tries in range(1, max_tries + 1):
            table = self.load()
            if table is None:
                self._create(schema)
                continue
            version = table.transaction_version(app_id)
            if version is not None and version >= batch_id:
                published = bool(ours) and ours <= _paths(table)
                return CommitOutcome(
                    published, table.version(), tries, time.perf_counter() - started
                )
            properties = CommitProperties(
                app_transactions=[Transaction(app_id, batch_id)],
                custom_metadata={
                    METADATA_KEY: dict(metadata),
                    "userMetadata": user_metadata(metadata),
                },
                max_commit_retries=0,
            )
            actions = actions_for(table, tries)
            ours = {a.path for a in actions if isinstance(a, AddAction)}
            try:
                with self._dropped_if_raises():
                    if not self._write(table, actions, schema, properties):
                        continue
                    table.update_incremental()
            except CommitFailedError as exc:
                last_error = exc
                time.sleep(min(0.05 * tries, 1.0))
                continue
            except (DeltaError, OSError) as exc:
                unknown += 1
                if unknown > MAX_UNKNOWN_OUTCOMES:
                    raise store_failure(self.uri, exc) from exc
                last_error = exc
                time.sleep(min(0.05 * tries, 1.0))
                continue
            return CommitOutcome(True, table.version(), tries, time.perf_counter() - started)
        raise InconsistencyError(
            f"{self.uri}: batch {app_id}/{batch_id} lost {max_tries} commit races in a row; "
            f"last error: {last_error}"
        )

    def _write(
        self,
        table: DeltaTable,
        actions: list[Any],
        schema: pa.Schema,
        properties: CommitProperties,
    ) -> bool:
        """One commit of `actions` with `properties` (the app transaction) on `table`'s snapshot.

        A batch that brings new columns widens the table's schema in that same commit
        (invariant 14): readers see the new files and the new columns together, or neither.
        delta-rs 1.6 writes a metaData action only in mode "overwrite" (mode "append"
        ignores the schema it is given), so the widening commit is an overwrite whose file
        filter matches no file, checked on this very snapshot first, so that it removes
        nothing (invariant 1); the log records it as a WRITE in mode Overwrite.
        delta-rs takes RemoveActions only in mode "append", so a replace that widens the
        schema first adds the new nullable columns in a commit of their own (older rows read
        them as null, no row changes) and returns False: the caller re-reads and decides
        again, and then the replace fits the widened table as it is.
        """
        try:
            widened = _table_widened(table, schema, self.uri)
        except RefusedBatchError as exc:
            raise InconsistencyError(
                f"{exc}; the batch voted with this schema, so the table changed after its "
                "vote: make the table take the batch's schema, then recover"
            ) from exc
        if widened is None:
            table.create_write_transaction(actions, "append", schema, commit_properties=properties)
            return True
        if any(isinstance(a, RemoveAction) for a in actions):
            present = {f.name for f in table.schema().fields}
            table.alter.add_columns(
                [f for f in widened.fields if f.name not in present],
                commit_properties=CommitProperties(max_commit_retries=0),
            )
            return False
        no_file = _no_file_filter(table)
        doomed = table.file_uris(file_pruning_predicate=no_file)
        if doomed:
            raise InconsistencyError(
                f"{self.uri}: the schema-widening commit's filter {no_file} would remove "
                f"{len(doomed)} file(s), e.g. {doomed[0]}; refusing to commit (invariant 1)"
            )
        table.create_write_transaction(
            actions, "overwrite", widened, partition_filters=no_file, commit_properties=properties
        )
        return True

    def offset_reach(self, topic: str) -> dict[int, int]:
        """Per partition, one past the highest `_kafka_offset` of `topic` in the table's rows.

        From the files' statistics where a file holds one partition of this topic only;
        other files are read (their coordinate columns only). For an operator deciding
        where to continue when the log no longer says (ledger/core/decisions.py).
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
            # Only a file whose statistics say exactly this topic is judged by them: string
            # statistics may be truncated (a long topic name), so a range test could skip a
            # file that holds the topic, and the reach would come out short.
            if t_lo == t_hi == topic and p_lo is not None and p_lo == p_hi and o_hi is not None:
                reach[p_lo] = max(reach.get(p_lo, 0), o_hi + 1)
                continue
            data = storage.read_parquet(
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


def store_failure(uri: str, exc: Exception) -> UnreachableError:
    """A delta-rs error from the object store as one line naming the table: delta-rs writes
    its cause chain over several lines, coloured for a terminal.

    A local table's full or read-only disk says so (resources/failures/causes.py) rather than
    "the object store failed": the operator must free space, not wait for a server.
    """
    from resources.failures.causes import STORAGE_CAUSES, KnownCause, classify

    known = classify(exc)
    if known is not None and known.cause in STORAGE_CAUSES:
        # delta-rs names the file only for some errors; the table is always the news
        where = known.where if known.where.startswith("/") else uri
        return UnreachableError(KnownCause(known.cause, where).line())
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    parts = [line.strip().lstrip("↳").strip() for line in text.splitlines()]
    return UnreachableError(f"{uri}: the object store failed: {' '.join(p for p in parts if p)}")


def _paths(table: DeltaTable) -> set[str]:
    """The data files of the table's snapshot, as its add actions name them."""
    return set(pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist())


def _adds(files: Iterable[StagedFile], partition_columns: Sequence[str] = ()) -> list[AddAction]:
    """The add actions of `files` with records, each with its partition values (from its
    partition folders: resources/config/partitioning.py `partition_values`)."""
    return [
        AddAction(
            f.path,
            f.size,
            partition_values(f.path, partition_columns),
            f.modification_time,
            True,
            f.stats,
        )
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


def in_ranges(data: pa.Table, ranges: Sequence[OffsetRange]) -> pa.ChunkedArray:
    """Per row: do its coordinates fall in one of `ranges`? The rule a replace removes rows
    by, here and in every derived output (jobs/derived/replace.py `in_ranges`)."""
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
