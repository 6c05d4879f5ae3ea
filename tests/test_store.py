"""LedgerStore on a real SQLite file and a real PostgreSQL database (`ledger_url`)."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from ledger.core.actions import ActionKind
from ledger.core.batch import RESTAGE, Batch, StagedFile
from ledger.core.errors import (
    BusyError,
    ConfigError,
    FencedError,
    InconsistencyError,
    UnreachableError,
)
from ledger.core.protocol import RESTAGE_MOVE, TRANSITIONS, BatchState, OffsetRange, Owner
from ledger.host.process import this_owner
from ledger.store.ledger_store import LedgerStore
from ledger.store.schema import SCHEMA_VERSION, batches_table, files_table, meta_table, ranges_table
from resources.jvm.process import free_port

S = BatchState
APP = "pageviews"
TOPIC = "pageviews"
RangesFor = Callable[[Mapping[int, int]], list[OffsetRange] | None]


def step(size: int = 10, partitions: tuple[int, ...] = (0, 1)) -> RangesFor:
    """`ranges_for` that reads `size` more offsets of each partition from where it stopped."""

    def ranges_for(positions: Mapping[int, int]) -> list[OffsetRange]:
        return [
            OffsetRange(TOPIC, p, positions.get(p, 0), positions.get(p, 0) + size)
            for p in partitions
        ]

    return ranges_for


def plan(store: LedgerStore, ranges_for: RangesFor | None = None, **kw: Any) -> Batch:
    batch = store.plan(
        pipeline="pv", app_id=APP, kind="live", ranges_for=ranges_for or step(), **kw
    )
    assert batch is not None
    return batch


def staged_file(name: str, target: str = "table", records: int = 3) -> StagedFile:
    return StagedFile(target, f"batch=1/{name}.parquet", 1234, records, 1_700_000_000_000, "{}")


def walk_to(store: LedgerStore, batch: Batch, target: BatchState) -> Batch:
    """Move a PLANNED batch forward along the happy path until it reaches `target`."""
    path = [S.STAGED, S.PREPARED, S.COMMITTED, S.ACKED]
    for state in path[: path.index(target) + 1] if target in path else []:
        files = [staged_file("a")] if state is S.PREPARED else ()
        batch = store.transition(batch, state, files=files, table_version=7)
    assert batch.state is target
    return batch


@pytest.fixture
def store(ledger_url: str) -> Iterator[LedgerStore]:
    ledger = LedgerStore(ledger_url)
    try:
        yield ledger
    finally:
        ledger.dispose()


# -- schema -------------------------------------------------------------------------------


def test_schema_created_with_current_version(store: LedgerStore) -> None:
    assert store.schema_version() == SCHEMA_VERSION
    names = set(sa.inspect(store.engine).get_table_names())
    assert {"exactly_meta", "exactly_batches", "exactly_ranges", "exactly_files"} <= names
    # opening it again changes nothing
    again = LedgerStore(store.url)
    try:
        assert again.schema_version() == SCHEMA_VERSION
        with again.engine.connect() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(meta_table)).scalar() == 1
    finally:
        again.dispose()


def test_newer_schema_version_is_refused(store: LedgerStore) -> None:
    with store.engine.begin() as conn:
        conn.execute(
            meta_table.update()
            .where(meta_table.c.key == "schema_version")
            .values(value=str(SCHEMA_VERSION + 1))
        )
    with pytest.raises(ConfigError) as info:
        LedgerStore(store.url)
    assert f"schema version {SCHEMA_VERSION + 1}" in str(info.value)
    assert f"({SCHEMA_VERSION})" in str(info.value)


# -- plan ---------------------------------------------------------------------------------


def test_plan_records_planned_batch(store: LedgerStore) -> None:
    owner = Owner("host-x", 99)
    batch = plan(store, owner=owner, params={"note": "x"})
    assert batch.batch_id == 1
    assert batch.state is S.PLANNED
    assert batch.attempt == 1
    assert batch.owner == owner
    assert batch.params == {"note": "x"}
    assert batch.ranges == (OffsetRange(TOPIC, 0, 0, 10), OffsetRange(TOPIC, 1, 0, 10))
    assert batch.created_at.tzinfo is not None
    assert batch.heartbeat_at.tzinfo is not None
    assert store.get(APP, 1) == batch
    assert store.get(APP, 2) is None


def test_plan_assigns_monotonic_ids_and_contiguous_ranges(store: LedgerStore) -> None:
    seen = []
    for i in range(4):
        batch = plan(store, step(5 + i))
        seen.append(batch)
        # an aborted batch still consumes its id, but not its range
        if i == 1:
            store.transition(batch, S.ABORTED, error="test")
        else:
            walk_to(store, batch, S.ACKED)
    assert [b.batch_id for b in seen] == [1, 2, 3, 4]
    assert [b.ranges[0] for b in seen] == [
        OffsetRange(TOPIC, 0, 0, 5),
        OffsetRange(TOPIC, 0, 5, 11),  # aborted
        OffsetRange(TOPIC, 0, 5, 12),  # re-planned from the same start
        OffsetRange(TOPIC, 0, 12, 20),
    ]
    assert store.positions(APP) == {0: 20, 1: 20}


def test_plan_named_batch_id_and_per_app_ids(store: LedgerStore) -> None:
    first = plan(store, batch_id=40)
    assert first.batch_id == 40
    other = store.plan(pipeline="pv", app_id="backfill", kind="backfill", ranges_for=step())
    assert other is not None
    assert other.batch_id == 1
    assert other.ranges[0].start == 0
    walk_to(store, first, S.ACKED)
    with pytest.raises(InconsistencyError, match="already at batch 40"):
        plan(store, batch_id=40)
    assert store.batches(app_id=APP, states=[S.PLANNED]) == []
    assert plan(store).batch_id == 41


def test_plan_refuses_contiguity_violation(store: LedgerStore) -> None:
    walk_to(store, plan(store), S.ACKED)

    def overlapping(positions: Mapping[int, int]) -> list[OffsetRange]:
        return [OffsetRange(TOPIC, 0, positions[0] - 1, positions[0] + 5)]

    with pytest.raises(InconsistencyError, match="overlaps"):
        plan(store, overlapping)
    assert [b.batch_id for b in store.batches(app_id=APP)] == [1]


@pytest.mark.parametrize("state", [S.PLANNED, S.STAGED, S.PREPARED])
def test_plan_refuses_while_a_batch_is_in_flight(store: LedgerStore, state: BatchState) -> None:
    walk_to(store, plan(store), state)
    with pytest.raises(BusyError) as info:
        plan(store)
    assert f"batch 1 is still {state}" in str(info.value)
    assert len(store.batches(app_id=APP)) == 1


def test_a_committed_batch_waiting_for_its_ack_does_not_block_the_next(store: LedgerStore) -> None:
    """The ack is advisory: a COMMITTED batch is published and complete (BLOCKS_PLANNING)."""
    first = walk_to(store, plan(store), S.COMMITTED)
    second = plan(store)
    assert second.batch_id == 2
    assert [r.start for r in second.ranges] == [r.end for r in first.ranges]


def test_plan_with_nothing_to_do_records_nothing(store: LedgerStore) -> None:
    calls: list[dict[int, int]] = []

    def nothing(positions: Mapping[int, int]) -> None:
        calls.append(dict(positions))
        return None

    assert store.plan(pipeline="pv", app_id=APP, kind="live", ranges_for=nothing) is None
    assert calls == [{}]
    assert store.batches() == []
    with store.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(ranges_table)).scalar() == 0
    assert plan(store).batch_id == 1


# -- transitions --------------------------------------------------------------------------


def test_full_walk(store: LedgerStore) -> None:
    batch = plan(store)
    batch = store.transition(batch, S.STAGED, metrics={"records_read": 20})
    assert batch.state is S.STAGED
    assert batch.metrics == {"records_read": 20}
    assert store.files(APP, 1) == []

    files = [staged_file("b"), staged_file("a"), staged_file("q", target="quarantine")]
    batch = store.transition(batch, S.PREPARED, files=files, schemas={"table": "s1"})
    assert batch.state is S.PREPARED
    assert batch.prepared_at is not None
    assert batch.schemas == {"table": "s1"}
    assert store.files(APP, 1) == sorted(files, key=lambda f: (f.target, f.path))

    batch = store.transition(batch, S.COMMITTED, table_version=12)
    assert batch.state is S.COMMITTED
    assert batch.table_version == 12
    assert batch.committed_at is not None

    batch = store.transition(batch, S.ACKED, metrics={"acked": True})
    assert batch.state is S.ACKED
    assert batch.metrics == {"records_read": 20, "acked": True}
    assert batch.attempt == 1
    assert store.get(APP, 1) == batch
    assert len(store.files(APP, 1)) == 3


def test_illegal_transition_is_refused_before_touching_the_db(store: LedgerStore) -> None:
    batch = walk_to(store, plan(store), S.PREPARED)
    with pytest.raises(InconsistencyError, match="PREPARED -> ABORTED"):
        store.transition(batch, S.ABORTED)
    assert store.get(APP, 1).state is S.PREPARED  # type: ignore[union-attr]


def test_files_only_with_the_prepare_vote(store: LedgerStore) -> None:
    batch = plan(store)
    with pytest.raises(ValueError, match="only by the prepare vote"):
        store.transition(batch, S.STAGED, files=[staged_file("a")])
    current = store.get(APP, 1)
    assert current is not None
    assert current.state is S.PLANNED  # the state change was rolled back with the files
    assert store.files(APP, 1) == []


def test_a_vote_records_a_derived_output_s_files_under_its_long_target(
    store: LedgerStore,
) -> None:
    """A derived output votes as `derived:<name>`, its name up to 128 characters
    (resources/config/derived_spec.py): the vote's target column must hold it on every database,
    not only on SQLite, which ignores declared lengths."""
    target = "derived:" + "views_per_app_and_minute".ljust(128, "x")
    batch = walk_to(store, plan(store), S.STAGED)
    files = [staged_file("a"), staged_file("p", target=target)]
    store.transition(batch, S.PREPARED, files=files, schemas={"table": "{}", target: "{}"})
    assert sorted(f.target for f in store.files(APP, 1)) == sorted(["table", target])


def test_failed_vote_leaves_no_vote(store: LedgerStore) -> None:
    batch = walk_to(store, plan(store), S.STAGED)
    duplicate = [staged_file("a"), staged_file("b"), staged_file("a")]
    with pytest.raises(IntegrityError):
        store.transition(batch, S.PREPARED, files=duplicate)
    current = store.get(APP, 1)
    assert current is not None
    assert current.state is S.STAGED
    assert current.prepared_at is None
    assert store.files(APP, 1) == []
    # the same attempt can vote again, correctly
    voted = store.transition(batch, S.PREPARED, files=duplicate[:2])
    assert voted.state is S.PREPARED
    assert [f.path for f in store.files(APP, 1)] == ["batch=1/a.parquet", "batch=1/b.parquet"]


# -- fencing ------------------------------------------------------------------------------


@pytest.mark.parametrize("state", [S.PLANNED, S.STAGED, S.PREPARED, S.COMMITTED])
def test_stale_token_is_fenced_everywhere(store: LedgerStore, state: BatchState) -> None:
    stale = walk_to(store, plan(store), state)
    fresh = store.takeover(stale, Owner("rescuer", 4242))
    assert fresh.attempt == 2
    assert fresh.token != stale.token
    assert fresh.state is state
    assert fresh.owner == Owner("rescuer", 4242)

    for target in sorted(TRANSITIONS[state]):
        files = [staged_file("zombie")] if target is S.PREPARED else ()
        with pytest.raises(FencedError) as info:
            if (state, target) == RESTAGE_MOVE:  # the move back has a method of its own
                store.restage(stale, reason="zombie", metrics={RESTAGE: {"count": 1}})
            else:
                store.transition(stale, target, files=files, table_version=1)
        message = str(info.value)
        assert f"{stale.label} was fenced moving {state} -> {target}" in message
        assert f"it is {state} at attempt 2 (owner rescuer:4242)" in message
    with pytest.raises(FencedError):
        store.heartbeat(stale)
    with pytest.raises(FencedError):
        store.record_metrics(stale, {"zombie": 1})
    with pytest.raises(FencedError):
        store.takeover(stale)

    current = store.get(APP, 1)
    assert current is not None
    assert (current.state, current.attempt, current.token) == (state, 2, fresh.token)
    assert "zombie" not in current.metrics
    assert all("zombie" not in f.path for f in store.files(APP, 1))
    # the new attempt still works
    store.heartbeat(fresh)
    target = sorted(TRANSITIONS[state])[0]
    files = [staged_file("real")] if target is S.PREPARED else ()
    assert store.transition(fresh, target, files=files).state is target


def test_fenced_message_names_state_moved_by_another(store: LedgerStore) -> None:
    stale = plan(store)
    store.transition(stale, S.ABORTED, error="abandoned")
    with pytest.raises(FencedError, match="it is ABORTED at attempt 1"):
        store.transition(stale, S.STAGED)


def test_fenced_heartbeat_names_current_state_and_attempt(store: LedgerStore) -> None:
    stale = walk_to(store, plan(store), S.STAGED)
    store.takeover(stale, Owner("rescuer", 4242))
    with pytest.raises(FencedError) as info:
        store.heartbeat(stale)
    assert "STAGED" in str(info.value)
    assert "attempt 2" in str(info.value)


def race(*calls: Callable[[], object]) -> list[object]:
    """Run the calls in threads released at the same instant; their results or errors."""
    barrier = threading.Barrier(len(calls))
    outcomes: list[object] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait(timeout=30)
        try:
            outcomes[i] = calls[i]()
        except Exception as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return outcomes


def test_racing_cas_exactly_one_wins(store: LedgerStore, second_store: LedgerStore) -> None:
    for i in range(4):
        batch = plan(store)
        # the same transition from two clients, or stage vs abort (a zombie vs recovery)
        other = S.STAGED if i % 2 == 0 else S.ABORTED
        outcomes = race(
            lambda b=batch: store.transition(b, S.STAGED),
            lambda b=batch, t=other: second_store.transition(b, t),
        )
        winners = [o for o in outcomes if isinstance(o, Batch)]
        losers = [o for o in outcomes if isinstance(o, FencedError)]
        assert len(winners) == 1, outcomes
        assert len(losers) == 1, outcomes
        assert f"it is {winners[0].state} at attempt 1" in str(losers[0])
        current = store.get(APP, batch.batch_id)
        assert current is not None
        assert current.state is winners[0].state
        if current.state is not S.ABORTED:
            store.transition(current, S.ABORTED, error="next round")
    assert [b.batch_id for b in store.batches(app_id=APP)] == [4, 3, 2, 1]


def test_concurrent_plans_create_exactly_one_batch(
    store: LedgerStore, second_store: LedgerStore
) -> None:
    def slow(positions: Mapping[int, int]) -> list[OffsetRange]:
        time.sleep(0.2)  # keep both transactions open at once where the database allows it
        return step()(positions)

    outcomes = race(
        lambda: store.plan(pipeline="pv", app_id=APP, kind="live", ranges_for=slow),
        lambda: second_store.plan(pipeline="pv", app_id=APP, kind="live", ranges_for=slow),
    )
    created = [o for o in outcomes if isinstance(o, Batch)]
    busy = [o for o in outcomes if isinstance(o, BusyError)]
    assert len(created) == 1, outcomes
    assert len(busy) == 1, outcomes
    assert [(b.batch_id, b.state) for b in store.batches(app_id=APP)] == [(1, S.PLANNED)]


def test_plan_racing_a_commit_of_another_plan(
    request: pytest.FixtureRequest, store: LedgerStore, second_store: LedgerStore
) -> None:
    """A planner whose transaction reads the ledger across another planner's commit.

    Interleaving forced: B checks for in-flight batches and reads positions, then A plans and
    commits batch 1, then B reads the last batch id. B must not create a second in-flight
    batch that re-reads A's range.
    """
    a_outcome: list[object] = []

    def plan_a() -> None:
        try:
            a_outcome.append(plan(store))
        except Exception as exc:
            a_outcome.append(exc)

    thread = threading.Thread(target=plan_a)
    fired: list[bool] = []

    def before_execute(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        text = statement.lower()
        if not fired and "max(" in text and "state" not in text:
            fired.append(True)
            thread.start()
            # PostgreSQL lets A finish now; SQLite holds A at BEGIN IMMEDIATE until B is done
            thread.join(timeout=1.5)

    sa.event.listen(second_store.engine, "before_cursor_execute", before_execute)
    b_outcome: object
    try:
        b_outcome = plan(second_store)
    except Exception as exc:
        b_outcome = exc
    finally:
        sa.event.remove(second_store.engine, "before_cursor_execute", before_execute)
        thread.join(timeout=60)
    assert fired == [True]
    outcomes = [*a_outcome, b_outcome]
    created = [o for o in outcomes if isinstance(o, Batch)]
    assert len(created) == 1, outcomes
    assert isinstance(next(o for o in outcomes if not isinstance(o, Batch)), BusyError)
    in_flight = store.batches(app_id=APP, states=[S.PLANNED])
    assert [b.batch_id for b in in_flight] == [1]


# -- reads and rebuilds -------------------------------------------------------------------


def test_positions_are_ends_of_newest_non_aborted_batch(store: LedgerStore) -> None:
    assert store.positions(APP) == {}
    walk_to(store, plan(store, step(10)), S.ACKED)
    assert store.positions(APP) == {0: 10, 1: 10}
    b2 = plan(store, step(5))
    assert store.positions(APP) == {0: 15, 1: 15}  # an in-flight batch holds its range
    store.transition(b2, S.ABORTED, error="gone")
    assert store.positions(APP) == {0: 10, 1: 10}
    b3 = plan(store, step(7, partitions=(0, 1, 2)))
    assert b3.batch_id == 3
    walk_to(store, b3, S.COMMITTED)
    assert store.positions(APP) == {0: 17, 1: 17, 2: 7}
    assert store.positions("other-app") == {}


def test_batches_filters_newest_first(store: LedgerStore) -> None:
    walk_to(store, plan(store), S.ACKED)
    store.transition(plan(store), S.ABORTED, error="x")
    plan(store)
    assert [b.batch_id for b in store.batches(app_id=APP)] == [3, 2, 1]
    assert [b.batch_id for b in store.batches(states=[S.ABORTED, S.ACKED])] == [2, 1]
    assert [b.batch_id for b in store.batches(pipeline="pv", limit=1)] == [3]
    assert store.batches(pipeline="nope") == []
    assert store.get(APP, 2).error == "x"  # type: ignore[union-attr]


def test_insert_committed_is_idempotent(store: LedgerStore) -> None:
    ranges = [OffsetRange(TOPIC, 0, 0, 30), OffsetRange(TOPIC, 1, 0, 25)]
    at = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    kwargs: dict[str, Any] = {
        "pipeline": "pv",
        "app_id": APP,
        "kind": "live",
        "batch_id": 5,
        "ranges": ranges,
        "table_version": 9,
        "committed_at": at,
        "params": {"k": "v"},
    }
    assert store.insert_committed(**kwargs) is True
    assert store.insert_committed(**kwargs) is False
    assert store.insert_committed(**{**kwargs, "ranges": [OffsetRange(TOPIC, 0, 0, 1)]}) is False
    [batch] = store.batches(app_id=APP)
    assert batch.batch_id == 5
    assert batch.state is S.COMMITTED
    assert batch.table_version == 9
    assert batch.committed_at == at
    assert batch.params == {"k": "v", "rebuilt_from_delta_log": True}
    assert batch.ranges == tuple(ranges)
    assert store.positions(APP) == {0: 30, 1: 25}
    # recovery can finish it, and the next plan continues after it
    store.transition(batch, S.ACKED)
    nxt = plan(store)
    assert nxt.batch_id == 6
    assert nxt.ranges[0] == OffsetRange(TOPIC, 0, 30, 40)


def test_tables_hold_only_what_was_written(store: LedgerStore) -> None:
    walk_to(store, plan(store), S.ACKED)
    with store.engine.connect() as conn:
        counts = [
            conn.execute(sa.select(sa.func.count()).select_from(t)).scalar()
            for t in (batches_table, ranges_table, files_table)
        ]
    assert counts == [1, 2, 1]


# -- connection errors --------------------------------------------------------------------


def test_unreachable_postgres_fails_fast() -> None:
    port = free_port()  # nothing listens there
    started = time.monotonic()
    with pytest.raises(UnreachableError) as info:
        LedgerStore(f"postgresql://exactly:secret@127.0.0.1:{port}/ledger")
    assert time.monotonic() - started < 5
    message = str(info.value)
    assert f"127.0.0.1:{port}" in message
    assert "secret" not in message


READS: dict[str, Callable[[LedgerStore, Batch], object]] = {
    "get": lambda store, batch: store.get(APP, batch.batch_id),
    "batches": lambda store, _batch: store.batches(app_id=APP),
    "files": lambda store, batch: store.files(APP, batch.batch_id),
    "positions": lambda store, _batch: store.positions(APP),
    "schema_version": lambda store, _batch: store.schema_version(),
    "require_current": lambda store, batch: store.require_current(batch),
}


@pytest.mark.parametrize("read", sorted(READS))
def test_every_read_of_a_lost_ledger_names_it(tmp_path: Path, read: str) -> None:
    """A ledger that goes away after opening fails every read with the same one line."""
    folder = tmp_path / "ledger"
    store = LedgerStore(f"sqlite:///{folder}/ledger.db")
    batch = plan(store)
    store.dispose()  # no pooled connection keeps the old file open
    shutil.rmtree(folder)  # the disk it was on is gone: SQLite cannot open it again
    with pytest.raises(UnreachableError) as info:
        READS[read](store, batch)
    assert str(info.value).startswith(f"ledger database sqlite:///{folder}/ledger.db: ")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("not a url", "is not a database URL"),
        ("", "is not a database URL"),
        ("nosuchdb://host/db", "unsupported database"),
    ],
)
def test_malformed_url_is_config_error(url: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        LedgerStore(url)
    assert "ledger.url" in str(info.value)
    assert expected in str(info.value)


def test_malformed_url_error_hides_password() -> None:
    with pytest.raises(ConfigError) as info:
        LedgerStore("postgresql://exactly:s3cret@db.example:port/ledger")
    assert "s3cret" not in str(info.value)


def test_this_owner_is_this_process() -> None:
    owner = this_owner()
    assert (owner.host, owner.pid) == (socket.gethostname(), os.getpid())


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="Linux's /proc only")
def test_this_owner_records_when_and_in_which_boot_this_process_started() -> None:
    """So that a process that later gets this pid is not taken for this one."""
    stat = Path(f"/proc/{os.getpid()}/stat").read_text().rpartition(") ")[2].split()
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    owner = this_owner()
    assert (owner.started, owner.boot) == (int(stat[19]), boot)
    assert Owner.parse(str(owner)) == owner
    assert len(str(owner)) <= batches_table.c.owner.type.length


def test_an_owner_is_stored_with_its_start_time(store: LedgerStore) -> None:
    owner = Owner("host-x", 99, started=123456, boot="6f1c0f0e-0000-4000-8000-000000000001")
    batch = plan(store, owner=owner)
    assert batch.owner == owner
    assert store.get(batch.app_id, batch.batch_id).owner == owner  # type: ignore[union-attr]


def test_voted_paths_names_every_voted_file_of_the_given_apps(store: LedgerStore) -> None:
    """What the cleaner must never delete (invariant 18): every path a vote recorded,
    whatever the batch's state now, only for the application ids asked about."""
    acked = walk_to(store, plan(store), S.ACKED)
    voted = store.transition(
        store.transition(plan(store), S.STAGED),
        S.PREPARED,
        files=[staged_file("b"), staged_file("c", target="quarantine")],
    )
    other = store.plan(pipeline="pv", app_id="other", kind="live", ranges_for=step())
    assert other is not None
    store.transition(other, S.ABORTED, error="test")
    # staged_file names every file "batch=1/<name>": batch 1's is a, batch 2's are b and c
    assert store.voted_paths([APP]) == {
        ("table", "batch=1/a.parquet"),
        ("table", "batch=1/b.parquet"),
        ("quarantine", "batch=1/c.parquet"),
    }
    assert store.voted_paths(["other"]) == set()
    assert store.voted_paths([APP], among=["batch=1/c.parquet", "nope"]) == {
        ("quarantine", "batch=1/c.parquet")
    }
    assert store.voted_paths([APP], among=[]) == set()
    assert acked.state is S.ACKED and voted.state is S.PREPARED


