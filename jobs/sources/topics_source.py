"""The offset source of a pipeline on several topics (ledger/coordinator/topics.py
`TopicsSource`) on Kafka: `kafka.topics` or `kafka.pattern`.

The selection is resolved against the topics the cluster lists at each call of `topics()`
(at each plan), so a topic created later that matches a pattern is read from the batch
planned after it exists. A named topic that Kafka does not list is still returned: reading
its id then fails loudly ("does not exist"), and planning stops naming it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from jobs.sources.offset_source import KafkaOffsetSource
from ledger.core.protocol import Available, OffsetRange
from resources.kafka.client import KafkaClient
from resources.kafka.topic_selection import TopicSelection

if TYPE_CHECKING:
    from resources.config.kafka_settings import KafkaSettings


class KafkaTopicsSource:
    """Several topics' ids and offsets as Kafka reports them, and the advisory group commit."""

    def __init__(self, client: KafkaClient, selection: TopicSelection, group_id: str) -> None:
        self.client = client
        self.selection = selection
        self.group_id = group_id

    def topics(self) -> tuple[str, ...]:
        if not self.selection.is_pattern:
            return self.selection.names
        return self.selection.resolve(self.client.topic_names())

    def topic_id_of(self, topic: str) -> str:
        return self.client.topic_id(topic)

    def exists(self, topic: str) -> bool:
        return topic in self.client.topic_names()

    def available_of(self, topic: str) -> dict[int, Available]:
        parts = self.client.partitions(topic)
        return {
            p: Available(o.earliest, o.last_stable)
            for p, o in self.client.offsets(topic, parts).items()
        }

    def ack(self, ranges: Sequence[OffsetRange]) -> None:
        """One group commit per topic. Advisory, as for one topic: a commit refused part way
        leaves some topics behind, and the next successful ack catches them up."""
        for topic in sorted({r.topic for r in ranges}):
            ends = {r.partition: r.end for r in ranges if r.topic == topic}
            self.client.commit_group_offsets(self.group_id, topic, ends)

    def consumer_lag(self) -> dict[str, int]:
        """Offsets between the group's position and the last stable offset, per
        `topic-partition`, on the topics read now; a partition the group never committed
        counts from its earliest offset."""
        lag = {}
        for topic in self.topics():
            group = self.client.group_offsets(self.group_id, topic)
            for p, a in sorted(self.available_of(topic).items()):
                lag[f"{topic}-{p}"] = a.last_stable - group.get(p, a.earliest)
        return lag


def offset_source_for(
    client: KafkaClient, kafka: KafkaSettings, group_id: str
) -> KafkaOffsetSource | KafkaTopicsSource:
    """The source a pipeline's config asks for: `kafka.topic` the one-topic source;
    `kafka.topics` or `kafka.pattern` reads several topics."""
    if kafka.topic is not None:
        return KafkaOffsetSource(client, kafka.topic, group_id)
    return KafkaTopicsSource(client, kafka.selection(), group_id)
