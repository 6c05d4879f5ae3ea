"""resources/postgres/: a batch's partial aggregate applied to a real PostgreSQL table exactly
once, by the batch-id compare-and-set of docs/derived-tables.md.

Every integration test runs against the suite's PostgreSQL server (`postgres_url`), each on a
table of its own (the state table is shared, as outputs of one database share it), and
compares the table with `recompute_aggregate` over every raw row applied. The compare-and-set
is hidden once on purpose (`test_without_the_check_a_re_drive_doubles_the_counts`) to show
that these comparisons fail when it is wrong. Crashes kill a real child process at the
module's named crash points; unknown outcomes kill the backend at COMMIT.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError

import resources.postgres.apply as pg
import resources.postgres.connection as pg_connection
import resources.postgres.tables as pg_tables
import resources.postgres.target as pg_target
from jobs.derived.invariants import aggregate_differences, recompute_aggregate
from ledger.coordinator.crash import CRASH_EXIT_CODE
from ledger.core.errors import (
    AuthenticationError,
    ConfigError,
    InconsistencyError,
    RefusedBatchError,
    UnreachableError,
)
from resources.config.derived_spec import AggregateOutput, PostgresOutput, parse_output
from resources.postgres.apply import CRASH_POINTS, apply_partial
from resources.postgres.connection import create_output_engine
from resources.postgres.state import Decision, decide, held_batch
from resources.postgres.tables import check_server_version, ensure_tables

APP = "pageviews.derived.views_dashboard"
MEASURES = [
    {"name": "views", "fn": "count"},
    {"name": "bytes", "fn": "sum", "column": "size"},
    {"name": "first_seen", "fn": "min", "column": "ts"},
    {"name": "last_seen", "fn": "max", "column": "ts"},
]
RAW_SCHEMA = pa.schema(
    [("app", pa.string()), ("size", pa.int64()), ("ts", pa.timestamp("us", tz="UTC"))]
)


def at(minute: int) -> datetime:
    return datetime(2026, 11, 25, 12, minute, tzinfo=UTC)


#: each batch's raw rows: new groups, groups seen before, null sizes and a null group key
BATCHES: dict[int, list[dict[str, Any]]] = {
    1: [
        {"app": "web", "size": 10, "ts": at(1)},
        {"app": "web", "size": 5, "ts": at(3)},
        {"app": "ios", "size": None, "ts": at(2)},
        {"app": None, "size": 7, "ts": at(4)},
    ],
    2: [
        {"app": "web", "size": 1, "ts": at(0)},
        {"app": "android", "size": 3, "ts": at(5)},
        {"app": "ios", "size": 2, "ts": None},
        {"app": None, "size": None, "ts": at(9)},
    ],
    3: [{"app": "web", "size": 100, "ts": at(30)}, {"app": None, "size": 1, "ts": at(1)}],
}


def make_spec(url: str | dict[str, str], table: str, window: bool = False) -> PostgresOutput:
    spec = parse_output(
        {
            "kind": "postgres",
            "name": "views_dashboard",
            "url": url,
            "table": table,
            "group_by": ["app"],
            "measures": MEASURES,
            **({"window": {"column": "ts", "size": "10 minutes"}} if window else {}),
        }
    )
    assert isinstance(spec, PostgresOutput)
    return spec


def as_aggregate(spec: PostgresOutput) -> AggregateOutput:
    """The same aggregate as a Delta output's spec, for jobs/derived/invariants.py."""
    fields = spec.model_dump(include={"name", "group_by", "measures", "window"})
    return AggregateOutput(kind="aggregate", table_uri="unused", **fields)


def raw(*batch_ids: int) -> pa.Table:
    rows = [row for b in batch_ids for row in BATCHES[b]]
    return pa.Table.from_pylist(rows, schema=RAW_SCHEMA)


