"""A table restored behind the pipeline (Delta's RESTORE, by delta-spark, delta-rs or any
tool): which of the pipeline's batches it took out.

RESTORE writes one commit that removes every file added after the version it restores to,
and adds back the ones removed since. It does not take back the application transactions
the removed commits carried (tested on delta-rs 1.6: `transaction_version` is unchanged),
so the table goes on saying it holds batches whose rows it no longer has. Nothing in the
protocol would notice: the next batch's version check passes, it commits on top, and the
records of the batches restored away are gone from the table for good while Kafka's
positions say they were written (invariant 1). So the publisher asks, before each vote,
which restores the log holds and which of its batches they took out
(jobs/publish/restore_check.py decides whether their rows are back).

The log is read through boto3, newest entry first, as writers.py reads it, and one process
keeps what it read (`RestoresSeen`, on the DeltaTarget): after the first read, only the
entries committed since. The first read goes back past the pipeline's newest commits
(`OWN_COMMITS_BACK` of them): a restore older than those was read by the process that
voted them. A restore found reads the entries between the version it restored to and
itself once, for the batches they committed.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from deltalake import DeltaTable

from resources.delta.log import commit_info, entry_uri, exactly_metadata
from resources.delta.options import store_failure
from resources.object_storage import storage

#: How many of the pipeline's own commits the first read of a log goes back past: a batch
#: of each application id may have voted before a restore and committed after it.
OWN_COMMITS_BACK = 3
#: At most how many entries the first read of a log goes back: a restore older than that,
#: with no process of the pipeline running since, is not looked for (a bound on the cost
#: of a start on a log of other writers' commits).
FIRST_READ_ENTRIES = 500


@dataclass(frozen=True)
class Restore:
    """A RESTORE commit: its log version, the version it restored to, and the pipeline's
    batches it may have taken out (their commit metadata, with `table_version` and
    `rows_added`, the rows the commit added by its statistics), oldest first."""

    at: int
    to: int
    removed: tuple[dict[str, Any], ...]


@dataclass
class RestoresSeen:
    """The restores one process read in a table's log, through log version `upto` of the
    table whose metadata id is `table_id`."""

    table_id: str | None = None
    upto: int = -1
    found: list[Restore] = field(default_factory=list)
    #: the log versions of restores whose batches are all back (jobs/publish/restore_check.py),
    #: until the next restore is read: one back to a version a resolved restore wrote takes
    #: that restore's batches out again, with none committed in its own window
    resolved: set[int] = field(default_factory=set)

    def through(self, table: DeltaTable, uri: str, own: Collection[str]) -> list[Restore]:
        """Every restore of `table`'s log this process has read, through its snapshot's
        version, with the batches of the application ids `own` each took out."""
        table_id, version = table.metadata().id, table.version()
        if table_id != self.table_id or version < self.upto:
            self.table_id, self.upto, self.found, self.resolved = table_id, -1, [], set()
        first = self.upto < 0
        oldest = max(self.upto, version - FIRST_READ_ENTRIES) if first else self.upto
        known = len(self.found)
        try:
            self._read(uri, own, version, oldest, first)
        except OSError as exc:
            raise store_failure(uri, exc) from exc
        if len(self.found) > known:
            self.resolved.clear()
        self.upto = version
        return self.found

    def _read(self, uri: str, own: Collection[str], version: int, oldest: int, first: bool) -> None:
        """Read the entries from `version` down to (not including) `oldest`, newest first."""
        own_seen = 0
        for at in range(version, oldest, -1):
            entry = storage.read_bytes(entry_uri(uri, at))
            if entry is None:
                break  # removed by log retention, and every entry before it too
            info = commit_info(entry)  # {} for a writer that records none
            if info.get("operation") == "RESTORE":
                to = _restored_to(info)
                self.found.append(Restore(at, to, tuple(_batches_between(uri, to, at, own))))
            meta = exactly_metadata(info)
            if first and meta is not None and meta.get("app_id") in own:
                own_seen += 1
                if own_seen >= OWN_COMMITS_BACK:
                    break


def _restored_to(info: dict[str, Any]) -> int:
    """The version a RESTORE commit restored to; -1 when it does not say (a restore by
    timestamp may not): every earlier batch is then asked about, which only costs reads."""
    try:
        return int((info.get("operationParameters") or {}).get("version"))
    except (TypeError, ValueError):
        return -1


def _batches_between(uri: str, low: int, high: int, own: Collection[str]) -> list[dict[str, Any]]:
    """The commit metadata of `own`'s batches committed at log versions strictly between
    `low` and `high`, oldest first; entries gone to retention are skipped."""
    found = []
    for at in range(max(low + 1, 0), high):
        entry = storage.read_bytes(entry_uri(uri, at))
        meta = exactly_metadata(commit_info(entry))
        if meta is not None and meta.get("app_id") in own and "ranges" in meta:
            found.append({**meta, "table_version": at, "rows_added": _rows_added(entry)})
    return found


def _rows_added(entry: bytes | None) -> int | None:
    """The rows a log entry's add actions hold by their statistics; None when one has none."""
    rows = 0
    for line in (entry or b"").splitlines():
        add = json.loads(line).get("add")
        if isinstance(add, dict):
            stats = json.loads(add.get("stats") or "{}")
            if "numRecords" not in stats:
                return None
            rows += int(stats["numRecords"])
    return rows