# -- re-staging a vote whose files vanished (invariant 11) ---------------------------------


def test_restage_fences_the_vote_drops_its_files_and_keeps_the_range(store: LedgerStore) -> None:
    voted = walk_to(store, plan(store), S.PREPARED)
    assert [f.path for f in store.files(APP, 1)] == ["batch=1/a.parquet"]
    why = {RESTAGE: {"count": 1, "missing": ["table/batch=1/a.parquet"]}, "files_missing": 1}
    again = store.restage(voted, reason="table/batch=1/a.parquet is gone", metrics=why)
    assert (again.state, again.attempt, again.batch_id) == (S.PLANNED, 2, 1)
    assert again.token != voted.token and again.ranges == voted.ranges
    assert again.error == "table/batch=1/a.parquet is gone"
    assert again.metrics[RESTAGE]["missing"] == ["table/batch=1/a.parquet"]
    assert again.voted_once
    assert store.files(APP, 1) == []  # the old vote's rows went in the same transaction
    assert store.positions(APP) == {0: 10, 1: 10}  # still holds its range
    # the old attempt is fenced: it can neither commit nor re-stage
    with pytest.raises(FencedError, match="it is PLANNED at attempt 2"):
        store.transition(voted, S.COMMITTED, table_version=1)
    with pytest.raises(FencedError, match="fenced moving PREPARED -> PLANNED"):
        store.restage(voted, reason="again", metrics=why)
    # a batch that voted once is never abandoned (invariant 5), even while PLANNED
    with pytest.raises(InconsistencyError, match="cannot be abandoned"):
        store.transition(again, S.ABORTED, error="owner gone")
    # and it votes again with new files
    staged = store.transition(again, S.STAGED)
    prepared = store.transition(staged, S.PREPARED, files=[staged_file("b")])
    assert [f.path for f in store.files(APP, 1)] == ["batch=1/b.parquet"]
    assert prepared.voted_once


