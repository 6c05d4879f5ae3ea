"""A PostgreSQL output as the layers above hold and read it, without applying anything: the
publisher's target (its engine, the start check, the held batch, the schema check before the
vote) and the recomputation check's read of the table with the batch ids it holds.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, OperationalError

from ledger.core.errors import (
    AuthenticationError,
    ConfigError,
    RefusedBatchError,
    UnreachableError,
)
from resources.config.derived_spec import PostgresOutput
from resources.postgres.connection import _one_line, _where, create_output_engine
from resources.postgres.state import _read_state, held_state
from resources.postgres.tables import (
    _columns_of,
    _expected_columns,
    _quote,
    _state,
    _table,
    dropped_table,
    ensure_tables,
)


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

    def location(self) -> tuple[str, ...]:
        """Where the output's table is, as the server names it: the cluster, the database,
        the schema and the table. A name without a schema resolves through this
        connection's search_path: to the table's schema when it exists, else to the schema
        its first batch's CREATE TABLE would put it in (`current_schema()`).

        The cluster is its system identifier (`pg_control_system()`, which any role may
        call on PostgreSQL 15; where a managed server refuses it, the postmaster's start
        time, one per running server), so that two URLs of one server (127.0.0.1 and
        localhost, a unix socket, two users, two environment variables holding one URL)
        give one location."""
        schema, _, name = self.spec.table.rpartition(".")
        query = (
            "SELECT (SELECT oid FROM pg_database WHERE datname = current_database())::text, "
            "COALESCE(CAST(:schema AS text), (SELECT n.nspname FROM pg_class c JOIN "
            "pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(:t)), "
            "current_schema())"
        )
        try:
            with self.engine.connect() as conn:
                database, resolved = conn.execute(
                    sa.text(query), {"schema": schema or None, "t": _table(self.spec)}
                ).one()
                cluster = _cluster(conn)
        except OperationalError as exc:
            raise UnreachableError(f"{self.where}: {_one_line(exc)}") from exc
        return (cluster, database, str(resolved), name)

    def held_batch(self, app_id: str) -> int | None:
        return held_state(self.engine, self.spec, app_id)[0]

    def check_schema(self, schema: pa.Schema) -> None:
        """Refuse a partial the existing table cannot take (invariant 14), and a table
        dropped behind the pipeline (`dropped_table`), before the vote; read only."""
        where = self.where
        columns = _expected_columns(self.spec, schema, where)
        try:
            with self.engine.connect() as conn:
                exists = conn.execute(
                    sa.text("SELECT to_regclass(:t)"), {"t": _table(self.spec)}
                ).scalar_one()
                if exists is None:
                    # a table not created yet takes any partial; one dropped under a state
                    # that holds batches is refused here, not only when its batch commits
                    dropped = dropped_table(conn, self.spec, where)
                    if dropped is not None:
                        raise RefusedBatchError(dropped)
                    return
                have = _columns_of(conn, self.spec)
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


def _cluster(conn: sa.Connection) -> str:
    """The server's identity for `PostgresTarget.location`: its system identifier, or its
    postmaster's start time where `pg_control_system()` is refused."""
    try:
        with conn.begin_nested():
            found = conn.execute(sa.text("SELECT system_identifier FROM pg_control_system()"))
            return f"system {found.scalar_one()}"
    except DBAPIError:
        started = conn.execute(sa.text("SELECT pg_postmaster_start_time()")).scalar_one()
        return f"started {started.isoformat()}"


def refuse_one_table_twice(targets: Iterable[PostgresTarget]) -> None:
    """Refuse two PostgreSQL outputs of one pipeline on one table, however their URLs and
    names are spelled (`PostgresTarget.location`, asked of the servers themselves).

    Each output applies every batch under its own application id and state row, so the
    compare-and-set of one never sees the other's: on one table, every batch's partial
    would be added twice, and every check would pass. The config's check
    (resources/config/pipeline_config.py) compares spellings only; this runs at the
    pipeline's start, before anything is staged, with the connection `check_reachable`
    made."""
    seen: dict[tuple[str, ...], PostgresTarget] = {}
    for target in targets:
        where = target.location()
        other = seen.setdefault(where, target)
        if other is not target:
            raise ConfigError(
                f"derived output {target.spec.name}: table {target.spec.table} is table "
                f"{other.spec.table} of output {other.spec.name} on the same server "
                f"({where[2]}.{where[3]} in one database), and both would add every batch "
                "to it: give each output a table of its own"
            )


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
