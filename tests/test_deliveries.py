"""The producer's delivery check, alone: an acknowledgement must name a new offset."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import KafkaError

from resources.kafka.producing import Deliveries


@dataclass
class Report:
    """The two fields of a delivery report the check reads."""

    at_partition: int
    at_offset: int

    def partition(self) -> int:
        return self.at_partition

    def offset(self) -> int:
        return self.at_offset


def test_rising_offsets_per_partition_are_clean() -> None:
    deliveries = Deliveries()
    for partition, offset in [(0, 0), (1, 0), (0, 1), (1, 5), (0, 2)]:
        deliveries.report(None, Report(partition, offset))  # type: ignore[arg-type]
    assert deliveries.overlaps == [] and deliveries.failures == []


def test_an_offset_acknowledged_twice_is_an_overlap() -> None:
    deliveries = Deliveries()
    for partition, offset in [(0, 0), (0, 1), (0, 2), (1, 0), (0, 1), (0, 2), (0, 3)]:
        deliveries.report(None, Report(partition, offset))  # type: ignore[arg-type]
    # the broker answered a batch whose sequence it had seen with the old batch's offsets
    assert deliveries.overlaps == [(0, 2, 1), (0, 2, 2)]


def test_failed_deliveries_are_kept_apart_from_offsets() -> None:
    deliveries = Deliveries()
    error = KafkaError(KafkaError._MSG_TIMED_OUT)
    deliveries.report(error, Report(0, -1))  # type: ignore[arg-type]
    deliveries.report(None, Report(0, 0))  # type: ignore[arg-type]
    assert deliveries.failures == [error] and deliveries.overlaps == []
