"""Reading a Delta table's log for what exactly wrote there: the commit info every batch's
commit carries (written by resources/delta/commit.py), the batches an application committed,
the files the log still names, how far a topic's offsets reach in the table's rows and
which topics they hold.

Their own module because these are the reads that rebuild or check the ledger from the
table (invariant 7, the cleaner, an operator's recovery), never part of a commit's decision.
Each takes a table as DeltaTarget.load returned it.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from ledger.core.layout import KEY, OFFSET, PARTITION, TOPIC
from resources.object_storage import storage

#: The key under which every exactly commit stores its batch in the commit info.
METADATA_KEY = "exactly"


def entry_uri(uri: str, version: int) -> str:
    """Where the log entry of `version` of the table at `uri` is (a JSON file per commit)."""
    return storage.join(uri, "_delta_log", f"{version:020d}.json")


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


def committed_batches(table: DeltaTable, app_id: str) -> list[dict[str, Any]]:
    """The exactly metadata of every commit by `app_id` still in the log, oldest first.

    Enough to rebuild the ledger's committed history (invariant 7).
    """
    found = [
        {**meta, "table_version": version}
        for version, meta in _exactly_commits(table)
        if meta.get("app_id") == app_id
    ]
    found.sort(key=lambda m: m["batch_id"])
    return found


def batch_commit(
    uri: str, table: DeltaTable, app_id: str, batch_id: int, depth: int = 100
) -> dict[str, Any] | None:
    """exactly's metadata of the commit of `app_id`'s batch `batch_id` in the table at `uri`,
    looked for from the newest log entry back (a batch the table has just taken is at the
    head, one a recovery finds is near it), within `depth` entries; None when not found
    (gone with the log's retention, or further back)."""
    newest = table.version()
    for version in range(newest, max(-1, newest - depth), -1):
        meta = exactly_metadata(commit_info(storage.read_bytes(entry_uri(uri, version))))
        if meta is not None and (meta.get("app_id"), meta.get("batch_id")) == (app_id, batch_id):
            return meta
    return None


def other_writers(tables: Iterable[DeltaTable], own: Collection[str]) -> dict[str, dict[str, Any]]:
    """Every application id outside `own` whose exactly batches the logs of `tables` hold:
    its pipeline, its newest batch id, every topic its batches read and the newest log
    version that names it, by application id.

    Another pipeline's batches are not this pipeline's history: read under its own name,
    the same offsets would be committed a second time (ledger/core/other_writers.py)."""
    found: dict[str, dict[str, Any]] = {}
    for table in tables:
        for version, meta in _exactly_commits(table):
            if meta.get("app_id") not in own:
                seen_writer(found, meta, version)
    return found


def seen_writer(found: dict[str, dict[str, Any]], meta: Any, version: int | None = None) -> None:
    """Add one commit's exactly metadata (`meta`, of log `version`) to `found`, as
    `other_writers` gives it; anything else (a commit not exactly's) is left out."""
    app_id = meta.get("app_id") if isinstance(meta, dict) else None
    if not isinstance(app_id, str):
        return
    seen = found.setdefault(
        app_id, {"pipeline": meta.get("pipeline"), "batch_id": 0, "topics": set(), "version": -1}
    )
    seen["batch_id"] = max(seen["batch_id"], int(meta.get("batch_id") or 0))
    seen["topics"] |= {str(r["topic"]) for r in meta.get("ranges") or () if "topic" in r}
    if version is not None:
        seen["version"] = max(seen["version"], int(version))


def commit_info(entry: bytes | None) -> dict[str, Any]:
    """The commitInfo action of a raw log entry (as storage.read_bytes returns it), or {}
    when it has none (or there is no entry)."""
    for line in (entry or b"").splitlines():
        info = json.loads(line).get("commitInfo")
        if isinstance(info, dict):
            return info
    return {}


def exactly_metadata(info: Mapping[str, Any]) -> dict[str, Any] | None:
    """exactly's batch metadata in a commit's info (written as JSON text or an object), or
    None for a commit that is not exactly's."""
    meta = info.get(METADATA_KEY)
    if isinstance(meta, str):
        meta = json.loads(meta)
    return meta if isinstance(meta, dict) else None


def _exactly_commits(table: DeltaTable) -> Iterator[tuple[int | None, dict[str, Any]]]:
    """(version, exactly's commit metadata) of every commit in the log that has it."""
    for entry in table.history():
        meta = exactly_metadata(entry)
        if meta is not None:
            yield entry.get("version"), meta


def named_files(table: DeltaTable, uri: str) -> set[str]:
    """Every data file the table's log still names, '/'-separated and relative to the
    table's root (`uri`): the current snapshot's files and the files later commits removed
    whose tombstones the log still holds (time travel may read those).

    delta-rs has no call that lists tombstones, so they come from its own VACUUM's dry run
    with zero retention in "lite" mode, which lists exactly the tombstoned files present
    in storage and deletes nothing. A tombstone stamped in the future by a committer
    whose clock runs ahead is missed by that dry run; callers keep such files by other
    means (the ledger's votes).
    """
    current = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
    removed = table.vacuum(retention_hours=0, dry_run=True, enforce_retention_duration=False)
    # Delta %-encodes paths; whether a reader decodes them varies, so keep both forms
    return {
        _relative_log_path(form, uri)
        for path in [*current, *removed]
        for form in (path, unquote(path))
    }


def _relative_log_path(path: str, uri: str) -> str:
    """A log's path as the ledger records it: relative to the root, '/'-separated."""
    if "://" in path or path.startswith("/"):
        try:
            return storage.relative(path.removeprefix("file://"), uri)
        except ValueError:
            return path  # outside the table's root: never under its staged/ folder
    return path


def offset_reach(table: DeltaTable, uri: str, topic: str) -> dict[int, int]:
    """Per partition, one past the highest `_kafka_offset` of `topic` in the table's rows.

    From the files' statistics where a file holds one partition of this topic only;
    other files are read (their coordinate columns only). For an operator deciding
    where to continue when the log no longer says (ledger/core/decisions.py).
    """
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
            storage.join(uri, row["path"]),
            columns=list(KEY),
        )
        data = data.filter(pc.fill_null(pc.equal(data[TOPIC], topic), False))
        for p, o in zip(
            data.column(PARTITION).to_pylist(),
            data.column(OFFSET).to_pylist(),
            strict=True,
        ):
            if p is not None and o is not None:
                reach[p] = max(reach.get(p, 0), o + 1)
    return reach


