"""Planning a backfill (ledger/core/backfill.py) against the real ledger, SQLite and PostgreSQL
(`ledger_url`), with the in-memory Kafka, Spark and Delta of tests/test_two_phase.py.

What a backfill may take is decided from the ledger; these tests check the decision against
batches that have not committed yet, and against planners racing it (another fill, a live
plan) at every statement of its planning.
"""

from __future__ import annotations

import itertools
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import sqlalchemy as sa

from ledger.coordinator.backfill import plan_backfill
from ledger.coordinator.two_phase import TwoPhaseCommit
from ledger.core.backfill import BackfillError, BackfillMode, backfill_app_id
from ledger.core.batch import Batch, BatchKind
from ledger.core.errors import ExactlyError
from ledger.core.protocol import Available, BatchState, OffsetRange, Owner
from ledger.store.ledger_store import LedgerStore
from resources.config.derived_spec import parse_output, replace_refusal
from tests.fixtures.fakes import FakeSource, wired

S = BatchState
PIPELINE = "pageviews"
TOPIC = "pageviews"
TRANSFORM = "tests.transforms:pageviews_v2"


@pytest.fixture
def store(ledger_url: str) -> Iterator[LedgerStore]:
    ledger = LedgerStore(ledger_url)
    try:
        yield ledger
    finally:
        ledger.dispose()


def live(
    store: LedgerStore,
    source: FakeSource,
    pipeline: str = PIPELINE,
    same_as: TwoPhaseCommit | None = None,
    **kw: Any,
) -> TwoPhaseCommit:
    """The live pipeline's coordinator: application id = the pipeline's name; staging to
    and publishing into the storage and tables of `same_as` (another process of the same
    pipeline), or new ones."""
    kw.setdefault("max_records_per_partition", 10)
    stager, publisher = wired() if same_as is None else (same_as.stager, same_as.publisher)
    return TwoPhaseCommit(
        store,
        pipeline=pipeline,
        app_id=pipeline,
        source=source,
        stager=stager,
        publisher=publisher,
        **kw,
    )


def backfiller(store: LedgerStore, source: FakeSource, pipeline: str = PIPELINE) -> TwoPhaseCommit:
    """The coordinator of the pipeline's backfills, as jobs/ builds it."""
    stager, publisher = wired()
    return TwoPhaseCommit(
        store,
        pipeline=pipeline,
        app_id=backfill_app_id(pipeline),
        kind=BatchKind.BACKFILL,
        source=source,
        stager=stager,
        publisher=publisher,
        max_records_per_partition=1000,
    )


def request(
    tpc: TwoPhaseCommit, mode: BackfillMode, rng: OffsetRange, pipeline: str = PIPELINE
) -> Batch:
    batch, planned = plan_backfill(
        tpc, live_app_id=pipeline, mode=mode, ranges=[rng], transform=TRANSFORM
    )
    assert planned
    return batch


def walk_to(tpc: TwoPhaseCommit, state: BatchState) -> Batch:
    """Plan the next live batch and drive it to `state`, as a process that stops there."""
    batch = tpc.begin()
    assert batch is not None
    if state is S.PLANNED:
        return batch
    batch, output = tpc.invoke(batch)
    if state is S.STAGED:
        return batch
    batch = tpc.pre_commit(batch, output)
    assert state is S.PREPARED
    return batch


def offsets_taken_twice(store: LedgerStore, pipeline: str) -> list[tuple[str, str, str]]:
    """Pairs of batches of the pipeline that read the same offsets into the table.

    Live batches and fills add rows; replaces only rewrite rows already there. Aborted
    batches add nothing. Any pair found here is a duplicate once both commit (invariant 1).
    """
    adding = [
        b
        for b in store.batches(pipeline=pipeline)
        if b.state is not S.ABORTED
        and not (b.kind == BatchKind.BACKFILL and b.params.get("mode") == "replace")
    ]
    found = []
    for a, b in itertools.combinations(adding, 2):
        for ra in a.ranges:
            for rb in b.ranges:
                same = (ra.topic, ra.partition) == (rb.topic, rb.partition)
                if same and max(ra.start, rb.start) < min(ra.end, rb.end):
                    found.append((f"{a.app_id}/{a.batch_id}", f"{b.app_id}/{b.batch_id}", str(ra)))
    return found


# -- a replace touches committed offsets only ---------------------------------------------


@pytest.fixture
def source() -> FakeSource:
    return FakeSource({0: Available(0, 25), 1: Available(5, 12)})


