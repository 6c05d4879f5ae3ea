"""ledger/coordinator/two_phase.py on several topics (ledger/coordinator/topics.py), on in-memory
edges:
one batch is one checkpoint over every topic; a topic that newly matches the pattern joins
from its first record; a re-created or vanished topic stops planning naming it; and a
batch is staged, re-staged and recovered over exactly the ranges and ids it was planned on.
"""

from __future__ import annotations

import pytest

from ledger.coordinator.backfill import plan_backfill
from ledger.coordinator.decisions import record_decision
from ledger.coordinator.two_phase import TwoPhaseCommit
from ledger.core.backfill import BackfillError, BackfillMode, backfill_app_id
from ledger.core.batch import Batch, BatchKind
from ledger.core.decisions import DecisionKind, Request
from ledger.core.errors import (
    ConfigError,
    DataLossError,
    DecisionError,
    InconsistencyError,
    TopicChangedError,
)
from ledger.core.protocol import Available, BatchState, OffsetRange
from ledger.store.ledger_store import LedgerStore
from resources.kafka.topic_selection import TopicSelection
from tests.fixtures.fake_topics import FakeTopicsSource, TopicsStager
from tests.fixtures.fakes import FakePublisher

APP = "orders"


@pytest.fixture
def source() -> FakeTopicsSource:
    source = FakeTopicsSource(TopicSelection(pattern="orders-.*"))
    source.create("orders-eu", {0: Available(0, 3), 1: Available(0, 2)})
    source.create("orders-us", {0: Available(0, 4)})
    source.create("refunds", {0: Available(0, 9)})
    return source


@pytest.fixture
def stager() -> TopicsStager:
    return TopicsStager()


@pytest.fixture
def publisher(stager: TopicsStager) -> FakePublisher:
    return FakePublisher(disk=stager.disk)


def coordinator(
    store: LedgerStore,
    source: FakeTopicsSource,
    stager: TopicsStager,
    publisher: FakePublisher,
    app_id: str = APP,
    kind: BatchKind = BatchKind.LIVE,
) -> TwoPhaseCommit:
    """The pipeline's coordinator (or its backfills', by `app_id` and `kind`) on these edges."""
    return TwoPhaseCommit(
        store,
        pipeline=APP,
        app_id=app_id,
        kind=kind,
        source=source,
        stager=stager,
        publisher=publisher,
        max_records_per_partition=100,
    )


@pytest.fixture
def tpc(
    store: LedgerStore, source: FakeTopicsSource, stager: TopicsStager, publisher: FakePublisher
) -> TwoPhaseCommit:
    return coordinator(store, source, stager, publisher)


def test_one_batch_reads_every_matched_topic_with_its_id(
    tpc: TwoPhaseCommit, source: FakeTopicsSource, publisher: FakePublisher
) -> None:
    report = tpc.run_batch()
    assert report is not None
    batch = report.batch
    assert batch.state is BatchState.ACKED
    assert batch.ranges == (
        OffsetRange("orders-eu", 0, 0, 3),
        OffsetRange("orders-eu", 1, 0, 2),
        OffsetRange("orders-us", 0, 0, 4),
    )
    assert batch.topic_ids == {
        "orders-eu": source.topic_id_of("orders-eu"),
        "orders-us": source.topic_id_of("orders-us"),
    }
    assert publisher.commits[0]["topic_ids"] == batch.topic_ids
    assert source.acks == [list(batch.ranges)]
    assert tpc.run_batch() is None  # caught up on every topic


def test_a_topic_created_later_that_matches_joins_from_the_starting_offsets(
    tpc: TwoPhaseCommit, source: FakeTopicsSource
) -> None:
    tpc.run_batch()
    source.create("orders-apac", {0: Available(0, 5)})
    source.topics_now["orders-eu"].offsets[0] = Available(0, 4)
    report = tpc.run_batch()
    assert report is not None
    assert report.batch.ranges == (
        OffsetRange("orders-apac", 0, 0, 5),
        OffsetRange("orders-eu", 0, 3, 4),
        OffsetRange("orders-eu", 1, 2, 2),
        OffsetRange("orders-us", 0, 4, 4),
    )
    assert set(report.batch.topic_ids) == {"orders-apac", "orders-eu", "orders-us"}


