"""What an operator sees of a Delta table (DeltaTarget.stats and .layout): plain values and
the two reads of a snapshot that make them, apart from resources/delta/table.py, which is
about the table's snapshot and its commits."""

from __future__ import annotations

from dataclasses import dataclass

from deltalake import DeltaTable


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


def stats_of(table: DeltaTable, app_id: str) -> TableStats:
    """`table`'s version, its rows (by its files' statistics) and `app_id`'s last batch."""
    actions = table.get_add_actions(flatten=True)
    return TableStats(
        version=table.version(),
        row_count=int(sum(actions.column("num_records").to_pylist() or [0])),
        app_version=table.transaction_version(app_id),
    )


def layout_of(table: DeltaTable) -> TableLayout:
    """`table`'s data files and their bytes, as its snapshot reads them."""
    sizes = table.get_add_actions(flatten=True).column("size_bytes").to_pylist()
    return TableLayout(files=len(sizes), bytes=int(sum(sizes)))
