"""Which topics a pipeline reads: one name, a list of names, or a pattern.

The config (resources/config/kafka_settings.py `KafkaSettings.selection`) gives one of the three.
A pattern is resolved against the topics Kafka lists at each plan, never once at start-up: a topic
created later that matches is read from its first record by the first batch planned after
it exists (ledger/core/topic_plan.py: `kafka.starting_offsets` is where the pipeline starts),
as Structured Streaming's `subscribePattern` and Kafka Connect's `topics.regex` do. The set a
batch was planned on is recorded with its ranges (one range per partition of every matched
topic, each with the topic's id), so a re-stage after a crash reads exactly those ranges
even if the pattern matches more by then.

Matching is a full match (Java's `Pattern.matches`, which Kafka's clients and Spark use;
Python's `re.fullmatch` here): `orders-.*` matches `orders-eu`, not `old-orders-eu`.
Kafka's internal topics are never matched, as the Java consumer's default
`exclude.internal.topics=true` does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

#: Kafka's own legal topic names (kafka.common.internals.Topic): at most 249 characters of
#: ASCII letters, digits, '.', '_' and '-', and not '.' or '..'.
_LEGAL_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
#: Topics the brokers keep for themselves (Topic.INTERNAL_TOPICS); a pattern never reads them.
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})


def check_topic_name(name: str) -> str:
    """`name` if Kafka would accept it as a topic name, else ValueError saying why: a name
    Kafka cannot hold can only be a typo, found here rather than at the first plan."""
    if not _LEGAL_NAME.fullmatch(name) or name in (".", ".."):
        raise ValueError(
            f"{name!r} is not a Kafka topic name (1-249 of letters, digits, '.', '_', '-')"
        )
    return name


def check_pattern(pattern: str) -> str:
    """`pattern` if it compiles, else ValueError naming the regular expression's problem."""
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"not a regular expression: {exc}") from None
    return pattern


@dataclass(frozen=True)
class TopicSelection:
    """The topics of a pipeline: `names` (one or more, in config order) or a `pattern`."""

    names: tuple[str, ...] = ()
    pattern: str | None = None

    def __post_init__(self) -> None:
        if bool(self.names) == (self.pattern is not None):
            raise ValueError("a topic selection is names or a pattern, exactly one of them")

    @property
    def is_pattern(self) -> bool:
        return self.pattern is not None

    def matches(self, topic: str) -> bool:
        """Whether `topic` is one this pipeline reads."""
        if self.pattern is None:
            return topic in self.names
        return topic not in INTERNAL_TOPICS and re.fullmatch(self.pattern, topic) is not None

    def resolve(self, existing: Iterable[str]) -> tuple[str, ...]:
        """The topics to plan on, given the topics Kafka lists now.

        Names are returned as configured whether Kafka lists them or not: a named topic that
        is missing is the caller's loud error (a deleted topic is never silently dropped).
        A pattern yields the listed topics it matches, sorted, so the same listing always
        plans the same ranges in the same order.
        """
        if self.pattern is None:
            return self.names
        return tuple(sorted({t for t in existing if self.matches(t)}))

    def describe(self) -> str:
        """For messages: `topic a`, `topics a, b` or `topics matching 'orders-.*'`."""
        if self.pattern is not None:
            return f"topics matching {self.pattern!r}"
        if len(self.names) == 1:
            return f"topic {self.names[0]}"
        return "topics " + ", ".join(self.names)


def check_topic_list(names: list[str]) -> list[str]:
    """`kafka.topics`: legal names, each once (twice would plan its ranges twice)."""
    seen: set[str] = set()
    for name in names:
        check_topic_name(name)
        if name in seen:
            raise ValueError(f"topic {name!r} is listed twice")
        seen.add(name)
    return names


def check_one_selection(topic: str | None, topics: list[str] | None, pattern: str | None) -> None:
    """Exactly one of `kafka.topic`, `kafka.topics`, `kafka.pattern`: two would leave which
    topics the ledger's positions belong to to a silent rule."""
    given = [v for v in (topic, topics, pattern) if v is not None]
    if len(given) > 1:
        raise ValueError(
            "give only one of kafka.topic, kafka.topics, kafka.pattern (they are three ways "
            "to name the topics a pipeline reads)"
        )
    if not given:
        raise ValueError(
            "kafka.topic: required key is missing (or give kafka.topics: [a, b] or "
            "kafka.pattern: 'regex')"
        )
