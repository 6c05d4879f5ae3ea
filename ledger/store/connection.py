"""The store's hold on its database: the engine, the schema made current when it opens, and
the two ways in, a read connection and a write transaction.

A base of its own so that each concern of the store (ledger/store/planning.py, fencing.py,
decisions.py, rebuild.py) is a class on it, and `LedgerStore` (ledger/store/ledger_store.py)
the union of them. A database that does not answer is an UnreachableError naming it (never
its password), whichever read or write found out; one that answers but cannot write (its
disk full, its file on a read-only mount) is said as the tables' folders are
(resources/failures/causes.py): the cause first, then what to do.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.engine import Connection
from sqlalchemy.exc import OperationalError

from ledger.core.errors import UnreachableError
from ledger.store.schema import create_ledger_engine, ensure_schema
from ledger.store.write_failures import ledger_failure, sqlite_file


class LedgerConnection:
    """One ledger database, its schema made current on opening."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = create_ledger_engine(url)
        ensure_schema(self.engine)

    @property
    def safe_url(self) -> str:
        """The URL without its password: safe for logs and the UI."""
        return self.engine.url.render_as_string(hide_password=True)

    @contextmanager
    def _reachable(self) -> Iterator[None]:
        """A database that does not answer ends the command with one line naming it (never
        its password), whichever read or write found out."""
        try:
            yield
        except OperationalError as exc:
            where = sqlite_file(self.engine.url)
            raise UnreachableError(ledger_failure(self.safe_url, exc.orig, file=where)) from exc

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self._reachable(), self.engine.connect() as conn:
            yield conn

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        with self._reachable(), self.engine.begin() as conn:
            yield conn

    def dispose(self) -> None:
        self.engine.dispose()
