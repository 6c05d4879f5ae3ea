"""The protocol's offset source (ledger/coordinator/two_phase.py `OffsetSource`) on a Kafka topic.

What the coordinator needs from Kafka is small: the offsets each partition holds now, and
the advisory consumer-group commit after a batch. The group's lag is read here too, so an
orchestrator shows it without reaching into the Kafka client.
"""

from __future__ import annotations

from collections.abc import Sequence

from ledger.core.protocol import Available, OffsetRange
from resources.kafka.client import KafkaClient


class KafkaOffsetSource:
    """Offsets as Kafka reports them, and the advisory consumer-group commit."""

    def __init__(self, client: KafkaClient, topic: str, group_id: str) -> None:
        self.client = client
        self.topic = topic
        self.group_id = group_id

    def available(self) -> dict[int, Available]:
        parts = self.client.partitions(self.topic)
        return {
            p: Available(o.earliest, o.last_stable)
            for p, o in self.client.offsets(self.topic, parts).items()
        }

    def topic_id(self) -> str:
        return self.client.topic_id(self.topic)

    def ack(self, ranges: Sequence[OffsetRange]) -> None:
        self.client.commit_group_offsets(
            self.group_id, self.topic, {r.partition: r.end for r in ranges}
        )

    def consumer_lag(self) -> dict[int, int]:
        """Offsets between the group's position and the last stable offset, per partition.

        A partition the group never committed counts from its earliest offset. Advisory, as
        the group is: the ledger, not the group, says what is committed.
        """
        available = self.available()
        group = self.client.group_offsets(self.group_id, self.topic)
        return {p: a.last_stable - group.get(p, a.earliest) for p, a in sorted(available.items())}