def test_a_recreated_topic_stops_planning_naming_it_and_its_skip_command(
    tpc: TwoPhaseCommit, source: FakeTopicsSource, store: LedgerStore
) -> None:
    tpc.run_batch()
    old = source.topic_id_of("orders-us")
    new = source.create("orders-us", {0: Available(0, 1)}).topic_id
    with pytest.raises(TopicChangedError) as info:
        tpc.begin()
    message = str(info.value)
    assert message.startswith("topic orders-us: ")
    assert old in message and new in message
    assert f"exactly skip new-topic -c <config> --topic orders-us --topic-id {new}" in message
    assert store.last_batch_id(APP) == 1
    with pytest.raises(TopicChangedError, match="topic orders-us"):
        tpc.check_topic()


def test_a_deleted_topic_stops_planning_naming_it(
    tpc: TwoPhaseCommit, source: FakeTopicsSource
) -> None:
    tpc.run_batch()
    del source.topics_now["orders-eu"]
    with pytest.raises(
        TopicChangedError, match=r"^topic orders-eu: the ledger holds positions"
    ) as info:
        tpc.begin()
    # the stop names the decision that lets the other topics go on
    assert "exactly skip retire-topic -c <config> --topic orders-eu --reason" in str(info.value)


def retire(tpc: TwoPhaseCommit, store: LedgerStore, topic: str, *, force: bool = False):
    return record_decision(
        tpc,
        Request(DecisionKind.RETIRE_TOPIC, "gone for good", "ops", topic=topic, force=force),
        store.now(),
    )


def test_retiring_a_deleted_topic_lets_the_others_go_on_and_is_carried_once(
    tpc: TwoPhaseCommit, source: FakeTopicsSource, store: LedgerStore
) -> None:
    first = tpc.run_batch()
    assert first is not None
    eu_id = source.topic_id_of("orders-eu")
    del source.topics_now["orders-eu"]
    source.topics_now["orders-us"].offsets[0] = Available(0, 6)
    decision = retire(tpc, store, "orders-eu")
    assert decision.kind is DecisionKind.RETIRE_TOPIC
    assert (decision.topic, decision.topic_id, decision.previous_topic_id) == (
        "orders-eu",
        None,
        eu_id,
    )
    assert decision.previous_positions == {0: 3, 1: 2}
    assert decision.skipped == ()  # what Kafka deleted with the topic is not known
    assert "retire-topic: retire topic orders-eu" in decision.describe()
    report = tpc.run_batch()
    assert report is not None
    assert [str(r) for r in report.batch.ranges] == ["orders-us-0[4,6)"]
    assert [d.id for d in report.batch.decisions] == [decision.id]
    assert set(report.batch.topic_ids) == {"orders-us"}
    left = store.positions_by_topic(APP)["orders-eu"]  # kept, held by no batch
    assert left.retired and (dict(left), left.topic_id) == ({0: 3, 1: 2}, eu_id)
    assert tpc.run_batch() is None  # caught up, and the decision is not carried again
    tpc.check_topic()


def test_a_retired_topic_created_again_is_read_from_the_starting_offsets(
    tpc: TwoPhaseCommit, source: FakeTopicsSource, store: LedgerStore
) -> None:
    tpc.run_batch()
    del source.topics_now["orders-eu"]
    retire(tpc, store, "orders-eu")
    tpc.run_batch()
    new = source.create("orders-eu", {0: Available(0, 2)}).topic_id
    report = tpc.run_batch()
    assert report is not None
    assert [str(r) for r in report.batch.ranges if r.span] == ["orders-eu-0[0,2)"]
    assert report.batch.topic_ids["orders-eu"] == new


def test_retiring_a_topic_the_pipeline_still_reads_is_refused(
    tpc: TwoPhaseCommit, store: LedgerStore
) -> None:
    tpc.run_batch()
    with pytest.raises(DecisionError, match=r"^topic orders-us: the pipeline still reads it"):
        retire(tpc, store, "orders-us")
    with pytest.raises(DecisionError, match=r"^topic nope: the ledger holds no positions on it"):
        retire(tpc, store, "nope")
    assert store.decisions(app_id=APP) == []


