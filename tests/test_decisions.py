"""Topic identity (invariant 10) and operator decisions (invariant 15): the pure rules of
ledger/core/protocol.py and ledger/core/decisions.py, then the coordinator applying them with
in-memory Kafka and Delta fakes and a real SQLite ledger (tests/test_two_phase.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ledger.coordinator.backfill import plan_backfill
from ledger.coordinator.decisions import record_decision
from ledger.coordinator.two_phase import TwoPhaseCommit
from ledger.core.backfill import BackfillError, BackfillMode
from ledger.core.batch import BatchKind
from ledger.core.decision_rules import (
    check_new_topic,
    lost_offsets_skips,
    resume_command,
    resume_skips,
)
from ledger.core.decisions import Decision, DecisionKind, Request, apply_decisions
from ledger.core.errors import DataLossError, DecisionError, InconsistencyError, TopicChangedError
from ledger.core.protocol import (
    Available,
    BatchState,
    OffsetRange,
    Positions,
    check_batch_topic,
    check_topic_identity,
    check_topic_steady,
)
from ledger.store.ledger_store import LedgerStore
from tests.fixtures.fakes import TOPIC, FakePublisher, FakeSource, FakeStager
from tests.test_two_phase import APP, coordinator

T0 = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


@pytest.fixture
def source() -> FakeSource:
    return FakeSource({0: Available(0, 25), 1: Available(5, 12)})


@pytest.fixture
def stager() -> FakeStager:
    return FakeStager()


@pytest.fixture
def publisher(stager: FakeStager) -> FakePublisher:
    return FakePublisher(disk=stager.disk)


@pytest.fixture
def tpc(
    store: LedgerStore, source: FakeSource, stager: FakeStager, publisher: FakePublisher
) -> TwoPhaseCommit:
    return coordinator(store, source, stager, publisher)


def decision(kind: DecisionKind, after: int, **kw: object) -> Decision:
    fields: dict = {
        "id": f"d-{kind}-{after}",
        "pipeline": "pv",
        "app_id": APP,
        "kind": kind,
        "topic": TOPIC,
        "topic_id": "id-1",
        "previous_topic_id": "id-1",
        "after_batch_id": after,
        "reason": "because",
        "decided_by": "alice",
        "decided_at": T0,
    }
    fields.update(kw)
    return Decision(**fields)


def ask(kind: DecisionKind, **kw: object) -> Request:
    return Request(kind=kind, reason=str(kw.pop("reason", "ops ticket 7")), decided_by="bob", **kw)


# -- topic identity: the pure rules -------------------------------------------------------


def test_positions_continue_only_on_the_topic_id_they_were_read_from() -> None:
    held = Positions({0: 10}, topic=TOPIC, topic_id="id-1")
    assert check_topic_identity(TOPIC, held, "id-1") is False
    assert check_topic_identity(TOPIC, Positions(), "id-2") is False  # nothing to continue
    assert check_topic_identity(TOPIC, Positions({0: 10}, topic=TOPIC), "id-2") is True  # adopt
    with pytest.raises(TopicChangedError) as info:
        check_topic_identity(TOPIC, held, "id-2")
    message = str(info.value)
    assert "id-1" in message and "id-2" in message and TOPIC in message
    assert "exactly skip new-topic -c <config> --topic-id id-2 --reason" in message
    assert "\n" not in message


def test_a_repointed_config_names_both_topics() -> None:
    held = Positions({0: 10}, topic="old-topic", topic_id="id-1")
    with pytest.raises(TopicChangedError, match="read from topic old-topic with id id-1"):
        check_topic_identity("new-topic", held, "id-9")


def test_a_batch_is_staged_only_on_the_topic_id_it_was_planned_on() -> None:
    check_batch_topic("pv/1 attempt 1", TOPIC, "id-1", "id-1")
    with pytest.raises(TopicChangedError, match="planned on topic pageviews with id id-1"):
        check_batch_topic("pv/1 attempt 1", TOPIC, "id-1", "id-2")
    with pytest.raises(TopicChangedError, match="no recorded id"):
        check_batch_topic("pv/1 attempt 1", TOPIC, None, "id-2")
    check_topic_steady(TOPIC, "id-1", "id-1")
    with pytest.raises(TopicChangedError, match="changed while its offsets were read"):
        check_topic_steady(TOPIC, "id-1", "id-2")


# -- decisions: what they do to positions --------------------------------------------------


def test_decisions_taken_after_the_last_batch_move_its_positions() -> None:
    held = Positions({0: 10, 1: 20}, topic=TOPIC, topic_id="id-1")
    lost = decision(DecisionKind.LOST_OFFSETS, 5, skipped=(OffsetRange(TOPIC, 0, 10, 40),))
    moved = apply_decisions(held, 5, [lost])
    assert moved == {0: 40, 1: 20} and moved.topic_id == "id-1"
    assert moved.decisions == (lost,)
    # a decision the last batch was already planned on is in that batch's ranges
    assert apply_decisions(held, 6, [lost]) == {0: 10, 1: 20}
    assert apply_decisions(held, 6, [lost]).decisions == ()
    accepted = decision(DecisionKind.NEW_TOPIC, 5, topic_id="id-2")
    fresh = apply_decisions(held, 5, [lost, accepted])
    assert fresh == {} and fresh.topic_id == "id-2"
    assert fresh.decisions == (lost, accepted)
    resumed = decision(DecisionKind.RESUME_AT, 9, positions={0: 7, 1: 8}, topic_id="id-3")
    assert apply_decisions(Positions(), None, [resumed]) == {0: 7, 1: 8}
    assert apply_decisions(Positions(), None, [resumed]).topic_id == "id-3"


def test_a_decision_survives_its_round_trip_through_commit_metadata() -> None:
    original = decision(
        DecisionKind.RESUME_AT,
        3,
        skipped=(OffsetRange(TOPIC, 1, 4, 9),),
        positions={0: 5, 1: 9},
        previous_positions={0: 1},
        forced=True,
    )
    assert Decision.from_dict(original.as_dict()) == original
    assert "resume pageviews at 0=5 1=9" in original.describe()
    assert "(forced)" in original.describe() and "alice" in original.describe()


# -- decisions: what an operator may decide -----------------------------------------------

AVAILABLE = {0: Available(50, 200), 1: Available(0, 200)}
HELD = Positions({0: 20, 1: 100}, topic=TOPIC, topic_id="id-1")


def test_lost_offsets_skips_exactly_what_retention_deleted() -> None:
    assert lost_offsets_skips(TOPIC, HELD, AVAILABLE, "id-1") == [OffsetRange(TOPIC, 0, 20, 50)]
    assert lost_offsets_skips(TOPIC, HELD, AVAILABLE, "id-1", partition=0, to=50) == [
        OffsetRange(TOPIC, 0, 20, 50)
    ]


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"partition": 1}, r"pageviews-1: nothing is lost.*position 100 is still in Kafka"),
        ({"partition": 7}, "no such partition"),
        ({"partition": 0, "to": 80}, r"would also skip offsets \[50, 80\).*--force"),
        ({"partition": 0, "to": 30}, r"would leave offsets \[30, 50\) lost"),
        ({"partition": 0, "to": 201, "force": True}, "past the last stable offset 200"),
    ],
)
def test_lost_offsets_refuses_what_is_not_a_loss(kw: dict, expected: str) -> None:
    with pytest.raises(DecisionError, match=expected):
        lost_offsets_skips(TOPIC, HELD, AVAILABLE, "id-1", **kw)


def test_lost_offsets_past_the_loss_needs_force_and_is_then_allowed() -> None:
    skips = lost_offsets_skips(TOPIC, HELD, AVAILABLE, "id-1", partition=0, to=80, force=True)
    assert skips == [OffsetRange(TOPIC, 0, 20, 80)]


def test_lost_offsets_with_nothing_lost_or_another_topic_is_refused() -> None:
    whole = {0: Available(0, 200), 1: Available(0, 200)}
    with pytest.raises(DecisionError, match="nothing is lost"):
        lost_offsets_skips(TOPIC, HELD, whole, "id-1")
    with pytest.raises(DecisionError, match="accept the new topic first"):
        lost_offsets_skips(TOPIC, HELD, AVAILABLE, "id-2")


def test_new_topic_accepts_only_the_current_id_and_only_when_it_changed() -> None:
    check_new_topic(TOPIC, HELD, "id-2", "id-2")
    with pytest.raises(DecisionError, match="has id id-2, not id-3"):
        check_new_topic(TOPIC, HELD, "id-2", "id-3")
    with pytest.raises(DecisionError, match="already belong to id id-1"):
        check_new_topic(TOPIC, HELD, "id-1", "id-1")
    with pytest.raises(DecisionError, match="no positions yet"):
        check_new_topic(TOPIC, Positions(), "id-2", "id-2")
    # positions recorded before topic ids may be this very topic: restarting them would
    # read it again, so only a forced accept does
    with pytest.raises(DecisionError, match="add --force only if the topic was re-created"):
        check_new_topic(TOPIC, Positions({0: 3}), "id-2", "id-2")
    check_new_topic(TOPIC, Positions({0: 3}), "id-2", "id-2", force=True)
    # a config pointed back at a topic the pipeline read before would read it again
    with pytest.raises(DecisionError, match="already read topic id id-0"):
        check_new_topic(TOPIC, HELD, "id-0", "id-0", read_before={"id-0", "id-1"})
    check_new_topic(TOPIC, HELD, "id-0", "id-0", read_before={"id-0"}, force=True)
    # an upsert's (partition, offset) order would keep the old topic's records: refused,
    # --force or not, until their tables are deleted
    for force in (False, True):
        with pytest.raises(DecisionError, match=r"latest_per_user.*delete their tables"):
            check_new_topic(
                TOPIC, HELD, "id-2", "id-2", upsert_outputs=["latest_per_user"], force=force
            )


def test_resume_positions_must_neither_reread_nor_skip_what_kafka_holds() -> None:
    reach = {0: 120, 1: 100}
    assert resume_skips(TOPIC, {0: 120, 1: 100}, AVAILABLE, reach) == []
    with pytest.raises(DecisionError, match=r"pageviews-0: position 110 would read .*\[110, 120\)"):
        resume_skips(TOPIC, {0: 110, 1: 100}, AVAILABLE, reach)
    with pytest.raises(DecisionError, match=r"pageviews-1: position 130 would skip .*\[100, 130\)"):
        resume_skips(TOPIC, {0: 120, 1: 130}, AVAILABLE, reach)
    assert resume_skips(TOPIC, {0: 120, 1: 130}, AVAILABLE, reach, force=True) == [
        OffsetRange(TOPIC, 1, 100, 130)
    ]
    with pytest.raises(DecisionError, match=r"missing \[1\]"):
        resume_skips(TOPIC, {0: 120}, AVAILABLE, reach)
    with pytest.raises(DecisionError, match=r"\[40, 50\) are no longer in Kafka"):
        resume_skips(TOPIC, {0: 40, 1: 100}, AVAILABLE, reach)


def test_resume_records_what_retention_took_between_the_rows_and_kafka() -> None:
    # the rows end at 30 in partition 0, Kafka starts at 50: [30, 50) is gone either way
    skipped = resume_skips(TOPIC, {0: 50, 1: 100}, AVAILABLE, {0: 30, 1: 100})
    assert skipped == [OffsetRange(TOPIC, 0, 30, 50)]
    # no rows at all: continuing past Kafka's earliest offset skips what it holds
    with pytest.raises(DecisionError, match=r"\[0, 10\)"):
        resume_skips(TOPIC, {0: 50, 1: 10}, AVAILABLE, {})


def test_resume_command_suggests_one_past_the_rows() -> None:
    assert resume_command({0: 100, 1: 90}, [0, 1, 2]) == (
        "exactly skip resume-at -c <config> --position 0=100 --position 1=90 "
        "--position 2=OFFSET --reason '...'"
    )


# -- the coordinator with decisions (fakes + a real SQLite ledger) ------------------------


def test_a_changed_topic_plans_nothing_until_the_new_one_is_accepted(
    tpc: TwoPhaseCommit, store: LedgerStore, source: FakeSource, publisher: FakePublisher
) -> None:
    first = tpc.run_batch()
    assert first is not None and first.batch.topic_id == "topic-id-1"
    assert publisher.commits[0]["topic_id"] == "topic-id-1"
    source.current_id = "topic-id-2"
    source.offsets = {0: Available(0, 30), 1: Available(0, 4)}
    with pytest.raises(TopicChangedError, match=r"topic-id-1.*topic-id-2"):
        tpc.begin()
    with pytest.raises(TopicChangedError):
        tpc.next_batch()
    assert [b.batch_id for b in store.batches(app_id=APP)] == [1]

    accepted = record_decision(tpc, ask(DecisionKind.NEW_TOPIC, topic_id="topic-id-2"), T0)
    assert (accepted.previous_topic_id, accepted.topic_id) == ("topic-id-1", "topic-id-2")
    assert accepted.previous_positions == {0: 10, 1: 12}
    assert accepted.after_batch_id == 1
    report = tpc.run_batch()
    assert report is not None
    assert [str(r) for r in report.batch.ranges] == ["pageviews-0[0,10)", "pageviews-1[0,4)"]
    assert report.batch.topic_id == "topic-id-2"
    assert [d.id for d in report.batch.decisions] == [accepted.id]
    assert publisher.commits[-1]["decisions"] == [accepted.as_dict()]
    following = tpc.run_batch()
    assert following is not None and following.batch.decisions == ()
    # pointing back at the first topic would read it again from its starting offsets
    source.current_id = "topic-id-1"
    with pytest.raises(DecisionError, match="already read topic id topic-id-1"):
        record_decision(tpc, ask(DecisionKind.NEW_TOPIC, topic_id="topic-id-1"), T0)
    # the old batch keeps its ranges and id, as history
    old = store.get(APP, 1)
    assert old is not None and old.topic_id == "topic-id-1"
    assert [str(r) for r in old.ranges] == ["pageviews-0[0,10)", "pageviews-1[5,12)"]


def test_an_abandoned_batch_leaves_its_decision_to_the_next_one(
    tpc: TwoPhaseCommit, store: LedgerStore, source: FakeSource, publisher: FakePublisher
) -> None:
    assert tpc.run_batch() is not None
    source.offsets[0] = Available(15, 30)
    with pytest.raises(DataLossError, match="exactly skip lost-offsets -c <config> --partition 0"):
        tpc.begin()
    skipped = record_decision(tpc, ask(DecisionKind.LOST_OFFSETS), T0)
    assert skipped.skipped == (OffsetRange(TOPIC, 0, 10, 15),)
    planned = tpc.begin()
    assert planned is not None and planned.ranges[0].start == 15
    tpc.abort(planned, "gave up")
    again = tpc.run_batch()
    assert again is not None and again.batch.ranges[0].start == 15
    assert [d.id for d in again.batch.decisions] == [skipped.id]
    assert publisher.commits[-1]["decisions"][0]["skipped"] == [
        {"topic": TOPIC, "partition": 0, "start": 10, "end": 15}
    ]


def test_a_decision_is_refused_while_a_batch_is_in_flight(
    tpc: TwoPhaseCommit, store: LedgerStore, source: FakeSource
) -> None:
    batch = tpc.begin()
    assert batch is not None
    source.offsets[0] = Available(5, 30)
    with pytest.raises(Exception, match="still PLANNED"):
        record_decision(tpc, ask(DecisionKind.RESUME_AT, positions={0: 5, 1: 5}), T0)
    with pytest.raises(DecisionError, match="--reason"):
        record_decision(tpc, ask(DecisionKind.LOST_OFFSETS, reason="  "), T0)
    assert store.decisions(app_id=APP) == []


def test_the_topic_must_not_change_between_plan_and_stage_or_during_it(
    tpc: TwoPhaseCommit, store: LedgerStore, source: FakeSource, stager: FakeStager
) -> None:
    planned = tpc.begin()
    assert planned is not None
    source.current_id = "topic-id-2"
    with pytest.raises(TopicChangedError, match="planned on topic pageviews with id topic-id-1"):
        tpc.invoke(planned)
    assert stager.staged == []
    source.current_id = "topic-id-1"
    # re-created while Spark reads: the id before the read and after it differ
    source.ids = ["topic-id-1", "topic-id-1", "topic-id-2"]
    with pytest.raises(TopicChangedError, match="now has id topic-id-2"):
        tpc.invoke(planned)
    assert stager.staged == [(1, 1)]
    current = store.get(APP, 1)
    assert current is not None and current.state is BatchState.PLANNED  # nothing voted


def test_a_topic_recreated_while_its_offsets_are_read_plans_nothing(
    tpc: TwoPhaseCommit, store: LedgerStore, source: FakeSource
) -> None:
    source.ids = ["topic-id-1", "topic-id-2"]
    with pytest.raises(TopicChangedError, match="changed while its offsets were read"):
        tpc.begin()
    assert store.batches(app_id=APP) == []


def test_rebuild_restores_topic_ids_and_decisions(
    store: LedgerStore, source: FakeSource, stager: FakeStager, tmp_path: Path
) -> None:
    publisher = FakePublisher(disk=stager.disk)
    lost = LedgerStore(f"sqlite:///{tmp_path}/lost.db")
    try:
        old = coordinator(lost, source, stager, publisher)
        assert old.run_batch() is not None
        source.offsets[0] = Available(12, 30)
        taken = record_decision(old, ask(DecisionKind.LOST_OFFSETS), T0)
        assert old.run_batch() is not None
    finally:
        lost.dispose()
    tpc = coordinator(store, source, stager, publisher)
    assert tpc.rebuild_from_log() == 2
    assert [d.id for d in store.decisions(app_id=APP)] == [taken.id]
    rebuilt = store.get(APP, 2)
    assert rebuilt is not None and rebuilt.topic_id == "topic-id-1"
    assert [d.id for d in rebuilt.decisions] == [taken.id]
    assert store.positions(APP).topic_id == "topic-id-1"
    assert store.positions(APP) == {0: 22, 1: 12}


def test_lost_commit_info_is_refused_until_an_operator_states_the_positions(
    store: LedgerStore, source: FakeSource, stager: FakeStager, tmp_path: Path
) -> None:
    publisher = FakePublisher(disk=stager.disk)
    lost = LedgerStore(f"sqlite:///{tmp_path}/lost.db")
    try:
        old = coordinator(lost, source, stager, publisher)
        for _ in range(2):
            assert old.run_batch() is not None
    finally:
        lost.dispose()
    publisher.drop_metadata_of = {1, 2}
    tpc = coordinator(store, source, stager, publisher)
    with pytest.raises(InconsistencyError) as info:
        tpc.recover_and_commit()
    assert "--position 0=20 --position 1=12" in str(info.value)
    with pytest.raises(DecisionError, match=r"pageviews-0: position 10 would read"):
        record_decision(tpc, ask(DecisionKind.RESUME_AT, positions={0: 10, 1: 12}), T0)
    stated = record_decision(tpc, ask(DecisionKind.RESUME_AT, positions={0: 20, 1: 12}), T0)
    assert stated.after_batch_id == 2  # the table's version: no batch id below it is reused
    assert tpc.recover_and_commit() == []
    report = tpc.run_batch()
    assert report is not None
    assert report.batch.batch_id == 3
    assert [str(r) for r in report.batch.ranges] == ["pageviews-0[20,25)", "pageviews-1[12,12)"]
    assert publisher.published_ids() == [1, 2, 3]
    assert tpc.next_batch().batch_id is None


def test_a_replace_never_reaches_rows_of_an_earlier_topic_incarnation(
    tpc: TwoPhaseCommit, store: LedgerStore, source: FakeSource
) -> None:
    assert tpc.run_batch() is not None  # pageviews-0[0,10) from topic-id-1
    source.current_id = "topic-id-2"
    record_decision(tpc, ask(DecisionKind.NEW_TOPIC, topic_id="topic-id-2"), T0)
    assert tpc.run_batch() is not None  # pageviews-0[0,10) again, from topic-id-2
    backfills = TwoPhaseCommit(
        store,
        pipeline="pv",
        app_id=f"{APP}.backfill",
        kind=BatchKind.BACKFILL,
        source=source,
        stager=FakeStager(),
        publisher=FakePublisher(),
        max_records_per_partition=10,
    )
    with pytest.raises(BackfillError, match=r"\[0, 5\) were committed by batch pageviews/1"):
        plan_backfill(
            backfills,
            live_app_id=APP,
            mode=BackfillMode.REPLACE,
            ranges=[OffsetRange(TOPIC, 0, 0, 5)],
            transform="t:f",
        )
    assert store.batches(app_id=f"{APP}.backfill") == []


def test_a_backfill_is_refused_while_the_topic_changed_unaccepted(
    tpc: TwoPhaseCommit, store: LedgerStore, source: FakeSource
) -> None:
    assert tpc.run_batch() is not None
    source.current_id = "topic-id-2"
    backfills = TwoPhaseCommit(
        store,
        pipeline="pv",
        app_id=f"{APP}.backfill",
        kind=BatchKind.BACKFILL,
        source=source,
        stager=FakeStager(),
        publisher=FakePublisher(),
        max_records_per_partition=10,
    )
    with pytest.raises(TopicChangedError, match="topic-id-1"):
        plan_backfill(
            backfills,
            live_app_id=APP,
            mode=BackfillMode.REPLACE,
            ranges=[OffsetRange(TOPIC, 0, 0, 5)],
            transform="t:f",
        )
    assert store.batches(app_id=f"{APP}.backfill") == []


# -- the command line, before it reaches Kafka --------------------------------------------


def test_skip_without_a_reason_is_one_line_and_records_nothing(tmp_path: Path) -> None:
    from tests.test_cli import exactly, one_error_line, write_config

    path = write_config(tmp_path)
    line = one_error_line(exactly("skip", "lost-offsets", "-c", str(path), "--reason", " "))
    assert "--reason must say why" in line
    listed = exactly("ledger", "-c", str(path), "--decisions", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == []
