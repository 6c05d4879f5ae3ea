"""jobs/sources/topics_source.py against the real broker: the topics a list or a pattern reads
now, each topic's id and offsets, and the consumer group's commit on every topic."""

from __future__ import annotations

import uuid

import pytest

from jobs.sources.topics_source import KafkaTopicsSource
from ledger.core.protocol import OffsetRange
from resources.kafka.client import KafkaClient
from resources.kafka.topic_selection import TopicSelection
from tests.fixtures.topic_admin import topic_id_of


@pytest.fixture
def prefix() -> str:
    return f"tsrc-{uuid.uuid4().hex[:8]}"


def test_a_pattern_reads_the_topics_that_match_now(
    kafka_client: KafkaClient, kafka_broker: str, prefix: str
) -> None:
    kafka_client.create_topic(f"{prefix}-a", 2)
    kafka_client.create_topic(f"{prefix}-b", 1)
    kafka_client.create_topic(f"x{prefix}-c", 1)  # matches by search, not by full match
    source = KafkaTopicsSource(kafka_client, TopicSelection(pattern=f"{prefix}-.*"), "g")
    assert source.topics() == (f"{prefix}-a", f"{prefix}-b")
    kafka_client.create_topic(f"{prefix}-0", 1)
    assert source.topics() == (f"{prefix}-0", f"{prefix}-a", f"{prefix}-b")
    assert source.topic_id_of(f"{prefix}-a") == topic_id_of(kafka_broker, f"{prefix}-a")


def test_offsets_and_the_group_commit_are_per_topic(kafka_client: KafkaClient, prefix: str) -> None:
    a, b = f"{prefix}-a", f"{prefix}-b"
    kafka_client.create_topic(a, 2)
    kafka_client.create_topic(b, 1)
    kafka_client.produce_to_partitions(a, {0: ["1", "2", "3"], 1: ["4"]})
    kafka_client.produce_to_partitions(b, {0: ["5", "6"]})
    source = KafkaTopicsSource(kafka_client, TopicSelection(names=(a, b)), f"{prefix}-group")
    assert source.topics() == (a, b)
    assert {p: o.last_stable for p, o in source.available_of(a).items()} == {0: 3, 1: 1}
    assert {p: o.last_stable for p, o in source.available_of(b).items()} == {0: 2}
    source.ack([OffsetRange(a, 0, 0, 3), OffsetRange(a, 1, 0, 1), OffsetRange(b, 0, 0, 1)])
    assert kafka_client.group_offsets(f"{prefix}-group", a) == {0: 3, 1: 1}
    assert kafka_client.group_offsets(f"{prefix}-group", b) == {0: 1}
    assert source.consumer_lag() == {f"{a}-0": 0, f"{a}-1": 0, f"{b}-0": 1}


def test_a_named_topic_that_does_not_exist_is_a_loud_error(
    kafka_client: KafkaClient, prefix: str
) -> None:
    source = KafkaTopicsSource(kafka_client, TopicSelection(names=(f"{prefix}-gone",)), "g")
    assert source.topics() == (f"{prefix}-gone",)
    with pytest.raises(Exception, match=f"topic '{prefix}-gone' does not exist"):
        source.topic_id_of(f"{prefix}-gone")