def listed_a_and_b(
    store: LedgerStore, stager: TopicsStager, publisher: FakePublisher
) -> tuple[FakeTopicsSource, TwoPhaseCommit]:
    """A pipeline on `kafka.topics: [a, b]` (a holds offsets [0, 2), b [0, 3)), whose list
    a test then changes."""
    source = FakeTopicsSource(TopicSelection(names=("a", "b")))
    source.create("a", {0: Available(0, 2)})
    source.create("b", {0: Available(0, 3)})
    return source, coordinator(store, source, stager, publisher)


def test_retiring_a_topic_dropped_from_the_list_with_records_left_needs_force(
    store: LedgerStore, stager: TopicsStager, publisher: FakePublisher
) -> None:
    """A topic taken out of `kafka.topics` but still in Kafka: its records past the positions
    would never be read. Refused, naming them, unless --force; forced, they are recorded as
    skipped."""
    source, tpc = listed_a_and_b(store, stager, publisher)
    tpc.run_batch()
    source.topics_now["b"].offsets[0] = Available(0, 7)
    source.selection = TopicSelection(names=("a",))
    with pytest.raises(DecisionError, match=r"^b-0: offsets \[3, 7\) were never read"):
        retire(tpc, store, "b")
    decision = retire(tpc, store, "b", force=True)
    assert decision.forced
    assert decision.skipped == (OffsetRange("b", 0, 3, 7),)
    assert "skipping b-0[3,7)" in decision.describe()
    source.topics_now["a"].offsets[0] = Available(0, 4)
    report = tpc.run_batch()
    assert report is not None
    assert [str(r) for r in report.batch.ranges] == ["a-0[2,4)"]
    assert [d.id for d in report.batch.decisions] == [decision.id]


def test_a_topic_read_to_its_end_and_dropped_from_the_list_retires_without_force(
    store: LedgerStore, stager: TopicsStager, publisher: FakePublisher
) -> None:
    source, tpc = listed_a_and_b(store, stager, publisher)
    tpc.run_batch()
    source.selection = TopicSelection(names=("a",))
    decision = retire(tpc, store, "b")
    assert not decision.forced and decision.skipped == ()
    source.topics_now["a"].offsets[0] = Available(0, 5)
    report = tpc.run_batch()
    assert report is not None
    assert [str(r) for r in report.batch.ranges] == ["a-0[2,5)"]


def test_a_planned_batch_is_staged_over_its_own_topics_even_if_more_match_now(
    tpc: TwoPhaseCommit, source: FakeTopicsSource, publisher: FakePublisher
) -> None:
    """A crash after the plan: the batch is re-driven over the ranges it was planned on;
    a topic that matches since then waits for the next batch."""
    planned = tpc.begin()
    assert planned is not None
    source.create("orders-apac", {0: Available(0, 5)})
    staged, output = tpc.invoke(planned)
    assert staged.state is BatchState.STAGED
    tpc.commit(tpc.pre_commit(staged, output))
    assert {r["topic"] for r in publisher.commits[0]["ranges"]} == {"orders-eu", "orders-us"}
    assert publisher.commits[0]["topic_ids"] == planned.topic_ids


def test_a_topic_recreated_between_plan_and_stage_is_not_voted(
    tpc: TwoPhaseCommit, source: FakeTopicsSource, stager: TopicsStager
) -> None:
    planned = tpc.begin()
    assert planned is not None
    source.create("orders-us", {0: Available(0, 4)})  # same offsets, new incarnation
    with pytest.raises(TopicChangedError, match="orders-us"):
        tpc.invoke(planned)
    assert stager.staged == []


def test_a_voted_batch_on_two_topics_is_recovered_exactly_once(
    tpc: TwoPhaseCommit, source: FakeTopicsSource, publisher: FakePublisher, store: LedgerStore
) -> None:
    """The crash point between the vote and the commit (after_prepare): recovery publishes
    the vote once, over both topics' ranges, and the next batch continues after them."""
    planned = tpc.begin()
    assert planned is not None
    staged, output = tpc.invoke(planned)
    voted = tpc.pre_commit(staged, output)
    assert voted.state is BatchState.PREPARED
    source.create("orders-apac", {0: Available(0, 5)})
    recovered = tpc.recover_and_commit()
    assert [b.batch_id for b in recovered] == [1]
    assert publisher.published_ids() == [1]
    assert {r["topic"] for r in publisher.commits[0]["ranges"]} == {"orders-eu", "orders-us"}
    assert tpc.recover_and_commit() == []
    assert publisher.published_ids() == [1]
    report = tpc.run_batch()
    assert report is not None
    assert [str(r) for r in report.batch.ranges if r.span] == ["orders-apac-0[0,5)"]


