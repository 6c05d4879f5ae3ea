"""Applying a batch's partial aggregate to a PostgreSQL table, exactly once, by batch id.

The Delta outputs are idempotent by their app transaction (resources/delta/merge.py, invariant 2);
a database has no such log, so the batch id is kept beside the data instead, in
`exactly_output_state` (one row per output table and app id), and the two change in ONE SQL
transaction. Its first statement locks the state row; the stored id then decides
(`decide`, pure):

- stored >= batch: the batch is applied already (a re-drive, a racing committer): nothing
  changes, `applied=False`;
- stored != the ledger's previous committed batch id of the app id: out of order, a
  protocol violation (invariant 5: one batch in flight per app id, committed in order):
  rolled back and raised loudly, never skipped;
- otherwise the partial is upserted (counts and sums add, min and max combine) and the
  state advances to the batch id; COMMIT.

"Previous committed", not "stored + 1": ABORTED batches leave gaps in the ids. The row lock
serialises two committers of one batch: the second waits, then reads the first's id and
skips. A connection lost before COMMIT answers leaves the outcome unknown; the next try
decides it by reading the state row, which lands in the same transaction as the rows, and
by the row's token tells whether its own earlier try was the one that landed.

Transactions run in READ COMMITTED on purpose: the statement after the lock must see the
row as the committer that held the lock left it (REPEATABLE READ would fail it instead).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import psycopg
import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, OperationalError

from ledger.coordinator.crash import crashpoint
from ledger.core.errors import (
    AuthenticationError,
    ConfigError,
    InconsistencyError,
    RefusedBatchError,
    UnreachableError,
)
from resources.config.derived_spec import PostgresOutput
from resources.config.pipeline_config import resolve_options
from resources.delta.commit import MAX_UNKNOWN_OUTCOMES
from resources.delta.log import METADATA_KEY

STATE_TABLE = "exactly_output_state"
#: NULLS NOT DISTINCT unique indexes (a null group key is one group, as in the Delta
#: output's null-safe MERGE) exist from PostgreSQL 15 on.
MIN_SERVER_VERSION = 150000
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


def check_server_version(version_num: int, where: str) -> None:
    """Refuse a server that cannot keep null group keys as one group (NULLS NOT DISTINCT
    needs 15): on 14 every batch would insert another row for a null key, silently."""
    if version_num < MIN_SERVER_VERSION:
        major, minor = version_num // 10000, version_num % 10000
        raise ConfigError(
            f"{where}: PostgreSQL {major}.{minor} is older than 15, which unique indexes "
            "with NULLS NOT DISTINCT need (a null group key must stay one group)"
        )


# -- connecting ---------------------------------------------------------------------------


def create_output_engine(spec: PostgresOutput, env: Mapping[str, str] = os.environ) -> Engine:
    """An engine for the output's URL, its `{env: NAME}` resolved now
    (resources/config/pipeline_config.py
    `resolve_options`), with psycopg (the driver the ledger uses) for a bare `postgresql`."""
    url = resolve_options({"url": spec.url}, f"derived.{spec.name}", env)["url"]
    try:
        parsed = sa.engine.make_url(url)
    except Exception:
        # the value came from the environment and may hold a password: never echo it
        raise ConfigError(f"derived.{spec.name}.url is not a database URL") from None
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() != "postgresql":
        raise ConfigError(f"derived.{spec.name}.url: {parsed.drivername} is not PostgreSQL")
    return sa.create_engine(
        parsed,
        pool_pre_ping=True,
        isolation_level="READ COMMITTED",
        connect_args={"connect_timeout": 10},
    )


def _where(engine: Engine, spec: PostgresOutput) -> str:
    """How errors name the output: its name, table and database, never a password."""
    return (
        f"postgres output {spec.name} ({spec.table} at "
        f"{engine.url.render_as_string(hide_password=True)})"
    )


# -- SQL ----------------------------------------------------------------------------------


def _quote(name: str) -> str:
    """An identifier as written (spec.py allows only letters, digits and '_'): quoted, so
    PostgreSQL keeps its case as Delta and Spark do."""
    return '"' + name + '"'


def _table(spec: PostgresOutput) -> str:
    return ".".join(_quote(part) for part in spec.table.split("."))


def _state(spec: PostgresOutput) -> str:
    """The state table, in the output table's schema: one database, one transaction, and
    the same grants."""
    schema = spec.table.split(".")[0] + "." if "." in spec.table else ""
    return ".".join(_quote(p) for p in f"{schema}{STATE_TABLE}".split("."))


def _pg_type(kind: pa.DataType, column: str, where: str) -> str:
    """The PostgreSQL type of a partial's column, spelled as `format_type` spells it, so an
    existing table's columns can be compared by equality."""
    simple = {
        pa.int8(): "smallint",
        pa.int16(): "smallint",
        pa.int32(): "integer",
        pa.int64(): "bigint",
        pa.float32(): "real",
        pa.float64(): "double precision",
        pa.bool_(): "boolean",
        pa.string(): "text",
        pa.large_string(): "text",
        pa.binary(): "bytea",
        pa.large_binary(): "bytea",
        pa.date32(): "date",
    }
    if kind in simple:
        return simple[kind]
    if pa.types.is_timestamp(kind):
        tz = kind.tz is not None  # type: ignore[attr-defined]
        return f"timestamp {'with' if tz else 'without'} time zone"
    if pa.types.is_decimal(kind):
        return f"numeric({kind.precision},{kind.scale})"  # type: ignore[attr-defined]
    raise RefusedBatchError(
        f"{where}: column {column} has type {kind}, which no PostgreSQL column type is "
        "chosen for (invariant 14)"
    )


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


