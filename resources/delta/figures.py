"""What an operator sees of a Delta table (DeltaTarget.stats and .layout): plain values, apart
from resources/delta/table.py, which is about the table's snapshot and its commits."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TableStats:
    """What an operator sees of a table: its version, its rows, and an application's last batch."""

    version: int
    row_count: int
    #: the last batch id the application committed, or None if it never committed
    app_version: int | None


@dataclass(frozen=True)
class TableLayout:
    """How a table is stored now: the data files its snapshot reads, and their bytes."""

    files: int
    bytes: int