def test_accepting_a_recreated_topic_restarts_only_that_topic(
    tpc: TwoPhaseCommit, source: FakeTopicsSource, store: LedgerStore
) -> None:
    """The command the stop names (`exactly skip new-topic --topic T --topic-id ID`): the
    re-created topic is read again from its starting offsets, the others go on."""
    tpc.run_batch()
    new = source.create("orders-us", {0: Available(0, 2)}).topic_id
    source.topics_now["orders-eu"].offsets[1] = Available(0, 3)
    decision = record_decision(
        tpc,
        Request(DecisionKind.NEW_TOPIC, "re-created", "ops", topic="orders-us", topic_id=new),
        store.now(),
    )
    assert (decision.topic, decision.topic_id) == ("orders-us", new)
    report = tpc.run_batch()
    assert report is not None
    assert [str(r) for r in report.batch.ranges if r.span] == [
        "orders-eu-1[2,3)",
        "orders-us-0[0,2)",
    ]
    assert report.batch.topic_ids["orders-us"] == new
    assert [d.id for d in report.batch.decisions] == [decision.id]


def test_a_decision_on_several_topics_must_name_its_topic(
    tpc: TwoPhaseCommit, source: FakeTopicsSource, store: LedgerStore
) -> None:
    tpc.run_batch()
    with pytest.raises(
        DecisionError,
        match=r"^--topic: pipeline orders reads several topics \(orders-eu, orders-us\)",
    ):
        record_decision(
            tpc, Request(DecisionKind.NEW_TOPIC, "why", "ops", topic_id="x"), store.now()
        )
    with pytest.raises(DecisionError, match=r"^--topic: pipeline orders does not read topic nope"):
        record_decision(
            tpc,
            Request(DecisionKind.NEW_TOPIC, "why", "ops", topic="nope", topic_id="x"),
            store.now(),
        )


@pytest.fixture
def fills(
    store: LedgerStore, source: FakeTopicsSource, stager: TopicsStager, publisher: FakePublisher
) -> TwoPhaseCommit:
    """The coordinator of the pipeline's backfills on the same edges, as jobs/ builds it."""
    return coordinator(store, source, stager, publisher, backfill_app_id(APP), BatchKind.BACKFILL)


def backfill(fills: TwoPhaseCommit, mode: BackfillMode, *ranges: OffsetRange) -> tuple[Batch, bool]:
    """`plan_backfill` of the pipeline's backfills with the example transform."""
    return plan_backfill(
        fills,
        live_app_id=APP,
        mode=mode,
        ranges=list(ranges),
        transform="jobs.examples.pageviews:transform",
    )


def test_a_replace_on_one_of_several_topics_is_one_batch_on_that_topics_id(
    tpc: TwoPhaseCommit,
    source: FakeTopicsSource,
    publisher: FakePublisher,
    fills: TwoPhaseCommit,
) -> None:
    """A backfill names the topic of each range; the batch is planned on the id each of its
    topics has now (invariant 10), staged over those ranges only, and published."""
    tpc.run_batch()
    batch, planned = backfill(
        fills,
        BackfillMode.REPLACE,
        OffsetRange("orders-us", 0, 0, 4),
        OffsetRange("orders-eu", 1, 0, 2),
    )
    assert planned
    assert batch.topic_ids == {
        "orders-eu": source.topic_id_of("orders-eu"),
        "orders-us": source.topic_id_of("orders-us"),
    }
    report = fills.finish(batch)
    assert report.batch.state is BatchState.ACKED
    assert publisher.committed_version(backfill_app_id(APP)) == batch.batch_id
    again, planned = backfill(
        fills,
        BackfillMode.REPLACE,
        OffsetRange("orders-us", 0, 0, 4),
        OffsetRange("orders-eu", 1, 0, 2),
    )
    assert not planned and again.batch_id == batch.batch_id