# -- tables -------------------------------------------------------------------------------


def ensure_tables(engine: Engine, spec: PostgresOutput, schema: pa.Schema | None = None) -> None:
    """Create the state table and, given the partial's schema, the output table with its
    unique index on the group keys; refuse a server older than 15 and an existing table
    whose columns do not fit the partial (invariant 14: an incompatible schema fails loudly
    before anything is written).

    Column types come from the partial (Spark's sum of an int is a bigint, etc.), which is
    why the table is created at the first batch rather than from the spec alone. Serialised
    between processes by an advisory lock, as the ledger's schema set-up is.
    """
    where = _where(engine, spec)
    try:
        with engine.begin() as conn:
            check_server_version(
                int(conn.execute(sa.text("SHOW server_version_num")).scalar_one()), where
            )
            # one key for every output: they share the state table's creation
            conn.execute(
                sa.text("SELECT pg_advisory_xact_lock(hashtextextended('exactly.derived.pg', 0))")
            )
            conn.execute(
                sa.text(
                    f"CREATE TABLE IF NOT EXISTS {_state(spec)} ("
                    "output text NOT NULL, app_id text NOT NULL, batch_id bigint, "
                    "token text, metadata jsonb, updated_at timestamptz NOT NULL DEFAULT now(), "
                    "PRIMARY KEY (output, app_id))"
                )
            )
            if schema is not None:
                _ensure_output_table(conn, spec, schema, where)
    except OperationalError as exc:
        raise UnreachableError(f"{where}: {exc.orig}") from exc


def _expected_columns(spec: PostgresOutput, schema: pa.Schema, where: str) -> dict[str, str]:
    """The output table's columns (name -> type) for this partial; a partial whose columns
    are not the spec's keys and measures is refused, naming them."""
    wanted = [*spec.key_columns, *(m.name for m in spec.measures)]
    missing = [c for c in wanted if c not in schema.names]
    extra = [c for c in schema.names if c not in wanted]
    if missing or extra:
        raise InconsistencyError(
            f"{where}: the partial's columns do not match the spec: missing "
            f"{missing or 'none'}, unexpected {extra or 'none'}"
        )
    return {c: _pg_type(schema.field(c).type, c, where) for c in wanted}


