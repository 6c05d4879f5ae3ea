"""ledger/core/topic_plan.py: one batch's ranges across every topic a pipeline reads.

One batch is one checkpoint: every matched topic's ranges and ids are fixed in it together,
a topic new to the pipeline starts at `starting_offsets`, and any topic whose stored
positions do not belong to what Kafka has now stops the whole plan, naming that topic.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from ledger.core.decisions import Decision, DecisionKind, apply_decisions
from ledger.core.errors import DataLossError, TopicChangedError
from ledger.core.protocol import Available, OffsetRange, Positions
from ledger.core.topic_plan import TopicPlan, TopicRead, plan_topics, positions_by_topic

A = {0: Available(0, 10), 1: Available(0, 4)}
B = {0: Available(5, 8)}


def reads(**by_topic: TopicRead) -> dict[str, TopicRead]:
    return dict(by_topic)


def test_every_topic_is_planned_in_one_batch_with_its_own_id() -> None:
    plan = plan_topics(
        ("a", "b"),
        {"a": Positions({0: 3, 1: 4}, topic="a", topic_id="id-a")},
        reads(a=TopicRead("id-a", A), b=TopicRead("id-b", B)),
        max_records_per_partition=100,
    )
    assert plan.ranges == (
        OffsetRange("a", 0, 3, 10),
        OffsetRange("a", 1, 4, 4),
        OffsetRange("b", 0, 5, 8),
    )
    assert plan.topic_ids == {"a": "id-a", "b": "id-b"}
    assert plan.worth_planning


def test_the_pipeline_starts_every_topic_at_the_starting_offsets() -> None:
    plan = plan_topics(
        ("a", "b"),
        {},
        reads(a=TopicRead("id-a", A), b=TopicRead("id-b", B)),
        max_records_per_partition=100,
        starting_offsets="latest",
    )
    assert plan.ranges == (
        OffsetRange("a", 0, 10, 10),
        OffsetRange("a", 1, 4, 4),
        OffsetRange("b", 0, 8, 8),
    )
    # nothing to read, but the starts must be pinned or they move with the topics' ends
    assert plan.worth_planning


def running_from_latest(a: dict[int, Available]) -> TopicPlan:
    """The plan of a pipeline started from `latest` that read topic a up to (10, 4), when
    Kafka holds `a` of topic a and topic b appeared."""
    return plan_topics(
        ("a", "b"),
        {"a": Positions({0: 10, 1: 4}, topic="a", topic_id="id-a")},
        reads(a=TopicRead("id-a", a), b=TopicRead("id-b", B)),
        max_records_per_partition=100,
        starting_offsets="latest",
    )


def test_a_topic_that_appears_once_the_pipeline_runs_starts_at_its_earliest() -> None:
    """`latest` is where the pipeline starts, as Structured Streaming's startingOffsets
    applies only when a query starts: a topic that appears later (created and matching the
    pattern, or added to the list) starts at its earliest offset, or every record produced
    to it before this plan saw it would be skipped, silently."""
    assert OffsetRange("b", 0, 5, 8) in running_from_latest(A).ranges


def test_a_topic_accepted_anew_by_a_decision_restarts_at_the_starting_offsets() -> None:
    """`exactly skip new-topic` is an operator's decision that positions restart at
    `starting_offsets` (ledger/core/decisions.py): it keeps doing so on a running pipeline."""
    accepted = apply_decisions(
        Positions({0: 3}, topic="b", topic_id="old-b"),
        1,
        [
            Decision(
                id="d-1",
                pipeline="orders",
                app_id="orders",
                kind=DecisionKind.NEW_TOPIC,
                topic="b",
                topic_id="id-b",
                previous_topic_id="old-b",
                after_batch_id=1,
                reason="re-created",
                decided_by="alice",
                decided_at=datetime(2026, 11, 28, tzinfo=UTC),
            )
        ],
    )
    plan = plan_topics(
        ("a", "b"),
        {"a": Positions({0: 10, 1: 4}, topic="a", topic_id="id-a"), "b": accepted},
        reads(a=TopicRead("id-a", A), b=TopicRead("id-b", B)),
        max_records_per_partition=100,
        starting_offsets="latest",
    )
    assert OffsetRange("b", 0, 8, 8) in plan.ranges
    assert plan.worth_planning  # b's start must be pinned


def test_a_partition_added_to_a_topic_already_read_starts_at_its_earliest() -> None:
    """`latest` pins where the pipeline starts each topic, not where a partition added to
    a topic it reads starts: that one holds only records produced since."""
    grown = {**A, 2: Available(2, 9)}
    assert OffsetRange("a", 2, 2, 9) in running_from_latest(grown).ranges


def test_caught_up_on_every_topic_is_not_worth_a_batch() -> None:
    plan = plan_topics(
        ("a", "b"),
        {
            "a": Positions({0: 10, 1: 4}, topic="a", topic_id="id-a"),
            "b": Positions({0: 8}, topic="b", topic_id="id-b"),
        },
        reads(a=TopicRead("id-a", A), b=TopicRead("id-b", B)),
        max_records_per_partition=100,
    )
    assert not plan.worth_planning


def test_a_recreated_topic_stops_the_plan_naming_it_and_the_skip_command() -> None:
    with pytest.raises(TopicChangedError) as info:
        plan_topics(
            ("a", "b"),
            {
                "a": Positions({0: 3, 1: 4}, topic="a", topic_id="id-a"),
                "b": Positions({0: 6}, topic="b", topic_id="id-b-old"),
            },
            reads(a=TopicRead("id-a", A), b=TopicRead("id-b", B)),
            max_records_per_partition=100,
        )
    message = str(info.value)
    assert message.startswith("topic b: ")
    assert "exactly skip new-topic" in message
    assert "--topic b --topic-id id-b" in message


def test_a_topic_with_positions_that_is_no_longer_read_stops_the_plan() -> None:
    """A pattern's topic that was deleted (or a name dropped from the list): its unread
    records would be lost without anyone deciding so (invariant 8)."""
    with pytest.raises(TopicChangedError) as info:
        plan_topics(
            ("a",),
            {
                "a": Positions({0: 3, 1: 4}, topic="a", topic_id="id-a"),
                "gone": Positions({0: 6}, topic="gone", topic_id="id-gone"),
            },
            reads(a=TopicRead("id-a", A)),
            max_records_per_partition=100,
        )
    assert str(info.value).startswith("topic gone: ")
    assert "no longer" in str(info.value)


def test_lost_offsets_on_one_topic_name_that_topic() -> None:
    with pytest.raises(DataLossError) as info:
        plan_topics(
            ("a", "b"),
            {"b": Positions({0: 2}, topic="b", topic_id="id-b")},
            reads(a=TopicRead("id-a", A), b=TopicRead("id-b", B)),
            max_records_per_partition=100,
        )
    assert str(info.value).startswith("b-0: offsets [2, 5)")


def test_positions_are_split_by_topic_with_each_topics_id() -> None:
    ranges = [OffsetRange("a", 0, 0, 3), OffsetRange("a", 1, 0, 4), OffsetRange("b", 0, 5, 8)]
    split = positions_by_topic(ranges, {"a": "id-a", "b": "id-b"})
    assert split == {"a": {0: 3, 1: 4}, "b": {0: 8}}
    assert (split["a"].topic, split["a"].topic_id) == ("a", "id-a")
    assert (split["b"].topic, split["b"].topic_id) == ("b", "id-b")


def test_positions_recorded_before_topic_ids_carry_none() -> None:
    split = positions_by_topic([OffsetRange("a", 0, 0, 3)], {})
    assert split["a"].topic_id is None
