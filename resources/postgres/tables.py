"""A PostgreSQL output's tables and how the SQL names them.

The output table takes its column types from the partial (Spark's sum of an int is a bigint,
etc.), which is why it is created at the first batch rather than from the spec alone, with a
unique index on the group keys that keeps a null key one group (NULLS NOT DISTINCT, from
PostgreSQL 15 on). The state table beside it, in the same schema, holds each app id's batch
id (resources/postgres/state.py): one database, one transaction, the same grants. A table
whose columns do not fit the partial is refused before anything is written (invariant 14).
"""

from __future__ import annotations

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError

from ledger.core.errors import (
    CONFIG_PLACEHOLDER,
    ConfigError,
    InconsistencyError,
    RefusedBatchError,
    UnreachableError,
)
from resources.config.derived_spec import PostgresOutput
from resources.postgres.connection import _where

STATE_TABLE = "exactly_output_state"
#: NULLS NOT DISTINCT unique indexes (a null group key is one group, as in the Delta
#: output's null-safe MERGE) exist from PostgreSQL 15 on.
MIN_SERVER_VERSION = 150000


def check_server_version(version_num: int, where: str) -> None:
    """Refuse a server that cannot keep null group keys as one group (NULLS NOT DISTINCT
    needs 15): on 14 every batch would insert another row for a null key, silently."""
    if version_num < MIN_SERVER_VERSION:
        major, minor = version_num // 10000, version_num % 10000
        raise ConfigError(
            f"{where}: PostgreSQL {major}.{minor} is older than 15, which unique indexes "
            "with NULLS NOT DISTINCT need (a null group key must stay one group)"
        )


def _quote(name: str) -> str:
    """An identifier as written (resources/config/derived_spec.py allows only letters, digits
    and '_'): quoted, so PostgreSQL keeps its case as Delta and Spark do."""
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
                int(conn.execute(sa.text("SHOW server_version_num")).scalar_one()),
                where,
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
    _refuse_a_dropped_table(conn, spec, where)
    conn.execute(sa.text(f"CREATE TABLE IF NOT EXISTS {_table(spec)} ({definitions})"))
    have = _columns_of(conn, spec)
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


def _refuse_a_dropped_table(conn: Connection, spec: PostgresOutput, where: str) -> None:
    """Refuse to create an output table whose state row holds a batch (`dropped_table`)."""
    reason = dropped_table(conn, spec, where)
    if reason is not None:
        raise InconsistencyError(reason)


def dropped_table(conn: Connection, spec: PostgresOutput, where: str) -> str | None:
    """Why the output table is missing while its state row holds a batch, or None: the
    table was dropped (or never restored with its state) behind the pipeline, and created
    anew it would take the next batch's partial alone, every group's earlier counts gone
    while the compare-and-set, which reads the state, is satisfied."""
    if conn.execute(sa.text("SELECT to_regclass(:t)"), {"t": _table(spec)}).scalar():
        return None
    if not conn.execute(sa.text("SELECT to_regclass(:t)"), {"t": _state(spec)}).scalar():
        return None
    held = conn.execute(
        sa.text(
            f"SELECT app_id, batch_id FROM {_state(spec)} "
            "WHERE output = :o AND batch_id IS NOT NULL ORDER BY app_id LIMIT 1"
        ),
        {"o": spec.table},
    ).first()
    if held is None:
        return None
    return (
        f"{where}: the output table was dropped, but its state holds batch "
        f"{held.batch_id} of {held.app_id}: restore the table with its rows, or delete its "
        f"rows of {STATE_TABLE} (output = '{spec.table}') and build it from the raw table: "
        f"`exactly derived rebuild -c {CONFIG_PLACEHOLDER} {spec.name}` (batches wait until "
        "then, nothing is lost)"
    )


def _columns_of(conn: Connection, spec: PostgresOutput) -> dict[str, str]:
    """The existing output table's columns (name -> type, as `format_type` spells it)."""
    return {
        r.attname: r.type
        for r in conn.execute(
            sa.text(
                "SELECT attname, format_type(atttypid, atttypmod) AS type FROM pg_attribute "
                "WHERE attrelid = CAST(:t AS regclass) AND attnum > 0 AND NOT attisdropped"
            ),
            {"t": _table(spec)},
        )
    }
