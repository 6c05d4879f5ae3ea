"""Producing records, each call with a fresh idempotent producer, returning only once
every record is acknowledged by all replicas, and checking the acknowledgements.

Producing is bounded by `message.timeout.ms` (the connection's timeout), and an
acknowledgement at an offset the partition already had is caught (`Deliveries`) rather than
counted as written.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from ledger.core.errors import ExactlyError, UnreachableError
from resources.kafka.connection import KafkaConnection


def _to_bytes(value: bytes | str | None) -> bytes | None:
    return value.encode("utf-8") if isinstance(value, str) else value


class Deliveries:
    """Delivery reports of one idempotent producer, checked as they arrive.

    Reports of one idempotent producer come in order per partition, so offsets must rise
    strictly: an acknowledgement at or below the partition's previous offset is a record the
    broker took for a retry of one it already had, and did not write. Kept to a few numbers
    per partition so that millions of records cost no memory.
    """

    def __init__(self) -> None:
        self.failures: list[KafkaError] = []
        self.overlaps: list[tuple[int, int, int]] = []  # (partition, previous, offset)
        self._last: dict[int, int] = {}

    def report(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.failures.append(error)
            return
        partition, offset = message.partition(), message.offset()
        previous = self._last.get(partition, -1)
        if offset <= previous:
            self.overlaps.append((partition, previous, offset))
        self._last[partition] = max(previous, offset)


class Producing(KafkaConnection):
    """Producing to one cluster's topics."""

    def _produce_timeout(self) -> float:
        return self.timeout + 10

    def _new_producer(self) -> Producer:
        """An idempotent producer for one `produce` call: retries can neither duplicate nor
        reorder records.

        Not shared across calls: an idempotent producer's per-partition sequence numbers are
        client state, and a long-lived one that forgets a partition (metadata flapping while
        topics come and go) restarts its sequence at 0, which the broker may then take for a
        retry and acknowledge without writing. A fresh producer has a fresh producer id.
        """
        return Producer(
            self._config(
                {
                    "acks": "all",
                    "enable.idempotence": True,
                    "linger.ms": 5,
                    "message.timeout.ms": int(self.timeout * 1000),
                }
            )
        )

    def produce(
        self,
        topic: str,
        values: Iterable[bytes | str],
        partition: int | None = None,
        key: bytes | str | None = None,
    ) -> int:
        """Produce `values` in order and wait until every one is acknowledged; return the count.

        Returning means all records are durable (acks=all); any failed delivery raises.
        """
        return self._produce_all(topic, ((partition, key, v) for v in values))

    def produce_to_partitions(
        self, topic: str, by_partition: Mapping[int, Iterable[bytes | str]]
    ) -> int:
        """Produce each partition's values, in order, to that partition; return the count."""
        items = ((p, None, v) for p, values in by_partition.items() for v in values)
        return self._produce_all(topic, items)

    def produce_records(
        self,
        topic: str,
        records: Iterable[tuple[int | None, bytes | str | None, bytes | str | None]],
    ) -> int:
        """Produce (partition, key, value) records in order; a None value is a tombstone
        (how a compacted topic deletes a key). Returns the count, all acknowledged."""
        return self._produce_all(topic, records)

    def _produce_all(
        self,
        topic: str,
        items: Iterable[tuple[int | None, bytes | str | None, bytes | str | None]],
    ) -> int:
        producer = self._new_producer()
        deliveries = Deliveries()
        count = 0
        try:
            for partition, key, value in items:
                self._enqueue(producer, topic, partition, key, value, deliveries.report)
                count += 1
            self._flush(producer, topic)
        except BaseException:
            producer.purge()  # so that close() does not wait for records nobody will see
            raise
        finally:
            producer.close()
        if deliveries.failures:
            raise self._error(
                f"producing {count} records to topic {topic!r} "
                f"({len(deliveries.failures)} not delivered)",
                deliveries.failures[0],
            )
        if deliveries.overlaps:
            partition, previous, offset = deliveries.overlaps[0]
            raise ExactlyError(
                f"Kafka at {self.bootstrap_servers} acknowledged {len(deliveries.overlaps)} of "
                f"{count} records for topic {topic!r} at offsets already taken (first: "
                f"partition {partition} offset {offset} after {previous}); they were not written"
            )
        return count

    def _enqueue(
        self,
        producer: Producer,
        topic: str,
        partition: int | None,
        key: bytes | str | None,
        value: bytes | str | None,
        on_delivery: Any,
    ) -> None:
        """Queue one record, waiting (bounded) for room when the local queue is full."""
        kwargs: dict[str, Any] = {"value": _to_bytes(value), "on_delivery": on_delivery}
        if partition is not None:
            kwargs["partition"] = partition
        if key is not None:
            kwargs["key"] = _to_bytes(key)
        deadline = time.monotonic() + self._produce_timeout()
        while True:
            try:
                producer.produce(topic, **kwargs)
                return
            except BufferError:
                if time.monotonic() > deadline:
                    raise UnreachableError(
                        f"Kafka at {self.bootstrap_servers} accepted no records for topic "
                        f"{topic!r} within {self._produce_timeout():g}s (local queue full)"
                    ) from None
                producer.poll(0.1)
            except KafkaException as exc:
                raise self._from_exception(f"producing to topic {topic!r}", exc) from exc

    def _flush(self, producer: Producer, topic: str) -> None:
        # message.timeout.ms bounds every record's delivery, so this flush always returns.
        remaining = producer.flush(self._produce_timeout())
        if remaining:
            raise UnreachableError(
                f"Kafka at {self.bootstrap_servers} did not acknowledge {remaining} records "
                f"for topic {topic!r} within {self._produce_timeout():g}s"
            )
