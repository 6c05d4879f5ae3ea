"""ledger/store/ledger_store.py with several topics: one batch records every topic's ranges, each
with its own topic id, and reads positions back per topic; a ledger written for one topic by
exactly before several topics existed reads the same (tests/ledger_fixtures/: the script
that wrote it with the code of commit 804554c, and its dump)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ledger.core.batch import BatchKind
from ledger.core.decisions import EXACTLY, Decision, DecisionKind, new_decision_id
from ledger.core.errors import InconsistencyError, TopicChangedError
from ledger.core.protocol import BatchState, OffsetRange, Positions
from ledger.store.ledger_store import LedgerStore

DUMP = Path(__file__).parent / "ledger_fixtures" / "one_topic_ledger_804554c.sql"
APP = "pageviews"


def plan(
    store: LedgerStore,
    ranges: list[OffsetRange],
    topic_ids: dict[str, str],
    seen: list | None = None,
):
    def ranges_for(positions: dict[str, Positions]) -> list[OffsetRange]:
        if seen is not None:
            seen.append(positions)
        return ranges

    return store.plan(
        pipeline=APP, app_id=APP, kind=BatchKind.LIVE, ranges_for=ranges_for, topic_ids=topic_ids
    )


def finish(store: LedgerStore, batch) -> None:
    batch = store.transition(batch, BatchState.STAGED)
    batch = store.transition(batch, BatchState.PREPARED)
    store.transition(batch, BatchState.COMMITTED)


@pytest.fixture
def store(ledger_url: str) -> Iterator[LedgerStore]:
    """The ledger on SQLite and on PostgreSQL: per-topic ids are read with SQL of their own."""
    ledger = LedgerStore(ledger_url)
    yield ledger
    ledger.dispose()


@pytest.fixture
def old_store(tmp_path: Path):
    path = tmp_path / "ledger.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(DUMP.read_text())
    store = LedgerStore(f"sqlite:///{path}")
    yield store
    store.dispose()


def test_a_one_topic_ledger_of_the_previous_code_reads_the_same(old_store: LedgerStore) -> None:
    batches = old_store.batches(app_id=APP)
    assert [b.batch_id for b in batches] == [4, 3, 2, 1]
    for b in batches:
        assert b.topic_id == "topic-id-1"
        assert b.topic_ids == {"pageviews": "topic-id-1"}
    single = old_store.positions(APP)
    assert (dict(single), single.topic, single.topic_id) == (
        {0: 10, 1: 7},
        "pageviews",
        "topic-id-1",
    )
    by_topic = old_store.positions_by_topic(APP)
    assert list(by_topic) == ["pageviews"]
    assert dict(by_topic["pageviews"]) == {0: 10, 1: 7}
    assert by_topic["pageviews"].topic_id == "topic-id-1"


def test_a_one_topic_ledger_continues_on_several_topics(old_store: LedgerStore) -> None:
    """`kafka.topic: pageviews` becomes `kafka.topics: [pageviews, clicks]`: pageviews goes
    on where it was, clicks starts, and each keeps its own id."""
    batch = plan(
        old_store,
        [
            OffsetRange("clicks", 0, 0, 3),
            OffsetRange("pageviews", 0, 10, 12),
            OffsetRange("pageviews", 1, 7, 7),
        ],
        {"pageviews": "topic-id-1", "clicks": "id-clicks"},
    )
    assert batch is not None and batch.batch_id == 5
    assert batch.topic_ids == {"pageviews": "topic-id-1", "clicks": "id-clicks"}
    finish(old_store, batch)
    by_topic = old_store.positions_by_topic(APP)
    assert {t: (dict(p), p.topic_id) for t, p in by_topic.items()} == {
        "clicks": ({0: 3}, "id-clicks"),
        "pageviews": ({0: 12, 1: 7}, "topic-id-1"),
    }


def test_contiguity_is_checked_per_topic(store: LedgerStore) -> None:
    """Partition 0 of one topic and partition 0 of another are two positions: a range of
    one topic that starts at the other's position is still a gap."""
    first = plan(
        store, [OffsetRange("a", 0, 0, 5), OffsetRange("b", 0, 0, 2)], {"a": "A", "b": "B"}
    )
    finish(store, first)
    with pytest.raises(InconsistencyError, match="b-0\\[5,6\\) skips committed data"):
        plan(store, [OffsetRange("a", 0, 5, 6), OffsetRange("b", 0, 5, 6)], {"a": "A", "b": "B"})
    ok = plan(store, [OffsetRange("a", 0, 5, 6), OffsetRange("b", 0, 2, 6)], {"a": "A", "b": "B"})
    assert ok is not None and ok.batch_id == 2


def test_a_decision_on_one_topic_moves_only_that_topics_positions(store: LedgerStore) -> None:
    first = plan(
        store, [OffsetRange("a", 0, 0, 5), OffsetRange("b", 0, 0, 2)], {"a": "A", "b": "B"}
    )
    finish(store, first)
    store.insert_decision(
        Decision(
            id=new_decision_id(),
            pipeline=APP,
            app_id=APP,
            kind=DecisionKind.NEW_TOPIC,
            topic="b",
            topic_id="B2",
            previous_topic_id="B",
            after_batch_id=1,
            reason="b was re-created",
            decided_by=EXACTLY,
            decided_at=datetime(2026, 11, 26, tzinfo=UTC),
            previous_positions={0: 2},
        )
    )
    seen: list = []
    second = plan(
        store, [OffsetRange("a", 0, 5, 5), OffsetRange("b", 0, 0, 1)], {"a": "A", "b": "B2"}, seen
    )
    positions = seen[0]
    assert (dict(positions["a"]), positions["a"].topic_id) == ({0: 5}, "A")
    assert (dict(positions["b"]), positions["b"].topic_id) == ({}, "B2")
    assert second is not None
    assert [d.topic for d in second.decisions] == ["b"]


def test_one_topic_positions_are_refused_after_a_batch_on_several_topics(
    store: LedgerStore,
) -> None:
    """`kafka.topics: [a, b]` back to `kafka.topic: a`: one-topic positions map partition ->
    offset, so a's and b's partition 0 would be merged (b's end read as a's: records of a
    read twice or skipped) and the batch's ids read as 'none recorded' (adopted silently).
    Refused, naming the topics, instead."""
    first = plan(
        store, [OffsetRange("a", 0, 0, 50), OffsetRange("b", 0, 0, 5)], {"a": "A", "b": "B"}
    )
    finish(store, first)
    with pytest.raises(TopicChangedError) as info:
        store.positions(APP)
    message = str(info.value)
    assert message.startswith("the ledger's last batch of pageviews read topics a, b")
    assert "kafka.topics" in message
