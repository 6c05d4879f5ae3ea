"""orchestration/health/table_checks.py `other_incarnations` on a batch on several topics: the
old incarnation's rows of one re-created topic are told apart per topic, by each topic's
own id (Batch.topic_ids), so `last_batch_complete` counts only the batch's own rows."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from ledger.core.batch import utcnow
from ledger.core.protocol import BatchState, OffsetRange
from orchestration.health.table_checks import other_incarnations
from tests.fixtures.batches import a_batch

A0 = OffsetRange("a", 0, 0, 10)
B0 = OffsetRange("b", 0, 0, 10)


def published(batch_id: int, ranges: tuple[OffsetRange, ...], ids: dict[str, str]):
    then = utcnow() - timedelta(seconds=batch_id)
    made = a_batch(batch_id, BatchState.ACKED, at=then, committed_at=then, ranges=ranges)
    sole = next(iter(ids.values())) if len(ids) == 1 else None
    return replace(made, topic_ids=ids, topic_id=sole)


def test_a_recreated_topic_among_several_is_told_apart_by_its_own_id() -> None:
    last = published(9, (A0, B0), {"a": "a1", "b": "b2"})  # b re-created and accepted
    old_b = published(2, (A0, B0), {"a": "a1", "b": "b1"})  # b's old rows at b-0 [0, 10)
    a_only = published(3, (A0,), {"a": "a1"})  # same incarnation of a
    b_old_alone = published(4, (B0,), {"b": "b1"})
    assert other_incarnations(last, [last, old_b, a_only, b_old_alone]) == {2, 4}


def test_batches_without_ids_are_taken_for_the_same_incarnation() -> None:
    last = published(9, (A0, B0), {"a": "a1", "b": "b2"})
    unknown = published(1, (A0, B0), {})
    assert other_incarnations(last, [last, unknown]) == frozenset()
