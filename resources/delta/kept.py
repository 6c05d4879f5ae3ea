"""One thread's Delta table kept open between loads (resources/delta/table.py
`DeltaTarget.load`), with what vouches that it is still the table on storage."""

from __future__ import annotations

from dataclasses import dataclass
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