def test_a_backfill_of_a_topic_the_pipeline_does_not_read_is_refused_in_one_line(
    tpc: TwoPhaseCommit,
    store: LedgerStore,
    fills: TwoPhaseCommit,
) -> None:
    """`refunds` exists in Kafka but does not match the pattern: its offsets are not this
    pipeline's to fill, and nothing is planned."""
    tpc.run_batch()
    with pytest.raises(ConfigError) as info:
        backfill(fills, BackfillMode.FILL, OffsetRange("refunds", 0, 0, 1))
    assert str(info.value).startswith("pipeline orders does not read topic refunds")
    assert "\n" not in str(info.value)
    assert store.batches(app_id=backfill_app_id(APP)) == []


def test_a_replace_on_a_recreated_topic_is_refused_naming_it(
    tpc: TwoPhaseCommit,
    store: LedgerStore,
    source: FakeTopicsSource,
    fills: TwoPhaseCommit,
) -> None:
    """The live positions of orders-us belong to its first incarnation: a backfill on the
    re-created topic's offsets would mean other records (invariant 10)."""
    tpc.run_batch()
    source.create("orders-us", {0: Available(0, 4)})  # deleted and created again
    with pytest.raises(TopicChangedError) as info:
        backfill(fills, BackfillMode.REPLACE, OffsetRange("orders-us", 0, 0, 4))
    assert "topic orders-us" in str(info.value)
    assert store.batches(app_id=backfill_app_id(APP)) == []


def test_offsets_lost_on_one_topic_name_the_skip_command_with_the_topic(
    tpc: TwoPhaseCommit, source: FakeTopicsSource, store: LedgerStore
) -> None:
    """Retention deleted offsets of one topic before they were read: planning stops with
    the lost-offsets command naming that topic, and recording it moves that topic only."""
    tpc.run_batch()
    source.topics_now["orders-us"].offsets[0] = Available(6, 9)  # [4, 6) deleted unread
    source.topics_now["orders-eu"].offsets[0] = Available(0, 5)
    with pytest.raises(DataLossError) as info:
        tpc.begin()
    assert "exactly skip lost-offsets -c <config> --topic orders-us --partition 0" in str(
        info.value
    )
    record_decision(
        tpc,
        Request(DecisionKind.LOST_OFFSETS, "retention", "ops", partition=0, topic="orders-us"),
        store.now(),
    )
    report = tpc.run_batch()
    assert report is not None
    assert [str(r) for r in report.batch.ranges if r.span] == [
        "orders-eu-0[3,5)",
        "orders-us-0[6,9)",
    ]


def test_a_retired_topic_named_again_continues_where_it_was_left_not_from_the_start(
    store: LedgerStore, stager: TopicsStager, publisher: FakePublisher
) -> None:
    """The same incarnation read again after it was retired (taken out of kafka.topics, then
    put back): restarting it at the starting offsets would read its committed records again;
    it continues at the positions the retirement kept, even batches later."""
    source, tpc = listed_a_and_b(store, stager, publisher)
    tpc.run_batch()
    source.selection = TopicSelection(names=("a",))
    retire(tpc, store, "b")
    source.topics_now["a"].offsets[0] = Available(0, 4)
    tpc.run_batch()
    source.topics_now["a"].offsets[0] = Available(0, 5)
    tpc.run_batch()
    source.topics_now["b"].offsets[0] = Available(0, 6)
    source.selection = TopicSelection(names=("a", "b"))
    tpc.check_topic()
    report = tpc.run_batch()
    assert report is not None
    assert [str(r) for r in report.batch.ranges] == ["a-0[5,5)", "b-0[3,6)"]
    with pytest.raises(DecisionError, match=r"^topic b: the pipeline still reads it"):
        retire(tpc, store, "b")


