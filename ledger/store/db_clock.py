"""The ledger database's clock: the one clock every ledger timestamp and every age is read from.

Invariant 17 (docs/protocol.md): heartbeats, leases and "stuck for N minutes" compare two
instants written or read by different hosts (the run worker that stages a batch, the schedule
tick or recovery that judges it). Stamped with each host's own clock, a skew of minutes makes
a live attempt look dead or a dead one alive. Stamped and read with the database's clock, the
two instants come from one clock.

`db_now()` is an SQL expression, so a write stamps the row with the database's time in the
same statement:

* PostgreSQL: `statement_timestamp()`, the wall time at which the statement started. Not
  `now()`, which is the start of the *transaction* and would date a heartbeat written late in
  a long transaction too early.
* SQLite: `strftime('%Y-%m-%d %H:%M:%f', 'now')` (milliseconds; `CURRENT_TIMESTAMP` has only
  whole seconds), in the text form SQLAlchemy writes for a DateTime column (microseconds
  padded to six digits, UTC, no zone), so old and new rows read back alike. SQLite has no
  server: its clock is the clock of the host that opened the file, and in WAL mode (which the
  ledger uses) only processes of one host can share the file, so all of them read one clock.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement


class db_now(FunctionElement[Any]):
    """The database's current time, as a timezone-aware DateTime expression (lower case, as
    SQLAlchemy names its SQL functions)."""

    type = sa.DateTime(timezone=True)
    inherit_cache = True


@compiles(db_now)
def _default(_element: db_now, _compiler: Any, **_kw: Any) -> str:
    return "CURRENT_TIMESTAMP"


@compiles(db_now, "postgresql")
def _postgresql(_element: db_now, _compiler: Any, **_kw: Any) -> str:
    return "statement_timestamp()"


@compiles(db_now, "sqlite")
def _sqlite(_element: db_now, _compiler: Any, **_kw: Any) -> str:
    return "(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000')"
