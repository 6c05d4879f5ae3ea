"""One thread's Delta table kept open between loads (resources/delta/table.py
`DeltaTarget.load`), with what vouches that it is still the table on storage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deltalake import DeltaTable


@dataclass
class Kept:
    """One thread's table kept open between loads, and what vouches for it (DeltaTarget.load)."""

    table: DeltaTable
    #: the version whose log entry was fingerprinted: the table's version when a load last
    #: returned it, or older (a commit through the table moves the table on, not this)
    version: int
    #: storage.fingerprint of that version's log entry, taken after the table read it
    fingerprint: tuple[Any, ...]
    #: the version the table was loaded afresh at: its snapshot replays the log from the
    #: last checkpoint before it, however many commits it was updated by since
    loaded_at: int


@dataclass
class Answers:
    """The app transaction versions one thread read from one table object at one version.

    delta-rs scans the snapshot's app transactions on every `transaction_version` (about
    1 ms, 2 for an app id it does not hold), and a derived pipeline's publish asks 15 to 20
    times per batch, mostly the same questions of the same versions (per output and app id:
    jobs/derived/rebuild.py `behind_reason`). A snapshot never changes, so its answers are
    kept with the very object and version they came from; any other table object (a fresh
    load after a re-created table, a failed commit, a checkpoint) or version starts afresh.
    The object itself is held, so no other table can take its id meanwhile.
    """

    table: DeltaTable
    version: int
    found: dict[str, int | None] = field(default_factory=dict)

    @classmethod
    def of(cls, kept: Answers | None, table: DeltaTable) -> Answers:
        """`kept` if it holds `table`'s answers at its version, else a new, empty one."""
        version = table.version()
        if kept is not None and kept.table is table and kept.version == version:
            return kept
        return cls(table, version)

    def transaction_version(self, app_id: str) -> int | None:
        if app_id not in self.found:
            self.found[app_id] = self.table.transaction_version(app_id)
        return self.found[app_id]
