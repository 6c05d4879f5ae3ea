"""The ledger's tables and how to connect to them: SQLite file or PostgreSQL.

Apart from the store so the database layout can be read (and versioned) on its own, and so
the engine settings that the store's guarantees rest on (durable SQLite commits, writers
that queue, errors that never show a password) sit in one place.
"""

from __future__ import annotations

import functools
import os
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError, OperationalError

from ledger.core.errors import ConfigError, UnreachableError
from ledger.store.write_failures import ledger_failure, sqlite_file

if TYPE_CHECKING:
    from alembic.script import ScriptDirectory

#: Bump with every schema change, with an Alembic revision `000N` in ledger/store/migrations that
#: makes it (and writes N to exactly_meta); a ledger written by a newer exactly is refused, an
#: older one is upgraded by the revisions it lacks (`ensure_schema`).
#: 2: topic ids on ranges, the decisions a batch was planned on, the decisions table.
#: 3: a voted file's target holds `derived:<name>` (a derived output's, name up to 128).
#: 4: the operator actions journal (ledger/core/actions.py).
SCHEMA_VERSION = 4
#: Alembic's record of the ledger's revision, named for exactly: a ledger may share its
#: PostgreSQL database with another Alembic user (Dagster's storage keeps `alembic_version`).
VERSION_TABLE = "exactly_alembic_version"
#: The revision a ledger at SCHEMA_VERSION is stamped with (revision `000N` makes version N).
HEAD_REVISION = f"{SCHEMA_VERSION:04d}"

metadata = sa.MetaData()

meta_table = sa.Table(
    "exactly_meta",
    metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.String(256), nullable=False),
)

