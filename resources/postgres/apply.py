"""Applying a batch's partial aggregate to a PostgreSQL output, exactly once, by batch id.

The rows and the state row (resources/postgres/state.py) change in ONE SQL transaction. Its
first statements lock the state row; the stored id then decides (`decide`): applied already
(nothing changes, `applied=False`), out of order (rolled back and raised), or the partial is
upserted (counts and sums add, min and max combine), the state advances to the batch id, and
the transaction COMMITs.

The row lock serialises two committers of one batch: the second waits, then reads the
first's id and skips. A connection lost before COMMIT answers leaves the outcome unknown;
the next try decides it by reading the state row, which lands in the same transaction as
the rows, and by the row's token tells whether its own earlier try was the one that landed.
Transactions run in READ COMMITTED (resources/postgres/connection.py) so that the statement
after the lock sees the row as the committer that held the lock left it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, OperationalError

from ledger.coordinator.crash import crashpoint
from ledger.core.errors import InconsistencyError, UnreachableError
from resources.config.derived_spec import PostgresOutput
from resources.delta.commit import MAX_UNKNOWN_OUTCOMES
from resources.delta.log import METADATA_KEY
from resources.postgres.connection import _where
from resources.postgres.state import Decision, _advance, _ensure_row, _read_state, decide
from resources.postgres.tables import _quote, _table, ensure_tables

#: The crash points of this module (ledger/coordinator/crash.py POINTS, in the crash matrix of
#: tests/test_crash.py): the transaction's end, before and after its COMMIT.
CRASH_POINTS = ("postgres_before_commit", "postgres_after_commit")

#: A hook the tests run at a named moment of the transaction, on its connection.
Hook = Callable[[Connection], None]


@dataclass(frozen=True)
class PostgresOutcome:
    """What one apply did, as resources/delta/merge.py's MergeOutcome says it for a Delta output.

    `applied` is True when this call's transaction (one of its tries) applied the batch,
    False when the output held it already. `held_batch_id` is the state's batch id after the
    call (a PostgreSQL table has no version; the batch id is what the ledger can compare).
    """

    applied: bool
    held_batch_id: int
    tries: int
    seconds: float
    #: rows upserted by the transaction that applied the batch; empty when none did
    metrics: Mapping[str, Any] = field(default_factory=dict)
    #: tries whose outcome was unknown (the connection lost before COMMIT answered)
    unknown_outcomes: int = 0


def _combined(fn: str, column: str) -> str:
    """How a measure of the table and of the batch combine; a null (a sum, min or max over
    nulls only) is no contribution: LEAST/GREATEST ignore nulls, and the COALESCE keeps the
    one side of a sum that is not null."""
    t, s = f"t.{_quote(column)}", f"excluded.{_quote(column)}"
    if fn == "count":
        return f"{t} + {s}"
    if fn == "sum":
        return f"COALESCE({t} + {s}, {t}, {s})"
    return f"{'LEAST' if fn == 'min' else 'GREATEST'}({t}, {s})"


def upsert_sql(spec: PostgresOutput, columns: list[str]) -> str:
    """One row of the partial into the table: a new group is inserted, a known one (null
    keys included, by the NULLS NOT DISTINCT index) combined."""
    keys = ", ".join(_quote(k) for k in spec.key_columns)
    updates = ", ".join(f"{_quote(m.name)} = {_combined(m.fn, m.name)}" for m in spec.measures)
    values = ", ".join(f":p{i}" for i in range(len(columns)))
    return (
        f"INSERT INTO {_table(spec)} AS t ({', '.join(_quote(c) for c in columns)}) "
        f"VALUES ({values}) ON CONFLICT ({keys}) DO UPDATE SET {updates}"
    )


def upsert_parameters(partial: pa.Table) -> list[dict[str, Any]]:
    """The partial's rows as `upsert_sql`'s parameters, one dict per row."""
    columns = partial.column_names
    return [{f"p{i}": row[c] for i, c in enumerate(columns)} for row in partial.to_pylist()]


@dataclass(frozen=True)
class _Change:
    """What every try of one apply writes: the partial's rows by the upsert, the batch id
    with the batch's commit info on the state row, and the token that tells this call's
    landed try from another committer's."""

    app_id: str
    batch_id: int
    previous_batch_id: int | None
    #: how errors name the output and the batch
    where: str
    statement: sa.TextClause
    rows: list[dict[str, Any]]
    info: str
    token: str


