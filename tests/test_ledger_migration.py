"""A ledger written by an older exactly (schema version 1) opens, is migrated in place and
keeps every batch, on SQLite and PostgreSQL; its positions, which predate topic ids, adopt
the topic's current id on the next plan, and that adoption is recorded.

Migrations are Alembic revisions (ledger/store/migrations): a ledger from before them, at any
schema version, is stamped at its version's revision and upgraded; a fresh one is built by
the revisions alone and must equal ledger/store/schema.py's tables; a newer one is refused in one
line, whether its exactly_meta or its revision says so."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext

from ledger.coordinator.two_phase import TwoPhaseCommit
from ledger.core.errors import ConfigError, TopicChangedError
from ledger.core.protocol import Available, BatchState
from ledger.store.ledger_store import LedgerStore
from ledger.store.schema import SCHEMA_VERSION, VERSION_TABLE, _migrations, files_table, metadata
from tests.fixtures.fakes import FakeSource, wired

APP = "pageviews"
TOPIC = "pageviews"

# -- the version-1 layout, as exactly 1 created it ----------------------------------------

V1 = sa.MetaData()
V1_META = sa.Table(
    "exactly_meta",
    V1,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.String(256), nullable=False),
)
V1_BATCHES = sa.Table(
    "exactly_batches",
    V1,
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
)
V1_RANGES = sa.Table(
    "exactly_ranges",
    V1,
    sa.Column("app_id", sa.String(255), primary_key=True),
    sa.Column("batch_id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("topic", sa.String(255), primary_key=True),
    sa.Column("partition", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("start_offset", sa.BigInteger, nullable=False),
    sa.Column("end_offset", sa.BigInteger, nullable=False),
    sa.ForeignKeyConstraint(
        ["app_id", "batch_id"], ["exactly_batches.app_id", "exactly_batches.batch_id"]
    ),
)
V1_FILES = sa.Table(
    "exactly_files",
    V1,
    sa.Column("app_id", sa.String(255), primary_key=True),
    sa.Column("batch_id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("target", sa.String(16), primary_key=True),
    sa.Column("path", sa.String(1024), primary_key=True),
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("records", sa.BigInteger, nullable=False),
    sa.Column("modification_time", sa.BigInteger, nullable=False),
    sa.Column("stats", sa.Text, nullable=False),
    sa.ForeignKeyConstraint(
        ["app_id", "batch_id"], ["exactly_batches.app_id", "exactly_batches.batch_id"]
    ),
)


def write_version_1_ledger(url: str) -> None:
    """Two ACKED batches over two partitions, written with the version-1 tables."""
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    now = datetime(2026, 11, 1, tzinfo=UTC)
    with engine.begin() as conn:
        V1.create_all(conn)
        conn.execute(V1_META.insert().values(key="schema_version", value="1"))
        for batch_id, (start, end) in enumerate([(0, 10), (10, 25)], start=1):
            conn.execute(
                V1_BATCHES.insert().values(
                    app_id=APP,
                    batch_id=batch_id,
                    pipeline="pv",
                    kind="live",
                    state="ACKED",
                    attempt=1,
                    token=f"t{batch_id}",
                    owner="old-host:1",
                    heartbeat_at=now,
                    created_at=now,
                    updated_at=now,
                    prepared_at=now,
                    committed_at=now,
                    table_version=batch_id - 1,
                    error=None,
                    schemas={"table": "s"},
                    metrics={"records_read": 2 * (end - start)},
                    params={},
                )
            )
            for partition in (0, 1):
                conn.execute(
                    V1_RANGES.insert().values(
                        app_id=APP,
                        batch_id=batch_id,
                        topic=TOPIC,
                        partition=partition,
                        start_offset=start,
                        end_offset=end,
                    )
                )
            conn.execute(
                V1_FILES.insert().values(
                    app_id=APP,
                    batch_id=batch_id,
                    target="table",
                    path=f"b{batch_id}.parquet",
                    size=100,
                    records=2 * (end - start),
                    modification_time=0,
                    stats="{}",
                )
            )
    engine.dispose()


def test_a_version_1_ledger_is_migrated_in_place_and_keeps_its_batches(ledger_url: str) -> None:
    write_version_1_ledger(ledger_url)
    store = LedgerStore(ledger_url)
    try:
        assert store.schema_version() == SCHEMA_VERSION == 4
        batches = sorted(store.batches(app_id=APP), key=lambda b: b.batch_id)
        assert [(b.batch_id, b.state) for b in batches] == [
            (1, BatchState.ACKED),
            (2, BatchState.ACKED),
        ]
        assert [str(r) for r in batches[1].ranges] == ["pageviews-0[10,25)", "pageviews-1[10,25)"]
        assert [b.topic_id for b in batches] == [None, None]  # unknown: written before ids
        assert [f.path for f in store.files(APP, 2)] == ["b2.parquet"]
        assert store.positions(APP) == {0: 25, 1: 25}
        assert store.positions(APP).topic_id is None
        assert store.decisions(app_id=APP) == []
        # opening it again migrates nothing twice
        LedgerStore(ledger_url).dispose()

        # the next plan adopts the topic's current id, continues where batch 2 ended, and
        # records the adoption as a decision that the batch's commit carries
        source = FakeSource({0: Available(0, 30), 1: Available(0, 30)}, current_id="T-current")
        stager, publisher = wired()
        publisher.hold(APP, "table", 2)  # the table the version 1 ledger's batches went to
        tpc = TwoPhaseCommit(
            store,
            pipeline="pv",
            app_id=APP,
            source=source,
            stager=stager,
            publisher=publisher,
            max_records_per_partition=100,
        )
        report = tpc.run_batch()
        assert report is not None
        assert [str(r) for r in report.batch.ranges] == ["pageviews-0[25,30)", "pageviews-1[25,30)"]
        assert report.batch.topic_id == "T-current"
        (adopted,) = store.decisions(app_id=APP)
        assert adopted.kind == "adopt-topic-id" and adopted.topic_id == "T-current"
        assert adopted.previous_topic_id is None
        assert [d.id for d in report.batch.decisions] == [adopted.id]
        assert publisher.commits[-1]["decisions"] == [adopted.as_dict()]
        # from here the id is known: a different one is refused
        assert store.positions(APP).topic_id == "T-current"
        source.current_id = "T-other"
        source.offsets = {0: Available(0, 40), 1: Available(0, 40)}
        with pytest.raises(TopicChangedError, match="T-current"):
            tpc.begin()
        # version 3: a derived output's vote target (`derived:<name>`) fits the old column
        target = "derived:" + "x" * 128
        engine = sa.create_engine(ledger_url)
        try:
            with engine.begin() as conn:
                conn.execute(
                    files_table.insert().values(
                        app_id=APP,
                        batch_id=2,
                        target=target,
                        path="p.parquet",
                        size=1,
                        records=1,
                        modification_time=0,
                        stats="{}",
                    )
                )
        finally:
            engine.dispose()
        assert target in {f.target for f in store.files(APP, 2)}
    finally:
        store.dispose()


# -- Alembic ------------------------------------------------------------------------------


def engine_of(url: str) -> sa.Engine:
    return sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))


def revision_of(url: str) -> tuple[str, ...]:
    engine = engine_of(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            return context.get_current_heads()
    finally:
        engine.dispose()


def as_before_alembic(url: str, version: int) -> None:
    """A ledger at schema `version` as an exactly from before Alembic left it: the layout
    the revisions up to `version` build (each spells out its version's tables), without
    Alembic's version table."""
    engine = engine_of(url)
    scripts = _migrations()
    try:
        with engine.begin() as conn:
            context = MigrationContext.configure(
                conn,
                opts={
                    "version_table": VERSION_TABLE,
                    "fn": lambda heads, _c: scripts._upgrade_revs(f"{version:04d}", heads),
                },
            )
            with Operations.context(context):
                context.run_migrations()
            conn.exec_driver_sql(f"DROP TABLE {VERSION_TABLE}")
    finally:
        engine.dispose()


def test_a_new_ledger_is_built_by_the_revisions_as_the_tables_say(ledger_url: str) -> None:
    """The revisions alone build what ledger/store/schema.py declares: a table, column, index or
    type one of them lacks is a difference here (lengths only where the database keeps
    them: SQLite ignores them, and revision 0003 leaves them so)."""
    LedgerStore(ledger_url).dispose()
    assert revision_of(ledger_url) == (f"{SCHEMA_VERSION:04d}",)
    engine = engine_of(ledger_url)
    try:
        with engine.connect() as conn:
            postgres = conn.dialect.name == "postgresql"
            context = MigrationContext.configure(
                conn, opts={"compare_type": postgres, "version_table": VERSION_TABLE}
            )
            assert compare_metadata(context, metadata) == []
    finally:
        engine.dispose()


@pytest.mark.parametrize("version", [1, 2, 3])
def test_a_ledger_from_before_alembic_is_stamped_and_upgraded(
    ledger_url: str, version: int
) -> None:
    as_before_alembic(ledger_url, version)
    assert revision_of(ledger_url) == ()
    store = LedgerStore(ledger_url)
    try:
        assert store.schema_version() == SCHEMA_VERSION
        assert revision_of(ledger_url) == (f"{SCHEMA_VERSION:04d}",)
        # version 3's longer target, on a column that version 1 or 2 made 16 long
        engine = engine_of(ledger_url)
        try:
            with engine.begin() as conn:
                conn.execute(
                    sa.text(
                        "INSERT INTO exactly_batches (app_id, batch_id, pipeline, kind, state, "
                        "attempt, token, owner, heartbeat_at, created_at, updated_at) VALUES "
                        "('pageviews', 1, 'pv', 'live', 'PLANNED', 1, 't', 'h:1', "
                        ":now, :now, :now)"
                    ),
                    {"now": datetime(2026, 11, 1, tzinfo=UTC)},
                )
                conn.execute(
                    files_table.insert().values(
                        app_id=APP,
                        batch_id=1,
                        target="derived:" + "x" * 128,
                        path="p.parquet",
                        size=1,
                        records=1,
                        modification_time=0,
                        stats="{}",
                    )
                )
        finally:
            engine.dispose()
        assert [f.target for f in store.files(APP, 1)] == ["derived:" + "x" * 128]
    finally:
        store.dispose()
    LedgerStore(ledger_url).dispose()  # at the newest revision: nothing runs again
    assert revision_of(ledger_url) == (f"{SCHEMA_VERSION:04d}",)


def test_a_ledger_at_a_revision_this_exactly_lacks_is_refused_in_one_line(
    ledger_url: str,
) -> None:
    """A newer exactly's revision, even with an exactly_meta this one could read."""
    LedgerStore(ledger_url).dispose()
    engine = engine_of(ledger_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"UPDATE {VERSION_TABLE} SET version_num = '0099'")
    finally:
        engine.dispose()
    with pytest.raises(ConfigError) as info:
        LedgerStore(ledger_url)
    text = str(info.value)
    assert "\n" not in text
    assert "revision 0099, newer than this exactly supports" in text
    assert revision_of(ledger_url) == ("0099",)  # left as it was


def test_a_migration_that_fails_half_way_leaves_the_ledger_as_it_was(
    ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every revision a ledger lacks runs in the transaction that opens it: one that fails
    (a full disk, a lost connection) undoes the ones before it and the stamp, and the next
    open starts again from the version the ledger still has."""
    as_before_alembic(ledger_url, 1)

    def fails() -> None:
        raise RuntimeError("the disk filled up")

    monkeypatch.setattr(_migrations().get_revision("0003").module, "upgrade", fails)
    with pytest.raises(RuntimeError, match="disk filled up"):
        LedgerStore(ledger_url)
    assert revision_of(ledger_url) == ()
    engine = engine_of(ledger_url)
    try:
        assert not sa.inspect(engine).has_table("exactly_decisions")  # 0002's, undone
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT value FROM exactly_meta").scalar() == "1"
    finally:
        engine.dispose()
    monkeypatch.undo()
    store = LedgerStore(ledger_url)
    try:
        assert store.schema_version() == SCHEMA_VERSION
    finally:
        store.dispose()


def test_ledgers_opened_at_once_in_threads_of_one_process_are_each_built(tmp_path) -> None:
    """Alembic's `op` is one process-wide proxy: two threads migrating two ledgers at once
    (two pipelines in one process, as the bench's scale section and Dagster's in-process
    executor run them) must each build their own tables, not one the other's twice."""
    import threading

    count = 6
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def open_one(i: int) -> None:
        barrier.wait()
        try:
            LedgerStore(f"sqlite:///{tmp_path / f'ledger{i}.db'}").dispose()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for i in range(count):
        tables = sa.inspect(sa.create_engine(f"sqlite:///{tmp_path / f'ledger{i}.db'}"))
        assert set(metadata.tables) <= set(tables.get_table_names()), i