def test_only_restage_moves_a_vote_back(store: LedgerStore) -> None:
    voted = walk_to(store, plan(store), S.PREPARED)
    with pytest.raises(InconsistencyError, match="needs a reason"):
        store.transition(voted, S.PLANNED)
    with pytest.raises(InconsistencyError, match=r"only through LedgerStore\.restage"):
        store.transition(voted, S.PLANNED, error="gone")
    with pytest.raises(InconsistencyError, match="needs a reason"):
        store.restage(voted, reason="", metrics={RESTAGE: {}})
    current = store.get(APP, 1)
    assert current is not None and (current.state, current.attempt) == (S.PREPARED, 1)
    assert len(store.files(APP, 1)) == 1


def test_insert_unfinished_recreates_a_batch_to_finish(store: LedgerStore) -> None:
    ranges = [OffsetRange(TOPIC, 0, 5, 9)]
    marker = {RESTAGE: {"count": 0, "outputs_holding": ["quarantine"]}}
    args: dict[str, Any] = {
        "pipeline": "pv",
        "app_id": APP,
        "kind": "live",
        "batch_id": 4,
        "ranges": ranges,
        "params": {"mode": "replace"},
        "reason": "quarantine holds it",
        "metrics": marker,
    }
    assert store.insert_unfinished(**args) is True
    assert store.insert_unfinished(**args) is False
    batch = store.get(APP, 4)
    assert batch is not None
    assert (batch.state, batch.ranges, batch.error) == (S.PLANNED, tuple(ranges), args["reason"])
    assert batch.voted_once and batch.params["rebuilt_from_delta_log"]
    assert batch.params["mode"] == "replace"
    assert store.positions(APP) == {0: 9}


def test_operator_actions_are_journaled_per_pipeline_oldest_first(store: LedgerStore) -> None:
    """Who asked for a recovery or a rebuild, why, when (the database's clock, invariant 17)
    and what came of it; each pipeline reads its own."""
    first = store.record_action(
        pipeline="p",
        kind=ActionKind.RECOVER,
        subject="",
        decided_by="oncall",
        reason="after the outage",
        outcome="nothing to recover",
    )
    store.record_action(
        pipeline="q",
        kind=ActionKind.RECOVER,
        subject="",
        decided_by="x",
        reason="",
        outcome="nothing to recover",
    )
    second = store.record_action(
        pipeline="p",
        kind=ActionKind.REBUILD,
        subject="views_per_app",
        decided_by="oncall",
        reason="added",
        outcome="rebuilt derived output views_per_app: 3 rows at version 0",
    )
    assert store.actions("p") == [first, second]
    assert first.decided_at <= second.decided_at <= store.now()
    assert second.text() == (
        "rebuild views_per_app by oncall (added): rebuilt derived output views_per_app: 3 "
        "rows at version 0"
    )
    assert [a.decided_by for a in store.actions("q")] == ["x"]
