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
    """A RESTORE commit: its log version, the version it restored to (-1: it does not
    say), and the pipeline's batches it may have taken out, by their commit metadata:
    `RestoresSeen` gives every one in its window, oldest first, each with `table_version`
    and `rows_added` (the rows the commit added by its statistics); `LogWalk` those whose
    rows changed, newest first (none when the version is not said)."""

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


@dataclass
class LogWalk:
    """Which of the pipeline's batch commits a table's current state holds, told from its
    log alone, for a table whose rows do not carry the batch's coordinates (a derived
    output: groups or latest records). One process keeps the entries it read, by version:
    an entry never changes while the table is the same (its metadata id).

    The state at a version is the state before it plus its commit, except for a RESTORE,
    whose state is the state of the version it restored to. So the walk goes down from the
    newest version, and at a RESTORE jumps to the version it restored to: every batch
    commit it jumps over (strictly between the two) is not in the state, whatever came
    after (an undo is a restore to the version before, whose jump lands below the first
    restore; a restore back to a version the first restore wrote jumps onto that restore,
    which jumps over its batches again). A commit is at one version only, so the jumps
    decide alone. The walk stops after `OWN_COMMITS_BACK` of the pipeline's commits it
    lands on (a restore below them was met by the process that committed them), or after
    `FIRST_READ_ENTRIES` entries, or at an entry gone to retention."""

    table_id: str | None = None
    entries: dict[int, tuple[int | None, dict[str, Any] | None]] = field(default_factory=dict)

    def taken_out(self, table: DeltaTable, uri: str, own: Collection[str]) -> Restore | None:
        """The newest restore on `table`'s current history that took out commits of the
        application ids `own`, or None."""
        if table.metadata().id != self.table_id:
            self.table_id, self.entries = table.metadata().id, {}
        try:
            return self._walk(uri, own, table.version())
        except OSError as exc:
            raise store_failure(uri, exc) from exc

    def _walk(self, uri: str, own: Collection[str], version: int) -> Restore | None:
        at, landed, read = version, 0, 0
        while at >= 0 and read < FIRST_READ_ENTRIES:
            entry = self._entry(uri, at)
            read += 1
            if entry is None:
                return None
            restored_to, meta = entry
            if restored_to is None:
                if meta is not None and meta.get("app_id") in own:
                    landed += 1
                    if landed >= OWN_COMMITS_BACK:
                        return None
                at -= 1
                continue
            if restored_to < 0:
                return Restore(at, -1, ())
            removed = []
            for skipped in range(at - 1, max(restored_to, at - FIRST_READ_ENTRIES - 1), -1):
                found = self._entry(uri, skipped)
                if found is not None and found[1] is not None and found[1].get("app_id") in own:
                    removed.append(found[1])
            if removed:
                return Restore(at, restored_to, tuple(removed))
            at = restored_to
        return None

    def _entry(self, uri: str, version: int) -> tuple[int | None, dict[str, Any] | None] | None:
        """(the version a RESTORE restored to, else None; exactly's batch metadata, if
        any) of the entry at `version`; None when it is gone."""
        if version not in self.entries:
            raw = storage.read_bytes(entry_uri(uri, version))
            if raw is None:
                return None
            info = commit_info(raw)
            restored = _restored_to(info) if info.get("operation") == "RESTORE" else None
            meta = exactly_metadata(info)
            # a batch commit that changed no row (a MERGE with nothing to do records its
            # version alone) loses nothing when it is jumped over
            counts = meta is not None and "batch_id" in meta and _changes_rows(raw)
            self.entries[version] = (restored, meta if counts else None)
        return self.entries[version]


def _changes_rows(entry: bytes) -> bool:
    """Whether a log entry adds or removes a data file."""
    for line in entry.splitlines():
        action = json.loads(line)
        if "add" in action or "remove" in action:
            return True
    return False
