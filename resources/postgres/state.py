"""The compare-and-set state row of a PostgreSQL output: the batch id beside the data.

The Delta outputs are idempotent by their app transaction (resources/delta/merge.py,
invariant 2); a database has no such log, so the batch id is kept beside the data instead,
in `exactly_output_state` (one row per output table and app id), changed in the same SQL
transaction as the rows (resources/postgres/apply.py). The stored id then decides (`decide`,
pure):

- stored >= batch: the batch is applied already (a re-drive, a racing committer): nothing
  changes;
- stored != the ledger's previous committed batch id of the app id: out of order, a
  protocol violation (invariant 5: one batch in flight per app id, committed in order):
  rolled back and raised loudly, never skipped;
- otherwise the partial is applied and the state advances to the batch id.

"Previous committed", not "stored + 1": ABORTED batches leave gaps in the ids. Besides the
id, the row keeps the token of the try that wrote it (so a try whose COMMIT answer was lost
can tell its own landing from another committer's) and the batch's commit info
(invariant 7), which recovery and the checks read back.
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, OperationalError

from ledger.core.errors import InconsistencyError, UnreachableError
from resources.config.derived_spec import PostgresOutput
from resources.delta.log import METADATA_KEY
from resources.postgres.connection import _one_line, _where
from resources.postgres.tables import _state


class Decision(Enum):
    APPLY = "apply"
    ALREADY_APPLIED = "already_applied"


def decide(stored: int | None, previous: int | None, batch_id: int, *, where: str) -> Decision:
    """The compare-and-set on the batch id (module docstring), pure.

    Protects invariant 2 (a batch at or below the stored id changes nothing) and invariant 5
    (batches of one app id are committed one at a time, in order: a batch whose predecessor
    the output does not hold is refused, loudly, never skipped).
    """
    if previous is not None and previous >= batch_id:
        raise InconsistencyError(
            f"{where}: previous committed batch {previous} is not below requested batch "
            f"{batch_id} (invariant 5: batch ids of an app id increase)"
        )
    if stored is not None and stored >= batch_id:
        return Decision.ALREADY_APPLIED
    if stored != previous:
        raise InconsistencyError(
            f"{where}: out of order: the output holds batch {_id(stored)}, the ledger's "
            f"previous committed batch is {_id(previous)}, requested batch {batch_id} "
            "(invariant 5: committed one at a time, in order); nothing was applied"
        )
    return Decision.APPLY


def _id(batch_id: int | None) -> str:
    return "none" if batch_id is None else str(batch_id)


def _ensure_row(conn: Connection, spec: PostgresOutput, app_id: str) -> None:
    """The app id's state row, inserted empty if it is not there yet, so that there is a
    row for `_read_state(lock=True)` to lock even before the app id's first batch."""
    conn.execute(
        sa.text(
            f"INSERT INTO {_state(spec)} (output, app_id) VALUES (:o, :a) ON CONFLICT DO NOTHING"
        ),
        {"o": spec.table, "a": app_id},
    )


def _read_state(
    conn: Connection, spec: PostgresOutput, app_id: str, lock: bool = False
) -> tuple[int | None, str | None]:
    row = conn.execute(
        sa.text(
            f"SELECT batch_id, token FROM {_state(spec)} WHERE output = :o AND app_id = :a"
            + (" FOR UPDATE" if lock else "")
        ),
        {"o": spec.table, "a": app_id},
    ).one_or_none()
    return (None, None) if row is None else (row.batch_id, row.token)


def _advance(
    conn: Connection, spec: PostgresOutput, app_id: str, batch_id: int, token: str, info: str
) -> None:
    """Set the state row to `batch_id`, with the try's token and the batch's commit info
    (JSON), in the transaction that applies the batch."""
    conn.execute(
        sa.text(
            f"UPDATE {_state(spec)} SET batch_id = :b, token = :t, "
            "metadata = CAST(:m AS jsonb), updated_at = now() "
            "WHERE output = :o AND app_id = :a"
        ),
        {"b": batch_id, "t": token, "m": info, "o": spec.table, "a": app_id},
    )


def _undefined_table(exc: DBAPIError) -> bool:
    """Whether PostgreSQL said the table is not there. psycopg is imported here, not at the
    top: every `exactly` process imports this module, and a pipeline without PostgreSQL
    outputs would pay for the driver's import (a quarter of a second) in each one."""
    from psycopg.errors import UndefinedTable

    return isinstance(exc.orig, UndefinedTable)


def held_batch(engine: Engine, spec: PostgresOutput, app_id: str) -> int | None:
    """The last batch id of `app_id` the output holds (None: none yet), for recovery: an
    output at or past a batch id holds that batch, as a Delta output whose app-transaction
    version is (invariant 12)."""
    try:
        with engine.connect() as conn:
            return _read_state(conn, spec, app_id)[0]
    except OperationalError as exc:
        raise UnreachableError(f"{_where(engine, spec)}: {exc.orig}") from exc
    except DBAPIError as exc:
        if _undefined_table(exc):
            return None  # no batch was ever applied: the state table is not there yet
        raise


def held_state(
    engine: Engine, spec: PostgresOutput, app_id: str
) -> tuple[int | None, dict[str, Any] | None]:
    """The last batch id of `app_id` the output holds and the commit info it was applied
    with (the batch's ranges, invariant 7), or (None, None) before its first batch."""
    try:
        with engine.connect() as conn:
            row = conn.execute(
                sa.text(
                    f"SELECT batch_id, metadata FROM {_state(spec)} "
                    "WHERE output = :o AND app_id = :a"
                ),
                {"o": spec.table, "a": app_id},
            ).one_or_none()
    except OperationalError as exc:
        raise UnreachableError(f"{_where(engine, spec)}: {_one_line(exc)}") from exc
    except DBAPIError as exc:
        if _undefined_table(exc):
            return None, None
        raise
    if row is None or row.batch_id is None:
        return None, None
    meta = row.metadata if isinstance(row.metadata, dict) else json.loads(row.metadata or "{}")
    return row.batch_id, meta.get(METADATA_KEY)