def _ensure_output_table(
    conn: Connection, spec: PostgresOutput, schema: pa.Schema, where: str
) -> None:
    columns = _expected_columns(spec, schema, where)
    counts = {m.name for m in spec.measures if m.fn == "count"}
    definitions = ", ".join(
        f"{_quote(c)} {t}{' NOT NULL' if c in counts else ''}" for c, t in columns.items()
    )
    conn.execute(sa.text(f"CREATE TABLE IF NOT EXISTS {_table(spec)} ({definitions})"))
    have = {
        r.attname: r.type
        for r in conn.execute(
            sa.text(
                "SELECT attname, format_type(atttypid, atttypmod) AS type FROM pg_attribute "
                "WHERE attrelid = CAST(:t AS regclass) AND attnum > 0 AND NOT attisdropped"
            ),
            {"t": _table(spec)},
        )
    }
    for column, kind in columns.items():
        if column not in have:
            raise RefusedBatchError(
                f"{where}: the table has no column {column} for the partial's {kind} "
                "(invariant 14; a PostgreSQL output's schema cannot grow yet)"
            )
        if have[column] != kind:
            raise RefusedBatchError(
                f"{where}: column {column} is {have[column]} in the table, {kind} in the "
                "partial (invariant 14)"
            )
    index = _quote(f"{spec.table.split('.')[-1][:40]}_exactly_keys")
    keys = ", ".join(_quote(k) for k in spec.key_columns)
    conn.execute(
        sa.text(
            f"CREATE UNIQUE INDEX IF NOT EXISTS {index} ON {_table(spec)} ({keys}) "
            "NULLS NOT DISTINCT"
        )
    )


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
        if isinstance(exc.orig, psycopg.errors.UndefinedTable):
            return None  # no batch was ever applied: the state table is not there yet
        raise


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


# -- the commit ---------------------------------------------------------------------------


