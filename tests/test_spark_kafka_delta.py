"""Foundation: Spark's Kafka source reads exact ranges; delta-rs and delta-spark agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import functions as F

from jobs.stage.kafka_read import read_ranges
from ledger.core.protocol import OffsetRange
from resources.kafka.client import KafkaClient


def assert_reads_exact_ranges(session: Any, client: KafkaClient, topic: str) -> None:
    """Through `session` (classic or Spark Connect), the Kafka source returns exactly the
    requested offsets of each partition, and nothing for an empty range."""
    client.produce_to_partitions(
        topic, {0: [f"p0-{i}" for i in range(10)], 1: [f"p1-{i}" for i in range(4)]}
    )
    ranges = [
        OffsetRange(topic, 0, 2, 7),
        OffsetRange(topic, 1, 1, 4),
        OffsetRange(topic, 2, 0, 0),  # nothing new in this partition
    ]
    rows = read_ranges(session, client.bootstrap_servers, ranges).collect()
    got = sorted((r["partition"], r["offset"], bytes(r["value"]).decode()) for r in rows)
    assert got == [(0, o, f"p0-{o}") for o in range(2, 7)] + [(1, o, f"p1-{o}") for o in (1, 2, 3)]
    empty = read_ranges(session, client.bootstrap_servers, [OffsetRange(topic, 2, 0, 0)])
    assert empty.count() == 0
    assert "value" in empty.columns


def test_spark_reads_exact_ranges_including_an_empty_partition(
    spark: Any, kafka_client: KafkaClient, topic_factory: Any
) -> None:
    assert_reads_exact_ranges(spark, kafka_client, topic_factory(3))


def test_all_empty_ranges_read_as_an_empty_frame(spark: Any, topic_factory: Any) -> None:
    topic = topic_factory(2)
    df = read_ranges(spark, "127.0.0.1:1", [OffsetRange(topic, 0, 0, 0)])
    assert df.count() == 0
    assert "value" in df.columns


def _rows() -> pa.Table:
    return pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "app": ["web", "ios", None],
            "ts": pa.array([0, 1_000_000, 2_000_000], pa.timestamp("us", tz="UTC")),
        }
    )


def test_delta_rs_table_reads_back_through_delta_spark(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write_deltalake(uri, _rows())
    back = spark.read.format("delta").load(uri).orderBy("id").collect()
    assert [(r["id"], r["app"]) for r in back] == [(1, "web"), (2, "ios"), (3, None)]
    assert [r["ts"].timestamp() for r in back] == [0.0, 1.0, 2.0]


def test_delta_spark_table_reads_back_through_delta_rs(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    df = spark.createDataFrame(
        [(1, "web"), (2, "ios"), (3, None)], "id long, app string"
    ).withColumn("ts", F.to_timestamp(F.lit("2026-01-01 00:00:00")))
    df.write.format("delta").save(uri)
    table = DeltaTable(uri).to_pyarrow_table().sort_by("id")
    assert table.column("id").to_pylist() == [1, 2, 3]
    assert table.column("app").to_pylist() == ["web", "ios", None]
    assert table.schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert {t.timestamp() for t in table.column("ts").to_pylist()} == {1767225600.0}