def partial(spec: PostgresOutput, *batch_ids: int) -> pa.Table:
    """The batch's partial aggregate, as the stage would compute it (same columns)."""
    return recompute_aggregate(raw(*batch_ids), as_aggregate(spec))


def read_table(engine: Engine, spec: PostgresOutput) -> pa.Table:
    columns = [*spec.key_columns, *(m.name for m in spec.measures)]
    names = ", ".join(f'"{c}"' for c in columns)
    table = ".".join(f'"{p}"' for p in spec.table.split("."))
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(sa.text(f"SELECT {names} FROM {table}"))]
    return pa.Table.from_pylist(rows) if rows else pa.table({c: [] for c in columns})


def differences(engine: Engine, spec: PostgresOutput, *batch_ids: int) -> list[str]:
    expected = recompute_aggregate(raw(*batch_ids), as_aggregate(spec))
    return aggregate_differences(expected, read_table(engine, spec), as_aggregate(spec))


@pytest.fixture
def output(postgres_url: str) -> Iterator[tuple[Engine, PostgresOutput]]:
    """A table of its own on the suite's PostgreSQL, and an engine built from the spec."""
    spec = make_spec(postgres_url, f"views_{uuid.uuid4().hex[:12]}")
    engine = create_output_engine(spec)
    yield engine, spec
    engine.dispose()


# -- pure rules ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stored", "previous", "batch", "expected"),
    [
        (None, None, 1, Decision.APPLY),
        (1, 1, 2, Decision.APPLY),
        (1, 1, 5, Decision.APPLY),  # batches 2..4 aborted: a gap
        (2, 1, 2, Decision.ALREADY_APPLIED),
        (5, 2, 3, Decision.ALREADY_APPLIED),  # an old batch re-driven
    ],
)
def test_the_compare_and_set_decides_by_the_previous_committed_batch(
    stored: int | None, previous: int | None, batch: int, expected: Decision
) -> None:
    assert decide(stored, previous, batch, where="out") is expected


@pytest.mark.parametrize(
    ("stored", "previous", "batch", "expected"),
    [
        (1, 2, 3, "holds batch 1, the ledger's previous committed batch is 2, requested batch 3"),
        (None, 2, 3, "holds batch none, the ledger's previous committed batch is 2"),
        (2, None, 3, "holds batch 2, the ledger's previous committed batch is none"),
        (1, 3, 3, "previous committed batch 3 is not below requested batch 3"),
    ],
)
def test_out_of_order_is_refused_in_one_line(
    stored: int | None, previous: int | None, batch: int, expected: str
) -> None:
    with pytest.raises(InconsistencyError) as info:
        decide(stored, previous, batch, where="postgres output x")
    assert expected in str(info.value)
    assert "invariant 5" in str(info.value) and "\n" not in str(info.value)


def test_a_server_older_than_15_is_refused() -> None:
    check_server_version(150000, "out")
    check_server_version(170002, "out")
    with pytest.raises(ConfigError) as info:
        check_server_version(140009, "postgres output v")
    assert str(info.value) == (
        "postgres output v: PostgreSQL 14.9 is older than 15, which unique indexes with "
        "NULLS NOT DISTINCT need (a null group key must stay one group)"
    )


def test_the_url_comes_from_the_environment_and_is_never_shown() -> None:
    spec = make_spec({"env": "DASH_URL"}, "t")
    with pytest.raises(ConfigError, match="environment variable DASH_URL is not set"):
        create_output_engine(spec, env={})
    engine = create_output_engine(spec, env={"DASH_URL": "postgresql://u:s3cret@db:5432/m"})
    assert engine.url.drivername == "postgresql+psycopg"
    assert "s3cret" not in pg_connection._where(engine, spec)


# -- against PostgreSQL -------------------------------------------------------------------