#: Delta writers may cut string statistics to this many characters (delta-spark's
#: `dataSkippingStringPrefixLength`): a shorter min or max is the value itself.
_WHOLE_STRING_STATS = 32


def topics_in_rows(table: DeltaTable, uri: str, topics: Collection[str]) -> set[str]:
    """Which of `topics` the table's rows hold in `_kafka_topic`, whoever wrote them.

    What the log cannot say once retention has dropped the commits that wrote them (their
    commit info named the pipeline and its topics). A file whose statistics say one other
    topic, whole, is skipped; any other file is read, its topic column only, until every
    topic asked for is found.
    """
    wanted, found = set(topics), set()
    for row in pa.table(table.get_add_actions(flatten=True)).to_pylist():
        if f"partition.{TOPIC}" in row:  # a table partitioned by topic: the log says it
            found |= wanted & {row[f"partition.{TOPIC}"]}
            continue
        low, high = row.get("min._kafka_topic"), row.get("max._kafka_topic")
        whole = isinstance(low, str) and len(low) < _WHOLE_STRING_STATS
        if whole and low == high and low not in wanted:
            continue
        column = storage.read_parquet(storage.join(uri, row["path"]), columns=[TOPIC])[TOPIC]
        found |= wanted & set(pc.unique(column).to_pylist())
        if found == wanted:
            break
    return found