def test_a_retired_topic_created_again_asks_for_no_new_topic_decision_in_a_backfill(
    tpc: TwoPhaseCommit,
    store: LedgerStore,
    source: FakeTopicsSource,
    fills: TwoPhaseCommit,
) -> None:
    """The retired positions belong to the deleted incarnation: they do not make the new one
    look re-created to a backfill (which would send the operator to `skip new-topic`, a
    decision for a topic the pipeline holds positions on); the fill rules decide alone, and
    the new topic's offsets are the live pipeline's to read."""
    tpc.run_batch()
    del source.topics_now["orders-eu"]
    retire(tpc, store, "orders-eu")
    source.create("orders-eu", {0: Available(0, 4)})
    with pytest.raises(BackfillError, match="belong to the live pipeline"):
        backfill(fills, BackfillMode.FILL, OffsetRange("orders-eu", 0, 3, 4))


def test_lost_commit_info_on_several_topics_is_resumed_topic_by_topic(
    source: FakeTopicsSource, stager: TopicsStager, publisher: FakePublisher, tmp_path
) -> None:
    """The ledger is lost and the Delta log no longer holds the commit info it would be
    rebuilt from: planning stops with one resume-at command per topic read, each with the
    positions the table's rows suggest, and goes on only once every topic's is recorded;
    a topic left unstated would restart at the starting offsets (duplicates)."""
    lost = LedgerStore(f"sqlite:///{tmp_path}/lost.db")
    try:
        old = coordinator(lost, source, stager, publisher)
        assert old.run_batch() is not None
        source.topics_now["orders-us"].offsets[0] = Available(0, 6)
        assert old.run_batch() is not None
    finally:
        lost.dispose()
    publisher.drop_metadata_of = {1, 2}
    source.topics_now["orders-eu"].offsets[0] = Available(0, 5)
    store = LedgerStore(f"sqlite:///{tmp_path}/new.db")
    try:
        tpc = coordinator(store, source, stager, publisher)
        with pytest.raises(InconsistencyError) as info:
            tpc.recover_and_commit()
        message = str(info.value)
        eu = "exactly skip resume-at -c <config> --topic orders-eu --position 0=3 --position 1=2"
        us = "exactly skip resume-at -c <config> --topic orders-us --position 0=6"
        assert eu in message and us in message

        def resume(topic: str, positions: dict[int, int]):
            return record_decision(
                tpc,
                Request(DecisionKind.RESUME_AT, "log gone", "ops", topic=topic,
                        positions=positions),
                store.now(),
            )  # fmt: skip

        with pytest.raises(DecisionError, match=r"^orders-us-0: position 2 would read"):
            resume("orders-us", {0: 2})
        resume("orders-eu", {0: 3, 1: 2})
        with pytest.raises(InconsistencyError) as info:
            tpc.recover_and_commit()
        assert us in str(info.value) and "orders-eu" not in str(info.value)
        resume("orders-us", {0: 6})
        assert tpc.recover_and_commit() == []
        report = tpc.run_batch()
        assert report is not None
        assert report.batch.batch_id == 3
        assert [str(r) for r in report.batch.ranges if r.span] == ["orders-eu-0[3,5)"]
        assert publisher.published_ids() == [1, 2, 3]
    finally:
        store.dispose()


def test_a_topic_new_to_the_pipeline_is_refused_if_another_pipeline_fills_its_table_from_it(
    tpc: TwoPhaseCommit,
    source: FakeTopicsSource,
    publisher: FakePublisher,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ledger/coordinator/topics.py `refuse_other_writers_of_new_topics`: the logs are read
    once per process for a new topic (an idle run plans every second, and an empty topic
    stays new until a batch reads it), and a topic another pipeline fills the table from
    is refused before any batch reads it."""
    tpc.run_batch()
    asked: list[int] = []
    others: dict[str, dict] = {}
    monkeypatch.setattr(publisher, "other_writers", lambda: asked.append(1) or others)
    assert tpc.run_batch() is None and asked == []  # no topic new: the logs are not read
    source.create("orders-apac", {0: Available(0, 0)})
    assert tpc.run_batch() is None and tpc.run_batch() is None
    assert asked == [1]

    others["refunds"] = {"pipeline": "refunds", "batch_id": 3, "topics": {"orders-eu-2"}}
    source.create("orders-eu-2", {0: Available(0, 6)})
    with pytest.raises(ConfigError, match=r"pipeline orders now reads topic\(s\) orders-eu-2,"):
        tpc.run_batch()
    assert len(publisher.commits) == 1  # nothing of orders-eu-2 was read