@pytest.mark.parametrize("state", [S.PLANNED, S.STAGED, S.PREPARED])
def test_replace_over_a_live_batch_that_has_not_committed_is_refused(
    store: LedgerStore, source: FakeSource, state: BatchState
) -> None:
    """The rows of a batch that has not committed are not in the table yet: a replace over
    its range would remove nothing there, and the batch would add its rows afterwards, a
    second copy beside the replace's (invariant 1)."""
    pipeline = live(store, source)
    assert pipeline.run_batch() is not None  # batch 1: pageviews-0[0,10), committed
    in_flight = walk_to(pipeline, state)  # batch 2: pageviews-0[10,20), not committed
    assert in_flight.ranges[0] == OffsetRange(TOPIC, 0, 10, 20)

    fills = backfiller(store, source)
    with pytest.raises(BackfillError) as info:
        request(fills, BackfillMode.REPLACE, OffsetRange(TOPIC, 0, 5, 15))
    message = str(info.value)
    assert f"batch {PIPELINE}/2 is {state}" in message
    assert "[10, 15)" in message
    assert "exactly recover" in message
    assert store.batches(app_id=backfill_app_id(PIPELINE)) == []

    # once the live batch has committed (recovery finishes a vote; an abandoned batch is
    # planned again over the same range), the same replace is accepted
    pipeline.recover_and_commit()
    while pipeline.run_batch() is not None:
        pass
    replace = request(fills, BackfillMode.REPLACE, OffsetRange(TOPIC, 0, 5, 15))
    assert replace.ranges == (OffsetRange(TOPIC, 0, 5, 15),)
    assert fills.finish(replace).batch.state is S.ACKED


def test_replace_of_committed_offsets_while_a_live_batch_is_in_flight_elsewhere(
    store: LedgerStore, source: FakeSource
) -> None:
    """The live pipeline keeps running during a replace of what it committed earlier."""
    pipeline = live(store, source)
    assert pipeline.run_batch() is not None
    walk_to(pipeline, S.PREPARED)  # pageviews-0[10,20)
    fills = backfiller(store, source)
    replace = request(fills, BackfillMode.REPLACE, OffsetRange(TOPIC, 0, 0, 10))
    assert fills.finish(replace).batch.state is S.ACKED
    pipeline.recover_and_commit()
    assert offsets_taken_twice(store, PIPELINE) == []


def derived_specs(*, lossy: bool) -> list[Any]:
    """A count+sum aggregate and an upsert (a replace keeps both right), and with `lossy`
    an aggregate with a min, which a replace cannot correct."""
    specs = [
        {
            "kind": "aggregate",
            "name": "views_per_app",
            "table_uri": "/nowhere/views_per_app",
            "group_by": ["app"],
            "measures": [
                {"name": "views", "fn": "count"},
                {"name": "n", "fn": "sum", "column": "n"},
            ],
        },
        {"kind": "upsert", "name": "users", "table_uri": "/nowhere/users", "key": ["user"]},
    ]
    if lossy:
        specs.append(
            {
                "kind": "aggregate",
                "name": "first_views",
                "table_uri": "/nowhere/first_views",
                "group_by": ["app"],
                "measures": [
                    {"name": "views", "fn": "count"},
                    {"name": "first", "fn": "min", "column": "_kafka_offset"},
                ],
            }
        )
    return [parse_output(s) for s in specs]


