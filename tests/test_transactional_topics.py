"""A topic written by a transactional producer (Kafka Streams, Flink's exactly-once Kafka
sink, any `transactional.id` producer): its offsets are not dense. A commit or abort marker
takes an offset of its own, an aborted transaction's records stay in the log but no
read_committed reader sees them, and an open transaction holds the last stable offset back
while its records are already past it.

Against the real broker, Spark and Delta: batches of a few offsets each, so that batches
start and end on markers, on aborted records and on a range with nothing committed in it;
an open transaction's records must not be published before its commit, nor lost after it.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import Producer

from jobs.examples.sample_data import MALFORMED, pageviews
from jobs.wiring.pipeline import build
from ledger.core.protocol import BatchState
from ledger.store.ledger_store import LedgerStore
from tests.fixtures.pipeline import assert_exactly_once, coordinates, run_until_caught_up

pytestmark = pytest.mark.integration


class Transactions:
    """One transactional producer on one partition: each call is one transaction."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "transactional.id": f"test-{uuid.uuid4().hex}"}
        )
        self.producer.init_transactions(60)

    def send(self, values: list[bytes], *, commit: bool | None) -> None:
        """`commit`: True commits, False aborts, None leaves the transaction open."""
        self.producer.begin_transaction()
        for value in values:
            self.producer.produce(self.topic, value=value, partition=0)
        self.producer.flush(60)
        if commit is True:
            self.producer.commit_transaction(60)
        elif commit is False:
            self.producer.abort_transaction(60)


def test_a_transactional_topic_lands_committed_records_once_and_no_aborted_one(
    spark: Any, kafka_client: Any, kafka_broker: str, pipeline_factory: Any
) -> None:
    # three offsets per batch: ranges end on markers, on aborted records, on nothing read
    config = pipeline_factory(1, max_records=3)
    topic = config.kafka.topic
    views = list(pageviews(12))
    aborted = [json.dumps({"aborted": i}).encode() for i in range(4)]
    tx = Transactions(kafka_broker, topic)
    tx.send(views[0:3], commit=True)  # offsets 0-2, marker 3
    tx.send(aborted[0:2], commit=False)  # 4-5 aborted, marker 6
    tx.send([views[3], MALFORMED[0]], commit=True)  # 7 and a malformed 8, marker 9
    tx.send(aborted[2:4], commit=False)  # 10-11 aborted, marker 12
    tx.send(views[4:8], commit=True)  # 13-16, marker 17
    tx.send(views[8:12], commit=None)  # 18-21 open: the last stable offset stays at 18

    pipeline = build(config, spark_factory=lambda: spark)
    first = run_until_caught_up(pipeline)
    assert first, "nothing committed from the transactions already decided"
    # nothing of the open transaction yet, every decided record once, no aborted record
    assert set(coordinates(config.delta.table_uri)) | set(
        coordinates(config.delta.quarantine_uri)
    ) == {(0, o) for o in (0, 1, 2, 7, 8, 13, 14, 15, 16)}
    assert_exactly_once(config, kafka_client)

    tx.producer.commit_transaction(60)  # marker 22: 18-21 become readable
    tx.send(aborted[0:1], commit=False)  # 23 aborted, marker 24: the topic ends on markers
    later = run_until_caught_up(pipeline)
    assert later, "the committed transaction's records were never read"
    table_rows, quarantined = assert_exactly_once(config, kafka_client)
    assert (table_rows, quarantined) == (12, 1)

    store = LedgerStore(config.ledger.url)
    try:
        batches = store.batches(app_id=config.app_id)
    finally:
        store.dispose()
    assert Counter(b.state for b in batches) == {BatchState.ACKED: len(first) + len(later)}
    # every offset up to the last marker is covered by exactly one batch's range
    covered = Counter(o for b in batches for r in b.ranges for o in range(r.start, r.end))
    assert set(covered) == set(range(25)) and set(covered.values()) == {1}, covered
