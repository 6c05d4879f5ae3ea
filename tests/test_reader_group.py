"""The group id a batch's Kafka read runs under (jobs/stage/kafka_read.py `reader_group`).

Spark's Kafka source keeps every consumer it opened, and the records its last poll fetched
past the range, in pools keyed by (group id, partition), for five minutes. Left to itself
it names every read a group of its own, so every batch opened a consumer per partition that
was never used again: at 256 partitions the driver's live heap grew by ~75 MiB per 100k-record
batch until the 2g heap ran out (benchmark of 2026-12-02, "Scale with partitions"). A group
of the pipeline's own, for one topic incarnation and one set of Kafka settings, lets the
next batch reuse them.
"""

from __future__ import annotations

from typing import Any

import pytest

from jobs.examples.sample_data import pageviews
from jobs.stage.kafka_read import reader_group
from jobs.wiring.pipeline import build
from tests.fixtures.pipeline import assert_exactly_once

BOOT = "127.0.0.1:9092"


@pytest.mark.unit
def test_one_pipeline_reads_one_topic_incarnation_under_one_group() -> None:
    group = reader_group("exactly-pv", BOOT, {"security.protocol": "SSL"}, {"pv": "id-1"})
    assert group is not None and group.startswith("exactly-pv.")
    # the same inputs name the same group, and so do the same topics in another order
    again = reader_group("exactly-pv", BOOT, {"security.protocol": "SSL"}, {"pv": "id-1"})
    assert again == group
    several = reader_group("g", BOOT, {}, {"a": "1", "b": "2"})
    assert several == reader_group("g", BOOT, {}, {"b": "2", "a": "1"})


@pytest.mark.unit
def test_a_recreated_topic_or_changed_settings_get_a_group_of_their_own() -> None:
    """A pooled consumer's prefetched records belong to the incarnation they were read
    from: a re-created topic's batches must never be served them, so the topic id is in
    the key; a consumer opened with other settings (a rotated password, another cluster
    behind the same name) is never lent to a read with new ones."""
    secret = {"sasl.jaas.config": "password=hunter2"}
    base = reader_group("g", BOOT, secret, {"pv": "id-1"})
    assert base is not None
    assert reader_group("g", BOOT, secret, {"pv": "id-2"}) != base
    assert reader_group("g", BOOT, {"sasl.jaas.config": "password=hunter3"}, {"pv": "id-1"}) != base
    assert reader_group("g", "10.0.0.1:9092", secret, {"pv": "id-1"}) != base
    assert reader_group("h", BOOT, secret, {"pv": "id-1"}) != base
    # the secret itself never appears in the group id, which brokers may log
    assert "hunter2" not in base and "sasl" not in base


@pytest.mark.unit
def test_a_read_without_known_topic_ids_keeps_sparks_group_per_read() -> None:
    """A batch recorded before exactly stored topic ids cannot name its incarnation: its
    read keeps Spark's unique group, whose consumers nothing else is lent."""
    assert reader_group("g", BOOT, {}, {}) is None
    assert reader_group("g", BOOT, {}, {"pv": None}) is None


def _kafka_pools(spark: Any) -> tuple[int, int]:
    """(consumers, fetched-data buffers) held by this JVM's Kafka source pools, read by
    reflection: Spark keeps them in private fields of its KafkaDataConsumer object."""
    jvm = spark._jvm
    name = "org.apache.spark.sql.kafka010.consumer.KafkaDataConsumer$"
    module = jvm.java.lang.Class.forName(name)
    holder = module.getField("MODULE$").get(None)

    def field(name: str) -> Any:
        found = module.getDeclaredField(name)
        found.setAccessible(True)
        return found.get(holder)

    return int(field("consumerPool").size()), int(field("fetchedDataPool").numTotal())


def test_batches_of_one_pipeline_reuse_the_consumers_of_the_last(
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    """Four batches over six partitions leave the JVM's pools at most a consumer and a
    fetched buffer per partition more than before, where Spark's group per read left
    twenty-four of each; and every record is committed once."""
    config = pipeline_factory(6, max_records=10)
    kafka_client.produce_to_partitions(
        config.kafka.topic, {p: list(pageviews(40, start=40 * p)) for p in range(6)}
    )
    tpc = build(config, spark_factory=lambda: spark)
    before = _kafka_pools(spark)
    for _ in range(4):
        assert tpc.run_batch() is not None
    after = _kafka_pools(spark)
    assert after[0] - before[0] <= 6, (before, after)
    assert after[1] - before[1] <= 6, (before, after)
    assert assert_exactly_once(config, kafka_client) == (240, 0)