def test_a_batch_is_applied_once_and_re_drives_change_nothing(
    output: tuple[Engine, PostgresOutput],
) -> None:
    engine, spec = output
    assert held_batch(engine, spec, APP) is None
    first = apply_partial(engine, spec, APP, 1, None, partial(spec, 1), {"attempt": 1})
    assert (first.applied, first.held_batch_id, first.tries) == (True, 1, 1)
    assert first.metrics == {"rows_upserted": 3}
    again = apply_partial(engine, spec, APP, 1, None, partial(spec, 1))
    assert (again.applied, again.held_batch_id) == (False, 1)
    assert differences(engine, spec, 1) == []
    assert apply_partial(engine, spec, APP, 2, 1, partial(spec, 2)).applied
    for batch, previous in ((2, 1), (1, None)):
        assert not apply_partial(engine, spec, APP, batch, previous, partial(spec, batch)).applied
    assert differences(engine, spec, 1, 2) == []
    assert held_batch(engine, spec, APP) == 2
    with engine.connect() as conn:
        info = conn.execute(
            sa.text(f"SELECT metadata FROM {pg_tables._state(spec)} WHERE output = :o"),
            {"o": spec.table},
        ).scalar_one()
    assert info["exactly"] == {"app_id": APP, "batch_id": 2}  # invariant 7: the commit info
    # another app id (a backfill's) has its own batch ids on the same table
    assert apply_partial(engine, spec, APP + ".backfill", 1, None, partial(spec, 3)).applied
    assert differences(engine, spec, 1, 2, 3) == []


def test_an_output_table_dropped_behind_the_pipeline_is_refused_not_created_empty(
    output: tuple[Engine, PostgresOutput],
) -> None:
    """DROP TABLE of the output alone leaves its state row holding batch 1: the old code
    created the table anew and applied batch 2's partial to it, the counts of batch 1 gone
    for good and the compare-and-set satisfied."""
    engine, spec = output
    assert apply_partial(engine, spec, APP, 1, None, partial(spec, 1)).applied
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP TABLE {pg_tables._table(spec)}"))
    with pytest.raises(InconsistencyError, match="was dropped") as refused:
        apply_partial(engine, spec, APP, 2, 1, partial(spec, 2))
    assert "holds batch 1" in str(refused.value) and "\n" not in str(refused.value)
    with engine.connect() as conn:  # not created again; the state did not move
        found = conn.execute(sa.text("SELECT to_regclass(:t)"), {"t": pg_tables._table(spec)})
        assert found.scalar() is None
    assert held_batch(engine, spec, APP) == 1


def test_an_output_table_dropped_behind_the_pipeline_is_refused_before_the_vote(
    output: tuple[Engine, PostgresOutput],
) -> None:
    """The drop was refused only at the commit (above): the check before the vote took a
    missing table for one not created yet, so the next batch voted and was held PREPARED
    behind the refusal. Refused before the vote, naming the rebuild."""
    from ledger.core.errors import RefusedBatchError
    from resources.postgres.target import PostgresTarget

    engine, spec = output
    first = partial(spec, 1)
    assert apply_partial(engine, spec, APP, 1, None, first).applied
    target = PostgresTarget(spec, "/unused")
    try:
        target.check_schema(first.schema)  # the table as it is takes the partial
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE {pg_tables._table(spec)}"))
        with pytest.raises(RefusedBatchError, match="was dropped") as refused:
            target.check_schema(first.schema)
    finally:
        target.dispose()
    assert "exactly derived rebuild" in str(refused.value) and "\n" not in str(refused.value)


