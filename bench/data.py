"""The benchmark's data set: page-view JSON records spread evenly over a topic's partitions.

Produced once per run and read by every contender, so all of them see exactly the same
records, offsets and segment files (and the same warm page cache).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from jobs.examples.sample_data import pageviews
from resources.kafka.client import KafkaClient

#: One record in this many cannot be parsed, so the quarantine path is always exercised.
MALFORMED_EVERY = 1_000


@dataclass(frozen=True)
class DataSet:
    """What was produced: enough to turn seconds into records/s and MiB/s."""

    topic: str
    partitions: int
    records: int
    value_bytes: int
    malformed: int
    produce_seconds: float

    @property
    def mean_record_bytes(self) -> float:
        return self.value_bytes / self.records if self.records else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "mean_record_bytes": round(self.mean_record_bytes, 1)}


def split(records: int, partitions: int) -> list[int]:
    """Records per partition, as even as possible (the first ones take the remainder)."""
    base, extra = divmod(records, partitions)
    return [base + (1 if p < extra else 0) for p in range(partitions)]


def _values(start: int, count: int, record_bytes: int, sizes: list[int]) -> Iterator[bytes]:
    """The page views of one partition, noting each size as it goes to the producer."""
    for value in pageviews(
        count, start=start, pad_to=record_bytes, malformed_every=MALFORMED_EVERY
    ):
        sizes.append(len(value))
        yield value


def produce(
    client: KafkaClient,
    topic: str,
    *,
    records: int,
    partitions: int,
    record_bytes: int,
    first: int = 0,
) -> DataSet:
    """Create `topic` and fill each partition with its share of deterministic page views.

    Partition p holds events [start_p, start_p + n_p), so the whole set is the same on every
    run with the same size; records are generated lazily, never all held in memory. The
    events are [first, first + records): a data set split over several topics (the scale
    section's four pipelines) is then exactly the one topic's events, cut in slices.
    """
    client.create_topic(topic, partitions)
    sizes: list[int] = []
    started = time.perf_counter()
    by_partition: dict[int, Iterator[bytes]] = {}
    start = first
    for partition, count in enumerate(split(records, partitions)):
        by_partition[partition] = _values(start, count, record_bytes, sizes)
        start += count
    # one producer for every partition: a producer per partition costs its start-up (about
    # half a second here) per partition, minutes for the scale section's 256 partitions
    client.produce_to_partitions(topic, by_partition)
    seconds = time.perf_counter() - started
    malformed = sum(
        1 for i in range(first, first + records) if i % MALFORMED_EVERY == MALFORMED_EVERY - 1
    )
    return DataSet(topic, partitions, records, sum(sizes), malformed, seconds)
