"""Admin reads and writes of topics: listing, creating, partitions, topic ids, and the
offsets a batch is planned over.

Offsets are read at `READ_COMMITTED`, so the end of a partition is its last stable offset
(LSO): a batch planned up to it can never include records of a transaction that might still
abort. Topics are described (DescribeTopics), never asked for through a metadata request, so
that asking can never auto-create one on a broker that allows it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import (
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import NewTopic, OffsetSpec

from ledger.core.errors import ExactlyError, UnreachableError
from ledger.core.protocol import Available
from resources.kafka.connection import KafkaConnection

#: Leadership moves (a new topic, a restarted broker): the next metadata refresh fixes it.
#: The leader-epoch and high-watermark answers come while a new leader takes over (seen on a
#: loaded machine right after a topic was created); Kafka's Java client retries them too.
_RETRIABLE_LEADER_CODES = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.REPLICA_NOT_AVAILABLE,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.OFFSET_NOT_AVAILABLE,
    }
)

_TOPIC_NAME_UNSAFE = re.compile(r"[^a-zA-Z0-9._-]+")


def safe_topic_name(text: str, max_length: int = 200) -> str:
    """`text` with every character Kafka forbids in a topic name replaced by `-`."""
    return _TOPIC_NAME_UNSAFE.sub("-", text).strip("-.")[:max_length] or "topic"


class TopicAdmin(KafkaConnection):
    """Topics and their offsets on one cluster, through the connection's admin client."""

    def topic_names(self) -> list[str]:
        """Every topic the cluster lists now (a pattern is resolved against it, at each plan:
        resources/kafka/topic_selection.py); internal ones included, the selection leaves them."""
        return sorted(self.check_reachable(timeout=self.timeout).topics)

    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int = 1,
        config: Mapping[str, str] | None = None,
    ) -> bool:
        """Create `name`; True if created, False if it already existed with `partitions`.

        An existing topic with another partition count is an error, never silently accepted:
        the pipeline maps offsets per partition, and a different count means a different topic
        than the caller planned for. Returns only once every partition has a leader, so that
        producing or listing offsets right after cannot hit a not-yet-propagated topic.
        """
        if partitions < 1:
            raise ExactlyError(f"topic {name!r} needs at least 1 partition, not {partitions}")
        new_topic = NewTopic(
            name,
            num_partitions=partitions,
            replication_factor=replication_factor,
            config=dict(config or {}),
        )
        futures = self._admin_client().create_topics(
            [new_topic], request_timeout=self.timeout, operation_timeout=self.timeout
        )
        outcome = self._wait(
            futures[name],
            f"creating topic {name!r}",
            tolerate=frozenset({KafkaError.TOPIC_ALREADY_EXISTS}),
        )
        if isinstance(outcome, KafkaError):
            self._require_partition_count(name, partitions)
            return False
        self._await_leaders(name, partitions)
        return True

    def _require_partition_count(self, name: str, partitions: int) -> None:
        existing = len(self.partitions(name))
        if existing != partitions:
            raise ExactlyError(
                f"topic {name!r} on Kafka at {self.bootstrap_servers} already exists with "
                f"{existing} partitions, not {partitions}"
            )

    def _await_leaders(self, name: str, partitions: int) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            description = self._describe(name)
            if description is not None:
                leaders = [p for p in description.partitions if p.leader is not None]
                if len(leaders) == partitions:
                    return
            time.sleep(0.1)
        raise UnreachableError(
            f"Kafka at {self.bootstrap_servers}: topic {name!r} was created but its "
            f"{partitions} partitions had no leader within {self.timeout:g}s"
        )

    def _describe(self, topic: str) -> Any | None:
        """The topic's description, or None if the cluster does not know it."""
        futures = self._admin_client().describe_topics(
            TopicCollection([topic]), request_timeout=self.timeout
        )
        outcome = self._wait(
            futures[topic],
            f"describing topic {topic!r}",
            tolerate=frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART}),
        )
        return None if isinstance(outcome, KafkaError) else outcome

    def partitions(self, topic: str) -> list[int]:
        """The topic's partition ids; a missing topic is an error, never an empty list.

        Uses DescribeTopics rather than a metadata request so that asking can never
        auto-create the topic on a broker that allows it.
        """
        description = self._describe(topic)
        if description is None:
            raise ExactlyError(
                f"topic {topic!r} does not exist on Kafka at {self.bootstrap_servers}"
            )
        return sorted(p.id for p in description.partitions)

    def topic_id(self, topic: str) -> str:
        """Kafka's id of the topic's current incarnation (KIP-516), as its tools print it.

        A topic deleted and re-created under the same name gets a new id, so the id tells
        offsets of one incarnation from the other's. A cluster that reports no id (brokers
        older than Kafka 2.8) is an error: without it a re-created topic cannot be told.
        """
        description = self._describe(topic)
        if description is None:
            raise ExactlyError(
                f"topic {topic!r} does not exist on Kafka at {self.bootstrap_servers}"
            )
        uuid = description.topic_id
        if uuid is None or (
            uuid.get_most_significant_bits() == 0 and uuid.get_least_significant_bits() == 0
        ):
            raise ExactlyError(
                f"Kafka at {self.bootstrap_servers} reports no topic id for topic {topic!r} "
                "(brokers before Kafka 2.8 have none); exactly needs it to tell a re-created "
                "topic from the one it read"
            )
        return str(uuid)

    # -- offsets -----------------------------------------------------------------------------

    def offsets(self, topic: str, partitions: Iterable[int] | None = None) -> dict[int, Available]:
        """Earliest offset and last stable offset of each partition (all if `partitions` is None).

        Both are asked at READ_COMMITTED: the end is the LSO, not the high watermark, so records
        of open transactions are never inside the range. The LSO is the first offset a
        read_committed reader may not see yet, not a record count: aborted records and
        transaction markers occupy offsets too, so `last_stable - earliest` may exceed the
        number of committed records.
        """
        wanted = sorted(set(self.partitions(topic) if partitions is None else partitions))
        if not wanted:
            return {}
        earliest = self._list_offsets(topic, wanted, OffsetSpec.earliest(), "earliest")
        latest = self._list_offsets(topic, wanted, OffsetSpec.latest(), "last stable")
        return {p: Available(earliest[p], latest[p]) for p in wanted}

    def _list_offsets(
        self, topic: str, partitions: list[int], spec: OffsetSpec, label: str
    ) -> dict[int, int]:
        operation = f"listing {label} offsets of topic {topic!r} partitions {partitions}"
        found: dict[int, int] = {}
        deadline = time.monotonic() + self.timeout
        while True:
            request = {TopicPartition(topic, p): spec for p in partitions if p not in found}
            try:
                futures = self._admin_client().list_offsets(
                    request,
                    isolation_level=IsolationLevel.READ_COMMITTED,
                    request_timeout=self.timeout,
                )
            except KafkaException as exc:
                raise self._from_exception(operation, exc) from exc
            last: KafkaError | None = None
            for tp, future in futures.items():
                result = self._wait(future, operation, tolerate=_RETRIABLE_LEADER_CODES)
                if isinstance(result, KafkaError):
                    last = result
                else:
                    found[tp.partition] = result.offset
            if last is None:
                return found
            if time.monotonic() >= deadline:
                raise self._error(operation, last)
            time.sleep(0.2)