def test_without_the_check_a_re_drive_doubles_the_counts(
    output: tuple[Engine, PostgresOutput], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The comparisons above can fail: with the compare-and-set hidden, a re-drive adds the
    batch again and aggregate_differences names the groups."""
    engine, spec = output
    apply_partial(engine, spec, APP, 1, None, partial(spec, 1))
    monkeypatch.setattr(pg, "decide", lambda *args, **kwargs: Decision.APPLY)
    apply_partial(engine, spec, APP, 1, None, partial(spec, 1))
    problems = differences(engine, spec, 1)
    assert any("group {'app': 'web'}: views is 4, recomputed 2" in p for p in problems)


def test_out_of_order_is_refused_and_changes_nothing(
    output: tuple[Engine, PostgresOutput],
) -> None:
    engine, spec = output
    apply_partial(engine, spec, APP, 1, None, partial(spec, 1))
    with pytest.raises(InconsistencyError) as info:
        apply_partial(engine, spec, APP, 3, 2, partial(spec, 3))
    assert "holds batch 1, the ledger's previous committed batch is 2, requested batch 3" in (
        str(info.value)
    )
    assert spec.table in str(info.value)
    assert held_batch(engine, spec, APP) == 1
    assert differences(engine, spec, 1) == []
    # an app id the output has never seen, whose ledger says batches were committed before
    with pytest.raises(InconsistencyError, match="holds batch none"):
        apply_partial(engine, spec, APP + ".other", 3, 2, partial(spec, 3))
    assert held_batch(engine, spec, APP + ".other") is None
    assert differences(engine, spec, 1) == []


def test_aborted_batch_ids_leave_gaps_that_are_accepted(
    output: tuple[Engine, PostgresOutput],
) -> None:
    engine, spec = output
    apply_partial(engine, spec, APP, 1, None, partial(spec, 1))
    outcome = apply_partial(engine, spec, APP, 4, 1, partial(spec, 2))  # 2 and 3 aborted
    assert (outcome.applied, outcome.held_batch_id) == (True, 4)
    assert differences(engine, spec, 1, 2) == []


def test_an_empty_batch_advances_the_state(output: tuple[Engine, PostgresOutput]) -> None:
    engine, spec = output
    empty = partial(spec, 1).slice(0, 0)
    first = apply_partial(engine, spec, APP, 1, None, empty)  # creates the table too
    assert (first.applied, held_batch(engine, spec, APP)) == (True, 1)
    apply_partial(engine, spec, APP, 2, 1, partial(spec, 2))
    assert apply_partial(engine, spec, APP, 3, 2, empty).applied
    assert held_batch(engine, spec, APP) == 3
    assert differences(engine, spec, 2) == []


def test_null_group_keys_and_null_windows_are_one_group(postgres_url: str) -> None:
    spec = make_spec(postgres_url, f"views_{uuid.uuid4().hex[:12]}", window=True)
    engine = create_output_engine(spec)
    try:
        for batch, previous in ((1, None), (2, 1), (3, 2)):
            apply_partial(engine, spec, APP, batch, previous, partial(spec, batch))
        assert differences(engine, spec, 1, 2, 3) == []
        table = read_table(engine, spec)
        nulls = [r for r in table.to_pylist() if r["app"] is None]
        # app null in 10-minute windows [12:00, 12:10) (three rows over three batches)
        assert [(r["window_start"], r["views"]) for r in nulls] == [(at(0), 3)]
        no_window = [r for r in table.to_pylist() if r["window_start"] is None]
        assert [(r["app"], r["views"], r["bytes"]) for r in no_window] == [("ios", 1, 2)]
    finally:
        engine.dispose()


def test_a_partial_that_does_not_fit_the_table_is_refused(
    output: tuple[Engine, PostgresOutput],
) -> None:
    engine, spec = output
    apply_partial(engine, spec, APP, 1, None, partial(spec, 1))
    changed = partial(spec, 2)
    changed = changed.set_column(
        changed.schema.get_field_index("bytes"), "bytes", changed["bytes"].cast(pa.float64())
    )
    with pytest.raises(RefusedBatchError, match="column bytes is bigint in the table, double"):
        apply_partial(engine, spec, APP, 2, 1, changed)
    assert held_batch(engine, spec, APP) == 1


def _wait_for_a_waiter(conn: Connection) -> None:
    """Hold this transaction (it has the state row locked) until another backend of this
    database waits for a lock: the two committers really race."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with conn.engine.connect() as watcher:
            waiting = watcher.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        if waiting:
            return
        time.sleep(0.05)
    with conn.engine.connect() as watcher:
        others = watcher.execute(
            sa.text(
                "SELECT state, wait_event_type, wait_event, left(query, 60) FROM "
                "pg_stat_activity WHERE datname = current_database()"
            )
        ).all()
    raise AssertionError(f"the other committer never waited for a lock: {others}")


def race(postgres_url: str, batch: int) -> tuple[list[Any], Engine, PostgresOutput]:
    """Two committers of one batch, each with its own connection pool, started together; the
    one that gets the state row's lock holds its transaction until the other waits."""
    spec = make_spec(postgres_url, f"views_{uuid.uuid4().hex[:12]}")
    setup = create_output_engine(spec)
    previous = None if batch == 1 else 1
    if batch == 2:
        apply_partial(setup, spec, APP, 1, None, partial(spec, 1))
    ensure_tables(setup, spec, partial(spec, batch).schema)
    barrier = threading.Barrier(2, timeout=60)
    outcomes: list[Any] = []
    errors: list[BaseException] = []
    first = threading.Lock()

    def hold_until_the_other_waits(conn: Connection) -> None:
        # only the first to reach COMMIT holds: without the row lock the second reaches it
        # too, after the first has committed, with nobody left to wait for it
        if first.acquire(blocking=False):
            _wait_for_a_waiter(conn)

    def commit() -> None:
        engine = create_output_engine(spec)
        try:
            outcomes.append(
                apply_partial(
                    engine,
                    spec,
                    APP,
                    batch,
                    previous,
                    partial(spec, batch),
                    before_lock=lambda _conn: barrier.wait(),
                    before_commit=hold_until_the_other_waits,
                )
            )
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            engine.dispose()

    threads = [threading.Thread(target=commit) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    return outcomes, setup, spec


@pytest.mark.parametrize("batch", [1, 2], ids=["first-batch", "later-batch"])
def test_two_committers_racing_one_batch_apply_it_once(postgres_url: str, batch: int) -> None:
    outcomes, setup, spec = race(postgres_url, batch)
    assert sorted(o.applied for o in outcomes) == [False, True]
    assert {o.held_batch_id for o in outcomes} == {batch}
    assert differences(setup, spec, *range(1, batch + 1)) == []
    setup.dispose()


def test_without_the_row_lock_racing_committers_apply_twice(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race above can fail: with the state row read without FOR UPDATE, both committers
    read batch 1, both upsert (the second waits on the first's rows, then adds again)."""
    unlocked = pg._read_state
    both_read = threading.Barrier(2, timeout=60)

    def read_then_wait(conn: Connection, spec: Any, app_id: str, lock: bool = False) -> Any:
        # both read before either writes: otherwise the later one's INSERT ... ON CONFLICT
        # may wait on the first's updated state row, read batch 2 after its COMMIT, and the
        # race this test shows would not happen (a flake seen in a clean-clone CI)
        state = unlocked(conn, spec, app_id)
        if threading.current_thread() is not threading.main_thread():  # not race()'s set-up
            both_read.wait()
        return state

    monkeypatch.setattr(pg, "_read_state", read_then_wait)
    outcomes, setup, spec = race(postgres_url, 2)
    assert [o.applied for o in outcomes] == [True, True]
    problems = differences(setup, spec, 1, 2)
    assert any("group {'app': 'android'}: views is 2, recomputed 1" in p for p in problems)
    setup.dispose()


def test_a_backend_killed_before_commit_is_an_unknown_outcome_decided_by_the_next_read(
    output: tuple[Engine, PostgresOutput],
) -> None:
    engine, spec = output
    apply_partial(engine, spec, APP, 1, None, partial(spec, 1))
    killed: list[int] = []

    def kill_me(conn: Connection) -> None:
        if killed:
            return
        pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        with engine.connect() as other:
            other.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid})
        killed.append(pid)

    outcome = apply_partial(
        engine, spec, APP, 2, 1, partial(spec, 2), before_commit=kill_me, retry_seconds=0.01
    )
    assert killed
    assert (outcome.applied, outcome.tries, outcome.unknown_outcomes) == (True, 2, 1)
    assert differences(engine, spec, 1, 2) == []


def test_a_commit_whose_answer_is_lost_is_found_applied_by_this_call(
    output: tuple[Engine, PostgresOutput], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The COMMIT lands and the connection dies before its answer: the next try reads the
    state, finds the batch with this call's token, and applies nothing more."""
    engine, spec = output
    apply_partial(engine, spec, APP, 1, None, partial(spec, 1))
    real_commit = pg._commit
    lost: list[bool] = []

    def commit_then_lose_the_answer(conn: Connection) -> None:
        real_commit(conn)
        if not lost:
            lost.append(True)
            raise OperationalError("COMMIT", {}, Exception("server closed the connection"))

    monkeypatch.setattr(pg, "_commit", commit_then_lose_the_answer)
    outcome = apply_partial(engine, spec, APP, 2, 1, partial(spec, 2), retry_seconds=0.01)
    assert (outcome.applied, outcome.tries, outcome.unknown_outcomes) == (True, 2, 1)
    assert differences(engine, spec, 1, 2) == []
    # another committer of the same batch learns it was not its own
    assert not apply_partial(engine, spec, APP, 2, 1, partial(spec, 2)).applied


# -- crashes of a real process ------------------------------------------------------------


def apply_in_child() -> None:
    """Run by the crash test's child process: apply one batch, as the publisher would."""
    args = json.loads(os.environ["EXACTLY_TEST_ARGS"])
    spec = make_spec(args["url"], args["table"])
    engine = create_output_engine(spec)
    outcome = apply_partial(
        engine, spec, APP, args["batch"], args["previous"], partial(spec, args["batch"])
    )
    print(json.dumps({"applied": outcome.applied}))


def run_child(url: str, table: str, batch: int, previous: int | None, crash_at: str) -> Any:
    root = str(Path(__file__).resolve().parents[1])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
        "EXACTLY_CRASH_AT": crash_at,
        "EXACTLY_TEST_ARGS": json.dumps(
            {"url": url, "table": table, "batch": batch, "previous": previous}
        ),
    }
    code = "from tests.test_derived_postgres import apply_in_child; apply_in_child()"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    ("point", "held_after_crash"),
    [("postgres_before_commit", 1), ("postgres_after_commit", 2)],
)
def test_a_process_killed_at_a_crash_point_leaves_the_batch_whole_or_absent(
    postgres_url: str, point: str, held_after_crash: int
) -> None:
    """Killed between the upsert of the rows and COMMIT, nothing of the batch is there and
    the re-drive applies it once; killed right after COMMIT, all of it is there and the
    re-drive adds nothing."""
    assert point in CRASH_POINTS
    spec = make_spec(postgres_url, f"views_{uuid.uuid4().hex[:12]}")
    engine = create_output_engine(spec)
    try:
        apply_partial(engine, spec, APP, 1, None, partial(spec, 1))
        crashed = run_child(postgres_url, spec.table, 2, 1, point)
        assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
        assert f"crash point {point} reached" in crashed.stderr
        assert held_batch(engine, spec, APP) == held_after_crash
        applied_so_far = tuple(range(1, held_after_crash + 1))
        assert differences(engine, spec, *applied_so_far) == []
        redrive = run_child(postgres_url, spec.table, 2, 1, "")
        assert redrive.returncode == 0, redrive.stderr
        assert json.loads(redrive.stdout) == {"applied": held_after_crash == 1}
        assert held_batch(engine, spec, APP) == 2
        assert differences(engine, spec, 1, 2) == []
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("cause", "error"),
    [
        ('FATAL:  password authentication failed for user "exactly"', AuthenticationError),
        ("Connection refused\n\tIs the server running on that host?", UnreachableError),
    ],
)
def test_a_refused_or_unreachable_server_fails_the_start_in_one_line(
    monkeypatch: pytest.MonkeyPatch, cause: str, error: type[Exception]
) -> None:
    """The pipeline's start (jobs/wiring/pipeline.py) connects to every PostgreSQL output: a
    refused password or a server that does not answer is one line, exit code 2 (an
    ExactlyError), never the URL's password."""
    spec = make_spec({"env": "DASHBOARD_URL"}, "views")
    target = pg_target.PostgresTarget(
        spec, "/tables/raw", {"DASHBOARD_URL": "postgresql://exactly:s3cret@db.invalid/x"}
    )

    def fails(engine: Engine, spec: PostgresOutput, schema: Any = None) -> None:
        raise UnreachableError(f"{pg_connection._where(engine, spec)}: connection failed: {cause}")

    monkeypatch.setattr(pg_target, "ensure_tables", fails)
    with pytest.raises(error) as info:
        target.check_reachable()
    message = str(info.value)
    assert "\n" not in message and "s3cret" not in message
    assert message.startswith("postgres output views_dashboard (views at postgresql")
    assert info.value.exit_code == 2  # type: ignore[attr-defined]


