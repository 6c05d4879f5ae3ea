"""The one line for a ledger database that answered but could not write: its disk full,
its file on a read-only mount. Said as the tables' folders are (resources/failures/causes.py:
the cause first, then what to do), and not as "unreachable": waiting alone will not help.
"""

from __future__ import annotations

import re
from pathlib import Path

from sqlalchemy.engine import URL

from ledger.host.folders import NO_SPACE, NOT_WRITABLE, READ_ONLY, folder_problem

#: What the line asks of the operator, by the cause.
_ADVICE = {
    NO_SPACE: "free space there",
    READ_ONLY: "make it writable",
    NOT_WRITABLE: "give this user access there",
}
#: What SQLite and PostgreSQL say when the ledger cannot write, and the cause it is.
_CANNOT_WRITE: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"database or disk is full|No space left on device|Disk quota exceeded", re.I),
     NO_SPACE),
    (re.compile(r"attempt to write a readonly database|Read-only file system", re.I), READ_ONLY),
)  # fmt: skip
#: SQLite's words when it cannot open its file, whatever the reason: a missing folder, a
#: read-only one (a WAL ledger writes beside its file to open it), one this user cannot write
_CANNOT_OPEN = re.compile(r"unable to open database file", re.I)


def sqlite_file(url: URL) -> Path | None:
    """The file of a SQLite ledger's URL; None for any other database (or a URI form)."""
    database = url.database or ""
    if not url.drivername.startswith("sqlite") or not database or database.startswith("file:"):
        return None
    return None if database == ":memory:" else Path(database)


def _folder_cause(file: Path) -> str | None:
    """Why SQLite cannot open `file`, from its folder (ledger/host/folders.py); None when
    the folder is missing or shows no cause (SQLite's words then stand)."""
    return folder_problem(file.parent) if file.parent.is_dir() else None


def ledger_failure(
    safe_url: str, error: object, fallback: str = ":", file: Path | None = None
) -> str:
    """The line for a ledger database's OperationalError `error`: a disk that is full or
    read-only is named as such, with what to do (nothing is lost: a batch whose commit the
    ledger could not record is found in the tables' logs by the next start); so is a SQLite
    `file` its folder does not let SQLite open. Anything else is the database's own words
    after `ledger database <url><fallback>`."""
    text = " ".join(str(error).split())
    cause = next((c for p, c in _CANNOT_WRITE if p.search(text)), None)
    if cause is None and file is not None and _CANNOT_OPEN.search(text):
        cause = _folder_cause(file)
    if cause is not None:
        return (
            f"{cause}: ledger database {safe_url} ({text}); {_ADVICE[cause]}, then run again "
            "(nothing is lost: the batch is taken up again)"
        )
    return f"ledger database {safe_url}{fallback} {error}"
