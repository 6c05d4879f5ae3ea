"""The one line for a ledger database that answers but cannot write (a full disk, a
read-only mount): the cause first, the database named without its password, what to do.
The real full disk under a SQLite ledger is tests/test_failure_lines.py's."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from ledger.core.errors import UnreachableError
from ledger.store.connection import LedgerConnection
from ledger.store.write_failures import ledger_failure

URL = "postgresql+psycopg://exactly:***@db:5432/ledger"
AGAIN = "then run again (nothing is lost: the batch is taken up again)"


@pytest.mark.parametrize(
    ("said", "cause", "advice"),
    [
        ("database or disk is full", "no space left on device", "free space there"),
        (
            'could not extend file "base/16384/16385": No space left on device\n'
            "HINT:  Check free disk space.",
            "no space left on device",
            "free space there",
        ),
        ("attempt to write a readonly database", "read-only file system", "make it writable"),
        ("could not open file: Read-only file system", "read-only file system", "make it writable"),
    ],
)
def test_a_ledger_that_cannot_write_is_named_with_its_cause_and_what_to_do(
    said: str, cause: str, advice: str
) -> None:
    line = ledger_failure(URL, said)
    assert line.startswith(f"{cause}: ledger database {URL} ("), line
    assert line.endswith(f"; {advice}, {AGAIN}"), line
    assert "\n" not in line


def test_any_other_error_keeps_the_database_s_own_words() -> None:
    said = "connection refused\n\tIs the server running on host db?"
    assert ledger_failure(URL, said) == f"ledger database {URL}: {said}"
    assert ledger_failure(URL, said, " is unreachable:") == (
        f"ledger database {URL} is unreachable: {said}"
    )


def test_a_read_only_sqlite_ledger_is_said_so_by_the_store(tmp_path: Path) -> None:
    """A real SQLite ledger opened read-only by SQLite itself (the file's folder cannot be
    remounted here without root; the error is SQLite's own)."""
    path = tmp_path / "ledger.db"
    LedgerConnection(f"sqlite:///{path}").dispose()  # the schema, written once
    store = LedgerConnection(f"sqlite:///file:{path}?mode=ro&uri=true")
    try:
        with pytest.raises(UnreachableError) as raised, store._tx() as conn:
            conn.exec_driver_sql("CREATE TABLE written (n INTEGER)")
    finally:
        store.dispose()
    assert str(raised.value).startswith("read-only file system: ledger database sqlite:///")
    assert str(raised.value).endswith(f"; make it writable, {AGAIN}")
    assert isinstance(raised.value.__cause__, OperationalError)
    assert isinstance(raised.value.__cause__.orig, sqlite3.OperationalError)


def test_sqlite_s_unable_to_open_keeps_its_words_where_the_folder_is_not_the_cause(
    tmp_path: Path,
) -> None:
    """A missing folder (the disk the ledger was on is gone) or a writable one with room:
    SQLite's own words stand (a read-only mount's is tests/test_failure_lines.py's)."""
    said = "unable to open database file"
    for file in (tmp_path / "gone" / "ledger.db", tmp_path / "ledger.db"):
        assert ledger_failure(URL, said, file=file) == f"ledger database {URL}: {said}"