def test_a_replace_is_refused_only_for_an_output_it_cannot_keep_right(
    store: LedgerStore, source: FakeSource
) -> None:
    """A replace is refused when some derived output cannot follow it
    (resources/config/derived_spec.py
    `replace_refusal`: min/max, no count, PostgreSQL), and the error is that output's reason,
    one line. Counts, sums and upserts follow a replace (jobs/publish/delta_publisher.py), so a
    pipeline with only those is replaced as one without derived outputs. A fill is a batch
    like a live one and is planned as usual."""
    pipeline = live(store, source)
    assert pipeline.run_batch() is not None  # pageviews-0[0,10), pageviews-1[5,12)
    fills = backfiller(store, source)
    lossy = derived_specs(lossy=True)
    with pytest.raises(BackfillError) as info:
        plan_backfill(
            fills,
            live_app_id=PIPELINE,
            mode=BackfillMode.REPLACE,
            ranges=[OffsetRange(TOPIC, 0, 0, 10)],
            transform=TRANSFORM,
            replace_refusals=refusals(lossy),
        )
    message = str(info.value)
    reason = replace_refusal(lossy[2])
    assert reason is not None and message == reason
    assert "first_views" in message and "min and max cannot be subtracted" in message
    assert "views_per_app" not in message and "users" not in message
    assert store.batches(app_id=backfill_app_id(PIPELINE)) == []
    # the same replace with outputs it can keep right is accepted
    replace, planned = plan_backfill(
        fills,
        live_app_id=PIPELINE,
        mode=BackfillMode.REPLACE,
        ranges=[OffsetRange(TOPIC, 0, 0, 10)],
        transform=TRANSFORM,
        replace_refusals=refusals(derived_specs(lossy=False)),
    )
    assert planned and fills.finish(replace).batch.state is S.ACKED

    source.offsets = {0: Available(0, 25), 1: Available(0, 12)}  # older records appear
    fill, planned = plan_backfill(
        fills,
        live_app_id=PIPELINE,
        mode=BackfillMode.FILL,
        ranges=[OffsetRange(TOPIC, 1, 0, 5)],
        transform=TRANSFORM,
        replace_refusals=refusals(lossy),
    )
    assert planned and fills.finish(fill).batch.state is S.ACKED


def refusals(specs: list) -> list[str]:
    """What `PipelineConfig.replace_refusals` gives for a pipeline with these outputs."""
    return [reason for spec in specs if (reason := replace_refusal(spec)) is not None]


def test_two_replaces_of_overlapping_ranges_are_never_in_flight_together(
    store: LedgerStore, source: FakeSource
) -> None:
    """A replace's derived corrections read the old rows in its ranges from the raw table
    before its own raw-table commit (docs/derived-tables.md#replace-correction): only that
    commit may change them. A second replace over the same offsets, requested while the
    first has voted, finishes the first before it is planned (or is refused), never beside
    it: backfills share one app id, one batch in flight."""
    pipeline = live(store, source)
    assert pipeline.run_batch() is not None  # pageviews-0[0,10), pageviews-1[5,12)
    fills = backfiller(store, source)
    first = request(fills, BackfillMode.REPLACE, OffsetRange(TOPIC, 0, 0, 10))
    first, output = fills.invoke(first)
    first = fills.pre_commit(first, output)
    assert first.state is S.PREPARED
    other = backfiller(store, source)
    try:
        second, planned = plan_backfill(
            other,
            live_app_id=PIPELINE,
            mode=BackfillMode.REPLACE,
            ranges=[OffsetRange(TOPIC, 0, 5, 10)],
            transform=TRANSFORM,
        )
    except ExactlyError:
        return  # refused while the first is in flight: also safe
    assert planned and second.batch_id == first.batch_id + 1
    done = store.get(first.app_id, first.batch_id)
    assert done is not None and done.state in (S.COMMITTED, S.ACKED)


def test_fill_over_a_live_batch_in_flight_names_it_and_its_state(store: LedgerStore) -> None:
    source = FakeSource({0: Available(0, 100)})
    pipeline = live(store, source, starting_offsets="latest")
    assert pipeline.run_batch() is not None  # pins partition 0 at offset 100
    source.offsets[0] = Available(0, 130)
    walk_to(pipeline, S.STAGED)  # pageviews-0[100,110)
    with pytest.raises(BackfillError) as info:
        request(backfiller(store, source), BackfillMode.FILL, OffsetRange(TOPIC, 0, 50, 105))
    message = str(info.value)
    assert f"batch {PIPELINE}/2 (STAGED, not committed yet)" in message
    assert "[100, 105)" in message
    assert store.batches(app_id=backfill_app_id(PIPELINE)) == []


# -- racing planners ----------------------------------------------------------------------

#: Statements a planner waits at while another holds the planning lock.
LOCK_WAITS = ("begin immediate", "pg_advisory_xact_lock")