def _prepare(
    spec: PostgresOutput,
    app_id: str,
    batch_id: int,
    previous_batch_id: int | None,
    partial: pa.Table,
    metadata: Mapping[str, Any] | None,
    where: str,
) -> _Change:
    """The change every try of one apply writes, with a token fresh for this call."""
    columns = partial.column_names
    rows = upsert_parameters(partial)
    info = {METADATA_KEY: {**(metadata or {}), "app_id": app_id, "batch_id": batch_id}}
    return _Change(
        app_id=app_id,
        batch_id=batch_id,
        previous_batch_id=previous_batch_id,
        where=f"{where}, batch {app_id}/{batch_id}",
        statement=sa.text(upsert_sql(spec, columns)),
        rows=rows,
        info=json.dumps(info, default=str),
        token=uuid.uuid4().hex,  # tells this call's landed try from another committer's
    )


def _commit(conn: Connection) -> None:
    """COMMIT; its own function so a test can lose the answer after the commit landed."""
    conn.commit()


def _transaction(
    conn: Connection,
    spec: PostgresOutput,
    change: _Change,
    before_lock: Hook | None,
    before_commit: Hook | None,
) -> tuple[int | None, str | None] | None:
    """One try's transaction: lock the state row and decide; when the output holds the batch
    already, roll back and return the row's batch id and token, else upsert the rows,
    advance the row and COMMIT (None)."""
    if before_lock is not None:
        before_lock(conn)
    _ensure_row(conn, spec, change.app_id)
    stored, stored_token = _read_state(conn, spec, change.app_id, lock=True)
    decision = decide(stored, change.previous_batch_id, change.batch_id, where=change.where)
    if decision is Decision.ALREADY_APPLIED:
        conn.rollback()
        return stored, stored_token
    if change.rows:
        conn.execute(change.statement, change.rows)
    _advance(conn, spec, change.app_id, change.batch_id, change.token, change.info)
    if before_commit is not None:
        before_commit(conn)
    crashpoint("postgres_before_commit")
    _commit(conn)
    return None


def apply_partial(
    engine: Engine,
    spec: PostgresOutput,
    app_id: str,
    batch_id: int,
    previous_batch_id: int | None,
    partial: pa.Table,
    metadata: Mapping[str, Any] | None = None,
    *,
    before_lock: Hook | None = None,
    before_commit: Hook | None = None,
    retry_seconds: float = 0.2,
) -> PostgresOutcome:
    """Apply the batch's partial aggregate and advance the output's batch id, in one
    transaction, at most once (module docstring). An empty partial still advances the id.

    `previous_batch_id` is the ledger's last COMMITTED batch of `app_id` before this one
    (None: this is its first). `metadata` is the batch's commit info (invariant 7), kept on
    the state row with the app id and batch id. `before_lock` and `before_commit` are test
    hooks (racing committers, a backend killed at COMMIT).
    """
    where = _where(engine, spec)
    batch = f"batch {app_id}/{batch_id}"
    started = time.perf_counter()
    ensure_tables(engine, spec, partial.schema)
    change = _prepare(spec, app_id, batch_id, previous_batch_id, partial, metadata, where)
    unknown = 0
    tries = 0
    while True:
        tries += 1
        try:
            with engine.connect() as conn:
                held = _transaction(conn, spec, change, before_lock, before_commit)
                if held is not None:
                    stored, stored_token = held
                    # an earlier try of this call whose COMMIT answer was lost landed
                    mine = stored == batch_id and stored_token == change.token
                    return PostgresOutcome(
                        applied=mine,
                        held_batch_id=batch_id if stored is None else stored,
                        tries=tries,
                        seconds=time.perf_counter() - started,
                        metrics={"rows_upserted": len(change.rows)} if mine else {},
                        unknown_outcomes=unknown,
                    )
            crashpoint("postgres_after_commit")
            return PostgresOutcome(
                applied=True,
                held_batch_id=batch_id,
                tries=tries,
                seconds=time.perf_counter() - started,
                metrics={"rows_upserted": len(change.rows)},
                unknown_outcomes=unknown,
            )
        except OperationalError as exc:
            # the connection was lost (or the transaction killed) somewhere before COMMIT
            # answered: whether it landed is unknown; the next try's read decides
            unknown += 1
            if unknown > MAX_UNKNOWN_OUTCOMES:
                raise UnreachableError(
                    f"{where}: {batch}: {unknown} tries in a row lost their connection; "
                    f"last: {str(exc.orig).strip().splitlines()[0]}"
                ) from exc
            time.sleep(retry_seconds * unknown)
        except DBAPIError as exc:
            raise InconsistencyError(
                f"{where}: {batch} was not applied: {str(exc.orig).strip().splitlines()[0]}"
            ) from exc