batches_table = sa.Table(
    "exactly_batches",
    metadata,
    sa.Column("app_id", sa.String(255), primary_key=True),
    sa.Column("batch_id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("pipeline", sa.String(255), nullable=False, index=True),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("token", sa.String(32), nullable=False),
    sa.Column("owner", sa.String(255), nullable=False),
    sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("prepared_at", sa.DateTime(timezone=True)),
    sa.Column("committed_at", sa.DateTime(timezone=True)),
    sa.Column("table_version", sa.BigInteger),
    sa.Column("error", sa.Text),
    sa.Column("schemas", sa.JSON),
    sa.Column("metrics", sa.JSON),
    sa.Column("params", sa.JSON),
    # version 2: the operator decisions the batch was planned on, as its commit carries them
    sa.Column("decisions", sa.JSON),
)

ranges_table = sa.Table(
    "exactly_ranges",
    metadata,
    sa.Column("app_id", sa.String(255), primary_key=True),
    sa.Column("batch_id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("topic", sa.String(255), primary_key=True),
    sa.Column("partition", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("start_offset", sa.BigInteger, nullable=False),
    sa.Column("end_offset", sa.BigInteger, nullable=False),
    # version 2: Kafka's id of the topic incarnation (KIP-516); NULL = recorded before ids
    sa.Column("topic_id", sa.String(64)),
    sa.ForeignKeyConstraint(
        ["app_id", "batch_id"], ["exactly_batches.app_id", "exactly_batches.batch_id"]
    ),
)

files_table = sa.Table(
    "exactly_files",
    metadata,
    sa.Column("app_id", sa.String(255), primary_key=True),
    sa.Column("batch_id", sa.BigInteger, primary_key=True, autoincrement=False),
    # `table`, `quarantine` or `derived:<name>` (ledger/core/layout.py derived_target)
    sa.Column("target", sa.String(255), primary_key=True),
    sa.Column("path", sa.String(1024), primary_key=True),
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("records", sa.BigInteger, nullable=False),
    sa.Column("modification_time", sa.BigInteger, nullable=False),
    sa.Column("stats", sa.Text, nullable=False),
    sa.ForeignKeyConstraint(
        ["app_id", "batch_id"], ["exactly_batches.app_id", "exactly_batches.batch_id"]
    ),
)


decisions_table = sa.Table(
    "exactly_decisions",
    metadata,
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("id", sa.String(32), nullable=False, unique=True),
    sa.Column("pipeline", sa.String(255), nullable=False),
    sa.Column("app_id", sa.String(255), nullable=False, index=True),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("topic", sa.String(255), nullable=False),
    sa.Column("topic_id", sa.String(64)),
    sa.Column("previous_topic_id", sa.String(64)),
    sa.Column("after_batch_id", sa.BigInteger, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("decided_by", sa.String(255), nullable=False),
    sa.Column("decided_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("forced", sa.Boolean, nullable=False),
    # the whole decision as ledger/core/decisions.py Decision.as_dict() writes it
    sa.Column("body", sa.JSON, nullable=False),
)

#: Operator actions that move no position (ledger/core/actions.py), oldest first by seq.
actions_table = sa.Table(
    "exactly_actions",
    metadata,
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("id", sa.String(32), nullable=False, unique=True),
    sa.Column("pipeline", sa.String(255), nullable=False, index=True),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("subject", sa.String(255), nullable=False),
    sa.Column("decided_by", sa.String(255), nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("decided_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("outcome", sa.Text, nullable=False),
)


def _configure_sqlite(engine: Engine) -> None:
    """WAL for concurrent readers, FULL sync so a vote survives power loss, and
    BEGIN IMMEDIATE so two writers queue instead of failing to upgrade a read lock."""

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def _mask_password(url: str) -> str:
    """Hide `user:password@` in a URL that may not even parse: errors must not leak it."""
    return re.sub(r"(://[^:/@]*):[^@]*@", r"\1:***@", url)


def create_ledger_engine(url: str) -> Engine:
    """An engine for `ledger.url`; a URL that cannot be used is a ConfigError naming it
    (without its password) rather than a driver traceback."""
    try:
        parsed = sa.engine.make_url(url)
    except Exception:
        raise ConfigError(f"ledger.url {_mask_password(url)!r} is not a database URL") from None
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(parsed.database)), exist_ok=True)
        engine = sa.create_engine(parsed, connect_args={"timeout": 30})
        _configure_sqlite(engine)
        return engine
    try:
        return sa.create_engine(parsed, pool_pre_ping=True, connect_args={"connect_timeout": 10})
    except (ImportError, sa.exc.ArgumentError) as exc:
        raise ConfigError(f"ledger.url {parsed!r}: unsupported database: {exc}") from exc


def ensure_schema(engine: Engine) -> None:
    """Bring the ledger to SCHEMA_VERSION with the Alembic revisions (ledger/store/migrations):
    create it if it is empty, upgrade it if an older exactly wrote it; refuse, in one line,
    a ledger written by a newer exactly, whose rows this one might misread.

    Runs in one transaction, under a lock that serialises the processes opening the same
    ledger (`_lock_schema`), so a migration is all done or not at all, and done once: the
    first open that finds the ledger behind runs it, every later one (any process) finds it
    at the newest revision, which costs a few reads; the revisions are read from disk once
    per process.
    """
    safe_url = engine.url.render_as_string(hide_password=True)
    try:
        with engine.begin() as conn:
            _lock_schema(conn)
            _upgrade(conn, safe_url)
    except IntegrityError:
        # two processes created the schema at once; the other one won, which is fine
        return
    except OperationalError as exc:
        where = sqlite_file(engine.url)
        line = ledger_failure(safe_url, exc.orig, " is unreachable:", where)
        raise UnreachableError(line) from exc


def _newer(safe_url: str, version: object) -> ConfigError:
    return ConfigError(
        f"ledger at {safe_url} has schema version {version}, newer than this exactly "
        f"supports ({SCHEMA_VERSION}); upgrade exactly"
    )


#: Serialises `Operations.context` between threads (see `_upgrade`).
_MIGRATING = threading.Lock()


@functools.cache
def _migrations() -> ScriptDirectory:
    """The revisions, read from disk once per process."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(Path(__file__).parent / "migrations"))


def _known(scripts: ScriptDirectory, revision: str) -> bool:
    from alembic.util import CommandError as AlembicError

    try:
        return scripts.get_revision(revision) is not None
    except AlembicError:  # a revision a newer exactly wrote
        return False


def _at_head(conn: Connection) -> bool:
    """Whether Alembic's record says the ledger is at HEAD_REVISION: one read, and no import
    of Alembic, whose import was a tenth of every `exactly` process's start. Anything else
    (no record, an older or a newer revision, several heads) goes through Alembic. Asked
    after exactly_meta's version is checked: either record may be the one that says a newer
    exactly wrote the ledger."""
    if not sa.inspect(conn).has_table(VERSION_TABLE):
        return False
    rows = conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    return rows == [HEAD_REVISION]


def _upgrade(conn: Connection, safe_url: str) -> None:
    """Refuse a newer ledger; stamp a ledger from before Alembic at the revision of its
    schema version (`000N`); then run the revisions it lacks, in the caller's transaction."""
    legacy = None
    if sa.inspect(conn).has_table(meta_table.name):
        legacy = conn.execute(
            sa.select(meta_table.c.value).where(meta_table.c.key == "schema_version")
        ).scalar_one_or_none()
    if legacy is not None and int(legacy) > SCHEMA_VERSION:
        raise _newer(safe_url, legacy)
    if _at_head(conn):
        return
    from alembic.operations import Operations
    from alembic.runtime.migration import MigrationContext

    scripts = _migrations()
    context = MigrationContext.configure(
        conn,
        opts={
            "version_table": VERSION_TABLE,
            "script": scripts,
            # what `alembic upgrade head` runs (alembic/command.py), without an env.py
            "fn": lambda heads, _context: scripts._upgrade_revs("head", heads),
        },
    )
    heads = context.get_current_heads()
    unknown = [h for h in heads if not _known(scripts, h)]
    if unknown:
        raise _newer(safe_url, f"revision {', '.join(unknown)}")
    if not heads and legacy is not None:
        context.stamp(scripts, f"{int(legacy):04d}")
    if context.get_current_heads() == (scripts.get_current_head(),):
        return
    # Alembic's `op`, which the revisions call, is one module-level proxy for the whole
    # process: two threads migrating two ledgers at once (two pipelines in one process)
    # would each run the other's revisions on one connection. One thread at a time; the lock
    # is only taken when a ledger is behind, which is once per ledger.
    with _MIGRATING, Operations.context(context):
        context.run_migrations()


def _lock_schema(conn: Connection) -> None:
    """Serialise schema set-up and migration between processes opening one ledger.

    SQLite already does (BEGIN IMMEDIATE); on PostgreSQL two processes would otherwise both
    add the same column and one would fail.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtextextended('exactly.schema', 0))"))