# -- one table, two outputs ---------------------------------------------------------------


def two_outputs_config(tmp_path: Path, first: dict[str, Any], second: dict[str, Any]) -> Any:
    """A pipeline whose two PostgreSQL outputs differ by `first` and `second` (its broker
    is never asked: the start check comes before any batch)."""
    from resources.config.loading import parse_config

    output = {"kind": "postgres", "group_by": ["app"], "measures": MEASURES}
    return parse_config(
        {
            "pipeline": "pageviews",
            "kafka": {"bootstrap_servers": "127.0.0.1:9", "topic": "pageviews"},
            "delta": {"table_uri": str(tmp_path / "t"), "quarantine_uri": str(tmp_path / "q")},
            "ledger": {"url": f"sqlite:///{tmp_path}/ledger.db"},
            "derived": [
                {**output, "name": "views_dashboard", **first},
                {**output, "name": "views_report", **second},
            ],
        }
    )


@pytest.mark.parametrize("spelling", ["url query", "schema", "environment"])
def test_two_outputs_on_one_table_under_two_spellings_are_refused_at_the_start(
    postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spelling: str
) -> None:
    """Two outputs on one table would each add every batch (their application ids and state
    rows differ, so neither compare-and-set sees the other's): refused when the pipeline
    starts, whichever way the URLs or the table are spelled, because the server is asked
    where the table is. The config's check compares spellings and lets all three through."""
    from jobs.wiring.pipeline import Pipeline

    table = f"views_{uuid.uuid4().hex[:12]}"
    other_url = f"{postgres_url}?connect_timeout=7"
    first, second = {
        "url query": ({"url": postgres_url, "table": table}, {"url": other_url, "table": table}),
        "schema": (
            {"url": postgres_url, "table": table},
            {"url": other_url, "table": f"public.{table}"},
        ),
        "environment": (
            {"url": {"env": "DASHBOARD_URL"}, "table": table},
            {"url": {"env": "REPORT_URL"}, "table": table},
        ),
    }[spelling]
    monkeypatch.setenv("DASHBOARD_URL", postgres_url)
    monkeypatch.setenv("REPORT_URL", postgres_url)
    config = two_outputs_config(tmp_path, first, second)
    with pytest.raises(ConfigError) as info:
        Pipeline(config)
    message = str(info.value)
    assert message.startswith(f"derived output views_report: table {second['table']} is table")
    assert f"of output views_dashboard on the same server (public.{table}" in message
    assert "\n" not in message and info.value.exit_code == 2
    # two tables of one server start
    apart = two_outputs_config(tmp_path, first, {**second, "table": f"{table}_report"})
    with Pipeline(apart) as pipeline:
        assert len(pipeline.publisher.postgres) == 2
