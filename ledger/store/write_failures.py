"""The one line for a ledger database that answered but could not write: its disk full,
its file on a read-only mount. Said as the tables' folders are (resources/failures/causes.py:
the cause first, then what to do), and not as "unreachable": waiting alone will not help.
"""

from __future__ import annotations

import re

#: What SQLite and PostgreSQL say when the ledger cannot write, and the line's cause and
#: advice for it (the words resources/failures/causes.py uses for the tables' folders).
_CANNOT_WRITE: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (
        re.compile(r"database or disk is full|No space left on device|Disk quota exceeded", re.I),
        "no space left on device",
        "free space there",
    ),
    (
        re.compile(r"attempt to write a readonly database|Read-only file system", re.I),
        "read-only file system",
        "make it writable",
    ),
)


def ledger_failure(safe_url: str, error: object, fallback: str = ":") -> str:
    """The line for a ledger database's OperationalError `error`: a disk that is full or
    read-only is named as such, with what to do (nothing is lost: a batch whose commit the
    ledger could not record is found in the tables' logs by the next start); anything else
    is the database's own words after `ledger database <url><fallback>`."""
    text = " ".join(str(error).split())
    for pattern, cause, advice in _CANNOT_WRITE:
        if pattern.search(text):
            return (
                f"{cause}: ledger database {safe_url} ({text}); {advice}, then run again "
                "(nothing is lost: the batch is taken up again)"
            )
    return f"ledger database {safe_url}{fallback} {error}"
