"""Reaching a PostgreSQL output's database: the engine for the output's URL (its
`{env: NAME}` read from the environment when the engine is made), and how errors name the
output and say a failure in one line, never with the URL's password, since they are shown
in a terminal, a log and the Dagster UI.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError

from ledger.core.errors import ConfigError
from resources.config.derived_spec import PostgresOutput
from resources.config.env_values import resolve_options


def create_output_engine(spec: PostgresOutput, env: Mapping[str, str] = os.environ) -> Engine:
    """An engine for the output's URL, its `{env: NAME}` resolved now
    (resources/config/env_values.py `resolve_options`), with psycopg (the driver the ledger
    uses) for a bare `postgresql`.

    Transactions run in READ COMMITTED on purpose: the statement after the state row's lock
    must see the row as the committer that held the lock left it (REPEATABLE READ would fail
    it instead; resources/postgres/apply.py)."""
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


def _one_line(exc: OperationalError) -> str:
    """psycopg's connection error as one line (it spans several: host, then FATAL)."""
    return " ".join(line.strip() for line in str(exc.orig).splitlines() if line.strip())
