"""resources/kafka/topic_selection.py: which topics a name list or a pattern reads."""

from __future__ import annotations

import pytest

from resources.kafka.topic_selection import TopicSelection

LISTED = ["orders-eu", "orders-us", "old-orders-eu", "orders", "__consumer_offsets", "refunds"]


def test_names_are_read_as_configured_even_when_kafka_does_not_list_them() -> None:
    """A named topic that is gone must reach the planner, which stops loudly on it."""
    assert TopicSelection(names=("b", "a")).resolve(["a"]) == ("b", "a")


def test_a_pattern_is_a_full_match_like_javas_pattern_matches() -> None:
    selection = TopicSelection(pattern="orders-.*")
    assert selection.resolve(LISTED) == ("orders-eu", "orders-us")
    assert not selection.matches("old-orders-eu")
    assert not selection.matches("orders")


def test_a_pattern_never_reads_kafkas_internal_topics() -> None:
    assert TopicSelection(pattern=".*").resolve(LISTED) == (
        "old-orders-eu",
        "orders",
        "orders-eu",
        "orders-us",
        "refunds",
    )


def test_the_same_listing_resolves_the_same_whatever_its_order() -> None:
    selection = TopicSelection(pattern="orders.*")
    assert selection.resolve(LISTED) == selection.resolve(reversed(LISTED))


@pytest.mark.parametrize("kwargs", [{}, {"names": ("a",), "pattern": "a"}])
def test_a_selection_is_names_or_a_pattern(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        TopicSelection(**kwargs)  # type: ignore[arg-type]


def test_descriptions_name_what_is_read() -> None:
    assert TopicSelection(names=("a",)).describe() == "topic a"
    assert TopicSelection(names=("a", "b")).describe() == "topics a, b"
    assert TopicSelection(pattern="o-.*").describe() == "topics matching 'o-.*'"
