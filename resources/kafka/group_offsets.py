"""Consumer-group offsets: committing a batch's ends for a group (the ack) and reading
them back, each retried while the group coordinator is not ready yet.

Nothing here joins a group: a commit goes through the admin API and a read through a
consumer that never subscribes, so neither ever triggers a rebalance of real consumers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from ledger.core.errors import ExactlyError
from resources.kafka.topic_admin import TopicAdmin

# Group coordinator answers that only mean "not ready yet, ask again".
_RETRIABLE_GROUP_CODES = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.UNSTABLE_OFFSET_COMMIT,
        KafkaError._WAIT_COORD,
    }
)


class GroupOffsets(TopicAdmin):
    """A consumer group's committed offsets on one topic (the topic's partitions are read
    through `TopicAdmin`)."""

    def commit_group_offsets(self, group_id: str, topic: str, offsets: Mapping[int, int]) -> None:
        """Commit `offsets` (partition -> next offset to read) for `group_id`, synchronously.

        Goes through the admin API, so nothing joins the group: committing never triggers a
        rebalance of real consumers, and it fails loudly if the group has active members.
        """
        if not offsets:
            return
        negative = {p: o for p, o in offsets.items() if o < 0}
        if negative:
            raise ExactlyError(f"cannot commit negative offsets {negative} for group {group_id!r}")
        partitions = [TopicPartition(topic, p, o) for p, o in sorted(offsets.items())]
        operation = f"committing offsets of group {group_id!r} on topic {topic!r}"

        def attempt() -> Any:
            futures = self._admin_client().alter_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group_id, partitions)],
                request_timeout=self.timeout,
            )
            result = self._wait(futures[group_id], operation, tolerate=_RETRIABLE_GROUP_CODES)
            if isinstance(result, KafkaError):
                return result
            failed = [tp.error for tp in result.topic_partitions if tp.error is not None]
            return failed[0] if failed else result

        self._group_call(operation, attempt)

    def group_offsets(self, group_id: str, topic: str) -> dict[int, int]:
        """The group's committed offsets on `topic`; partitions never committed are absent.

        Read by a consumer of the group that never subscribes, so nothing joins the group.
        Not through the admin API: librdkafka's ListConsumerGroupOffsets kills the process
        (SIGSEGV) when the coordinator answers NOT_COORDINATOR, as it does while a cluster
        loads its group metadata (librdkafka issue 5040); a consumer's fetch fails with that
        error instead, and it is retried like every group call's. The read_committed
        isolation level makes the broker wait for pending transactional offset commits
        (require_stable, KIP-447), so the answer never reflects a transaction that might
        still abort.
        """
        operation = f"reading offsets of group {group_id!r} on topic {topic!r}"
        wanted = [TopicPartition(topic, p) for p in self.partitions(topic)]
        consumer = Consumer(
            self._config(
                {
                    "group.id": group_id,
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                }
            )
        )

        def attempt() -> Any:
            try:
                committed = consumer.committed(wanted, timeout=self.timeout)
            except KafkaException as exc:
                return exc.args[0]  # _group_call retries what is retriable, raises the rest
            failed = [tp.error for tp in committed if tp.error is not None]
            return failed[0] if failed else committed

        try:
            committed = self._group_call(operation, attempt)
        finally:
            consumer.close()
        return {tp.partition: tp.offset for tp in committed if tp.offset >= 0}

    def _group_call(self, operation: str, attempt: Callable[[], Any]) -> Any:
        """Run `attempt` until it returns something other than a retriable KafkaError.

        The first group operation on a fresh cluster creates `__consumer_offsets`; until its
        partitions are loaded the coordinator answers NOT_COORDINATOR or LOAD_IN_PROGRESS,
        which are a matter of seconds, not failures. Bounded by `self.timeout`.
        """
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                outcome = attempt()
            except KafkaException as exc:
                raise self._from_exception(operation, exc) from exc
            if not isinstance(outcome, KafkaError):
                return outcome
            if outcome.code() not in _RETRIABLE_GROUP_CODES or time.monotonic() > deadline:
                raise self._error(operation, outcome)
            time.sleep(0.2)