@dataclass
class Competitor:
    """Another planner, run in a thread from inside a statement of the planner under test.

    It is released while the planner under test is about to run statement number `at`,
    and the planner under test goes on once the competitor has finished, or once it has sat
    waiting for the planning lock for a while (the planner under test holds it: the
    competitor can only go on after it).
    """

    engine: sa.Engine
    at: int
    action: Callable[[], object]
    outcome: list[object] = field(default_factory=list)
    fired: bool = False
    seen: int = 0
    waiting_since: float | None = None
    thread: threading.Thread | None = None

    def run(self) -> None:
        try:
            self.outcome.append(self.action())
        except ExactlyError as exc:
            self.outcome.append(exc)

    def before(self, *_args: Any) -> None:
        self.seen += 1
        if self.fired or self.seen <= self.at:
            return
        self.fired = True
        self.thread = threading.Thread(target=self.run)
        self.thread.start()
        deadline = time.monotonic() + 30
        while self.thread.is_alive() and time.monotonic() < deadline:
            since = self.waiting_since
            if since is not None and time.monotonic() - since > 0.3:
                return  # blocked on a lock this planner holds
            time.sleep(0.01)

    def competitor_before(self, _conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if any(w in statement.lower() for w in LOCK_WAITS):
            self.waiting_since = time.monotonic()

    def competitor_after(self, *_args: Any) -> None:
        self.waiting_since = None

    def finish(self) -> object:
        if self.thread is not None:
            self.thread.join(timeout=60)
            assert not self.thread.is_alive(), "the competitor never finished"
        return self.outcome[0] if self.outcome else None


def race_at_every_statement(
    store: LedgerStore,
    second_store: LedgerStore,
    scenario: Callable[[str], tuple[Callable[[], object], Callable[[], object]]],
) -> list[tuple[int, object, object]]:
    """Run `scenario` once per statement of the planner under test, the competitor
    released at that statement; (statement, planner's outcome, competitor's outcome).

    `scenario(pipeline)` sets up a fresh pipeline and returns (planner, competitor): the
    planner runs on `store`, whose statements are counted, the competitor on
    `second_store`. Each round uses a pipeline of its own, so rounds do not interfere.
    """
    rounds = []
    for at in itertools.count():
        planner, action = scenario(f"pv{at}")
        competitor = Competitor(second_store.engine, at, action)
        sa.event.listen(store.engine, "before_cursor_execute", competitor.before)
        sa.event.listen(second_store.engine, "before_cursor_execute", competitor.competitor_before)
        sa.event.listen(second_store.engine, "after_cursor_execute", competitor.competitor_after)
        try:
            try:
                outcome: object = planner()
            except ExactlyError as exc:
                outcome = exc
        finally:
            sa.event.remove(store.engine, "before_cursor_execute", competitor.before)
            sa.event.remove(
                second_store.engine, "before_cursor_execute", competitor.competitor_before
            )
            sa.event.remove(
                second_store.engine, "after_cursor_execute", competitor.competitor_after
            )
        if not competitor.fired:
            competitor.run()  # the planner ran fewer statements: the competitor runs after it
            rounds.append((at, outcome, competitor.finish()))
            return rounds
        rounds.append((at, outcome, competitor.finish()))
        assert at < 200, "the planner never stops issuing statements"
    return rounds


def pinned_live(store: LedgerStore, source: FakeSource, pipeline: str) -> TwoPhaseCommit:
    """A live pipeline that started at `latest`: partition 0 pinned at offset 100."""
    tpc = live(store, source, pipeline, starting_offsets="latest", max_records_per_partition=1000)
    tpc.recover_and_commit()
    first = tpc.run_batch()
    assert first is not None
    assert first.batch.ranges == (OffsetRange(TOPIC, 0, 100, 100),)
    return tpc


def fill_beside_live(
    store: LedgerStore,
    second_store: LedgerStore,
    grown: Mapping[int, Available],
    fill: OffsetRange,
) -> Callable[[str], tuple[Callable[[], object], Callable[[], object]]]:
    """A race scenario: a live pipeline pinned at 100 on partition 0, then Kafka grows to
    `grown`; the planner fills `fill` on `store` while the live pipeline plans its next
    batch on `second_store`."""

    def scenario(pipeline: str) -> tuple[Callable[[], object], Callable[[], object]]:
        source = FakeSource({0: Available(0, 100)})
        first = pinned_live(store, source, pipeline)
        source.offsets.update(grown)
        live_again = live(
            second_store,
            source,
            pipeline,
            same_as=first,
            starting_offsets="latest",
            max_records_per_partition=1000,
        )
        fills = backfiller(store, source, pipeline)
        return (
            lambda: request(fills, BackfillMode.FILL, fill, pipeline),
            live_again.run_batch,
        )

    return scenario


def test_a_fill_and_a_live_plan_never_take_the_same_offsets(
    store: LedgerStore, second_store: LedgerStore
) -> None:
    """The live pipeline reads [100, 130) while a fill of [50, 130) is planned.

    Whichever plans first, the other must see it: the fill's check and its insert are one
    step under the lock every planner of the pipeline takes, live or backfill. The fill is
    refused in every interleaving: first it reaches past the live position (100), after
    the live batch it overlaps it.
    """

    grown = {0: Available(0, 130)}
    fill = OffsetRange(TOPIC, 0, 50, 130)
    rounds = race_at_every_statement(
        store, second_store, fill_beside_live(store, second_store, grown, fill)
    )
    assert len(rounds) > 5
    for at, fill, live_batch in rounds:
        pipeline = f"pv{at}"
        assert offsets_taken_twice(store, pipeline) == [], (at, fill, live_batch)
        assert isinstance(fill, BackfillError), (at, fill)
        assert live_batch is not None and not isinstance(live_batch, Exception), (at, live_batch)


def test_two_fills_never_take_the_same_offsets(
    store: LedgerStore, second_store: LedgerStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fills of [0, 60) and [40, 100) below the live start (100), planned at once: at most
    one of them may hold [40, 60), in every interleaving."""
    # as two processes would: each sees a batch of the other as owned by a live process
    # (here both run in this one, whose batches recovery would take for its own, dead ones)
    monkeypatch.setattr(
        "ledger.coordinator.liveness.this_owner", lambda: Owner(socket.gethostname(), os.getppid())
    )

    def scenario(pipeline: str) -> tuple[Callable[[], object], Callable[[], object]]:
        source = FakeSource({0: Available(0, 100)})
        pinned_live(store, source, pipeline)
        mine = backfiller(store, source, pipeline)
        theirs = backfiller(second_store, source, pipeline)

        def fill_and_commit() -> Batch:
            batch = request(theirs, BackfillMode.FILL, OffsetRange(TOPIC, 0, 0, 60), pipeline)
            return theirs.finish(batch).batch

        return (
            lambda: request(mine, BackfillMode.FILL, OffsetRange(TOPIC, 0, 40, 100), pipeline),
            fill_and_commit,
        )

    rounds = race_at_every_statement(store, second_store, scenario)
    assert len(rounds) > 5
    for at, mine, theirs in rounds:
        pipeline = f"pv{at}"
        assert offsets_taken_twice(store, pipeline) == [], (at, mine, theirs)
        held = [
            b for b in store.batches(app_id=backfill_app_id(pipeline)) if b.state is not S.ABORTED
        ]
        assert len(held) == 1, (at, mine, theirs)


def test_a_fill_racing_the_live_plan_that_reads_an_added_partition(
    store: LedgerStore, second_store: LedgerStore
) -> None:
    """Partition 1 appears while the live pipeline (`starting_offsets: latest`) runs. Its
    records were all produced after the pipeline started, so the live pipeline's next plan
    reads the partition from its first offset (0), not from its last stable offset (80): a
    start there would skip [0, 80) silently. A fill of [0, 80) planned at the same moment is
    refused in every interleaving: before the live plan, the partition has no live position
    yet (the live pipeline reads it on its own); after it, the fill overlaps the live batch.
    Never does one offset land twice."""

    grown = {1: Available(0, 80)}
    fill = OffsetRange(TOPIC, 1, 0, 80)
    rounds = race_at_every_statement(
        store, second_store, fill_beside_live(store, second_store, grown, fill)
    )
    assert len(rounds) > 5
    refusals = set()
    for at, fill, live_batch in rounds:
        assert offsets_taken_twice(store, f"pv{at}") == [], (at, fill, live_batch)
        assert live_batch is not None and not isinstance(live_batch, Exception), (at, live_batch)
        read = live_batch.batch.ranges  # type: ignore[union-attr]
        assert read == (OffsetRange(TOPIC, 0, 100, 100), OffsetRange(TOPIC, 1, 0, 80))
        assert isinstance(fill, BackfillError), (at, fill)
        said = str(fill)
        refusals.add(
            "not read yet"
            if "has not read partition 1 yet" in said
            else "overlaps"
            if ("overlaps committed data" in said and "covers [0, 80) of pageviews-1" in said)
            # the live batch planned, staged or voted, not yet committed: the same overlap,
            # with its state (the live run goes on through its whole batch meanwhile)
            or re.search(
                r"\((PLANNED|STAGED|PREPARED), not committed yet\), which holds \[0, 80\) "
                r"of pageviews-1",
                said,
            )
            else said
        )
    assert refusals == {"not read yet", "overlaps"}, refusals  # both orders happened
