"""resources/config/kafka_settings.py: `kafka.topic`, `kafka.topics` and `kafka.pattern` (one of
them).

A pipeline reads one topic, a list of topics, or every topic a pattern matches at each
plan; naming two of these is ambiguous (which positions does the ledger keep?), so it is
one config error line naming the fields, never a silent choice.
"""

from __future__ import annotations

from typing import Any

import pytest

from resources.config.loading import parse_config
from tests.test_config import config_error, config_with


def test_one_topic_keeps_working_as_before() -> None:
    config = parse_config(config_with())
    assert config.kafka.topic == "orders"
    assert config.kafka.selection().names == ("orders",)
    assert config.kafka.selection().pattern is None


def test_a_list_of_topics_loads_in_the_given_order() -> None:
    config = parse_config(config_with(kafka__topic=None, kafka__topics=["b", "a"]))
    assert config.kafka.topic is None
    assert config.kafka.selection().names == ("b", "a")


def test_a_pattern_loads() -> None:
    config = parse_config(config_with(kafka__topic=None, kafka__pattern="orders-.*"))
    selection = config.kafka.selection()
    assert selection.pattern == "orders-.*"
    assert selection.names == ()


@pytest.mark.parametrize(
    "changes",
    [
        {"kafka__topics": ["a"]},
        {"kafka__pattern": "a.*"},
        {"kafka__topic": None, "kafka__topics": ["a"], "kafka__pattern": "a.*"},
    ],
)
def test_two_ways_of_naming_topics_are_one_error_line(changes: dict[str, Any]) -> None:
    message = config_error(config_with(**changes))
    assert "kafka: Value error, give only one of kafka.topic, kafka.topics, kafka.pattern" in (
        message
    )
    assert "\n" not in message


def test_none_of_them_still_names_kafka_topic_as_missing() -> None:
    message = config_error(config_with(kafka__topic=None))
    assert "kafka.topic: required key is missing" in message
    assert "kafka.topics" in message and "kafka.pattern" in message


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"kafka__topics": []}, "kafka.topics: List should have at least 1 item"),
        ({"kafka__topics": ["a", ""]}, "kafka.topics: Value error, '' is not a Kafka topic name"),
        (
            {"kafka__topics": ["a", "b", "a"]},
            "kafka.topics: Value error, topic 'a' is listed twice",
        ),
        ({"kafka__topics": ["a b"]}, "kafka.topics: Value error, 'a b' is not a Kafka topic name"),
        ({"kafka__pattern": "orders-(["}, "kafka.pattern: Value error, not a regular expression"),
        ({"kafka__pattern": ""}, "kafka.pattern: String should have at least 1 character"),
    ],
)
def test_bad_topic_lists_and_patterns_are_named(changes: dict[str, Any], named: str) -> None:
    message = config_error(config_with(kafka__topic=None, **changes))
    assert named in message