def _commit(conn: Connection) -> None:
    """COMMIT; its own function so a test can lose the answer after the commit landed."""
    conn.commit()


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
    columns = partial.column_names
    statement = sa.text(upsert_sql(spec, columns))
    rows = [{f"p{i}": row[c] for i, c in enumerate(columns)} for row in partial.to_pylist()]
    info = json.dumps(
        {METADATA_KEY: {**(metadata or {}), "app_id": app_id, "batch_id": batch_id}},
        default=str,
    )
    token = uuid.uuid4().hex  # tells this call's landed try from another committer's
    unknown = 0
    tries = 0
    while True:
        tries += 1
        try:
            with engine.connect() as conn:
                if before_lock is not None:
                    before_lock(conn)
                conn.execute(
                    sa.text(
                        f"INSERT INTO {_state(spec)} (output, app_id) VALUES (:o, :a) "
                        "ON CONFLICT DO NOTHING"
                    ),
                    {"o": spec.table, "a": app_id},
                )
                stored, stored_token = _read_state(conn, spec, app_id, lock=True)
                decision = decide(stored, previous_batch_id, batch_id, where=f"{where}, {batch}")
                if decision is Decision.ALREADY_APPLIED:
                    conn.rollback()
                    # an earlier try of this call whose COMMIT answer was lost landed
                    mine = stored == batch_id and stored_token == token
                    return PostgresOutcome(
                        applied=mine,
                        held_batch_id=batch_id if stored is None else stored,
                        tries=tries,
                        seconds=time.perf_counter() - started,
                        metrics={"rows_upserted": len(rows)} if mine else {},
                        unknown_outcomes=unknown,
                    )
                if rows:
                    conn.execute(statement, rows)
                conn.execute(
                    sa.text(
                        f"UPDATE {_state(spec)} SET batch_id = :b, token = :t, "
                        "metadata = CAST(:m AS jsonb), updated_at = now() "
                        "WHERE output = :o AND app_id = :a"
                    ),
                    {"b": batch_id, "t": token, "m": info, "o": spec.table, "a": app_id},
                )
                if before_commit is not None:
                    before_commit(conn)
                crashpoint("postgres_before_commit")
                _commit(conn)
            crashpoint("postgres_after_commit")
            return PostgresOutcome(
                applied=True,
                held_batch_id=batch_id,
                tries=tries,
                seconds=time.perf_counter() - started,
                metrics={"rows_upserted": len(rows)},
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


# -- in the pipeline ----------------------------------------------------------------------


def _one_line(exc: OperationalError) -> str:
    """psycopg's connection error as one line (it spans several: host, then FATAL)."""
    return " ".join(line.strip() for line in str(exc.orig).splitlines() if line.strip())


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
        if isinstance(exc.orig, psycopg.errors.UndefinedTable):
            return None, None
        raise
    if row is None or row.batch_id is None:
        return None, None
    meta = row.metadata if isinstance(row.metadata, dict) else json.loads(row.metadata or "{}")
    return row.batch_id, meta.get(METADATA_KEY)


class PostgresTarget:
    """A PostgreSQL output as the publisher holds it (jobs/publish/delta_publisher.py): the spec,
    its engine, and `root`, the folder its staged partials are relative to (the raw
    table's: a database has no folder of its own; jobs/stage/spark_stager.py stages them under
    `<root>/staged/<the output's app id>/`)."""

    def __init__(self, spec: PostgresOutput, root: str, env: Mapping[str, str] = os.environ):
        self.spec = spec
        self.root = root
        self.engine = create_output_engine(spec, env)

    @property
    def where(self) -> str:
        return _where(self.engine, self.spec)

    def check_reachable(self) -> None:
        """Connect now and create the state table: a wrong password, an unreachable
        server or a server older than 15 fails the start in one line, not the first
        commit. A refused password is an AuthenticationError, the rest UnreachableError."""
        try:
            ensure_tables(self.engine, self.spec)
        except UnreachableError as exc:
            text = " ".join(str(exc).split())
            if "password authentication failed" in text or "no password supplied" in text:
                raise AuthenticationError(text) from exc
            raise UnreachableError(text) from exc

    def held_batch(self, app_id: str) -> int | None:
        return held_state(self.engine, self.spec, app_id)[0]

    def check_schema(self, schema: pa.Schema) -> None:
        """Refuse a partial the existing table cannot take (invariant 14), before the vote;
        read only: a table not created yet takes any partial."""
        where = self.where
        columns = _expected_columns(self.spec, schema, where)
        try:
            with self.engine.connect() as conn:
                exists = conn.execute(
                    sa.text("SELECT to_regclass(:t)"), {"t": _table(self.spec)}
                ).scalar_one()
                if exists is None:
                    return
                have = {
                    r.attname: r.type
                    for r in conn.execute(
                        sa.text(
                            "SELECT attname, format_type(atttypid, atttypmod) AS type "
                            "FROM pg_attribute WHERE attrelid = CAST(:t AS regclass) "
                            "AND attnum > 0 AND NOT attisdropped"
                        ),
                        {"t": _table(self.spec)},
                    )
                }
        except OperationalError as exc:
            raise UnreachableError(f"{where}: {_one_line(exc)}") from exc
        for column, kind in columns.items():
            if have.get(column) != kind:
                raise RefusedBatchError(
                    f"{where}: column {column} is {have.get(column, 'missing')} in the "
                    f"table, {kind} in the partial (invariant 14)"
                )

    def dispose(self) -> None:
        self.engine.dispose()


def read_output(
    engine: Engine, spec: PostgresOutput, app_ids: Sequence[str]
) -> tuple[pa.Table, tuple[int | None, ...]]:
    """The output table's rows (its keys and measures) and the batch id each of `app_ids`
    has in the state, read in one REPEATABLE READ transaction so the rows are exactly those
    batches' (the recomputation check, orchestration/health/derived_checks.py); an output never
    applied reads as empty with no batch."""
    columns = [*spec.key_columns, *(m.name for m in spec.measures)]
    names = ", ".join(_quote(c) for c in columns)
    try:
        with engine.connect() as conn:
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                if conn.execute(sa.text("SELECT to_regclass(:t)"), {"t": _table(spec)}).scalar():
                    found = conn.execute(sa.text(f"SELECT {names} FROM {_table(spec)}"))
                    rows = [dict(r._mapping) for r in found]
                else:
                    rows = []
                if conn.execute(sa.text("SELECT to_regclass(:t)"), {"t": _state(spec)}).scalar():
                    held = tuple(_read_state(conn, spec, a)[0] for a in app_ids)
                else:
                    held = tuple(None for _a in app_ids)
    except OperationalError as exc:
        raise UnreachableError(f"{_where(engine, spec)}: {_one_line(exc)}") from exc
    table = pa.Table.from_pylist(rows) if rows else pa.table({c: [] for c in columns})
    return table, held
