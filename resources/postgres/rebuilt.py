"""Writing a PostgreSQL output built from the raw table (jobs/derived/postgres_rebuild.py):
its rows and its state rows in ONE SQL transaction, or nothing.

The state rows say which batch of each application id the rows hold, and the publisher's
compare-and-set (resources/postgres/state.py) applies the next batch only on top of exactly
that one, so rows and ids must land together: rows without ids would have the next batches
refused and a second rebuild added on top of them; ids without rows would have every later
batch applied to an empty table, short for ever.

The failure cases it handles:
- A crash or a lost connection before COMMIT: nothing landed (the table, created empty by
  `ensure_tables` beforehand, holds no row and no id), and the rebuild runs again. A lost
  answer to the COMMIT itself leaves the outcome unknown; the rerun then reads the ids and
  is refused (the output holds batches) if it landed, which is the truth.
- Two rebuilds at once: each locks the state rows first; the second waits, then reads the
  first's ids and is refused.
- An output that holds batches already (rebuilt, or merged into): refused, never added
  to, as a Delta output's rebuild never overwrites one that holds batches.
- A table that holds rows but no batch (a writer other than exactly, a restore without
  its state rows): refused, since the rebuilt groups would be added to whatever is there.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, OperationalError

from ledger.core.errors import InconsistencyError, UnreachableError
from resources.config.derived_spec import PostgresOutput
from resources.delta.log import METADATA_KEY
from resources.postgres.apply import upsert_parameters, upsert_sql
from resources.postgres.connection import _one_line, _where
from resources.postgres.state import _advance, _ensure_row, _read_state
from resources.postgres.tables import STATE_TABLE, _table, ensure_tables


def write_rebuilt(
    engine: Engine,
    spec: PostgresOutput,
    rows: pa.Table,
    app_ids: Sequence[str],
    holds: Mapping[str, int],
    info: Mapping[str, Any],
) -> None:
    """Insert `rows` (the output's groups, typed as the stage's partials) and set each of
    the output's own `app_ids` that `holds` names to its batch id, in one transaction,
    only into an output that holds no batch of any of `app_ids` and no row (module
    docstring). `info` is kept on the state rows as a batch's commit info is."""
    where = _where(engine, spec)
    ensure_tables(engine, spec, rows.schema)
    token = uuid.uuid4().hex
    try:
        with engine.connect() as conn:
            for app_id in app_ids:
                _ensure_row(conn, spec, app_id)
            held = {a: _read_state(conn, spec, a, lock=True)[0] for a in app_ids}
            held = {a: v for a, v in held.items() if v is not None}
            if held:
                conn.rollback()
                found = ", ".join(f"{a} up to batch {v}" for a, v in held.items())
                raise InconsistencyError(
                    f"{where} already holds batches ({found}); a rebuild only builds an "
                    "output that holds none. To rebuild it anyway, stop the pipeline, empty "
                    f"the table and delete its rows of {STATE_TABLE} (output = "
                    f"'{spec.table}') first"
                )
            table = _table(spec)
            if conn.execute(sa.text(f"SELECT EXISTS (SELECT 1 FROM {table})")).scalar_one():
                conn.rollback()
                raise InconsistencyError(
                    f"{where} holds rows but no batch (another writer's, or a copy restored "
                    "without its state rows), and a rebuild would add its groups to them: "
                    "empty the table, or give the output a new table, and rebuild"
                )
            if rows.num_rows:
                conn.execute(sa.text(upsert_sql(spec, rows.column_names)), upsert_parameters(rows))
            for app_id, batch_id in holds.items():
                meta = {METADATA_KEY: {**info, "app_id": app_id, "batch_id": batch_id}}
                _advance(conn, spec, app_id, batch_id, token, json.dumps(meta, default=str))
            conn.commit()
    except OperationalError as exc:
        raise UnreachableError(f"{where}: {_one_line(exc)}") from exc
    except DBAPIError as exc:
        raise InconsistencyError(f"{where}: the rebuild was not written: {_one_line(exc)}") from exc
