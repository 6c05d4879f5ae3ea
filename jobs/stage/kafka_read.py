"""Reading a batch from Kafka into Spark: exactly the records of its offset ranges,
read_committed, each row given the coordinates the whole protocol names it by
(ledger/core/layout.py). The stage reads through here, and so does its check when it must
name an example of a record lost or doubled.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ledger.core.layout import BATCH_ID, OFFSET, PARTITION, TIMESTAMP, TOPIC
from ledger.core.protocol import OffsetRange

#: How long the broker may hold a fetch of a Spark Kafka task that has no data to return
#: yet (the Java consumer's default is 500 ms). Every task of a batch read is a consumer of
#: one partition, and each paid that half second: with two cores, a quarter of a second of
#: every batch per partition, 17 s to read 64 partitions of 31 records against 1.5 s with
#: 10 ms (BENCHMARKS.md, "Scale with partitions"). Which records are read does not depend
#: on it: the ranges are fixed, and a poll still waits its whole timeout for its records.
FETCH_MAX_WAIT_MS = "10"

#: The records a task of a batch's read takes before the batch is given another task (up to
#: one per partition). Spark's Kafka source gives each partition a task: at 256 partitions a
#: batch of 100k records ran 256 tasks of ~400 records, each paying a task's and a Parquet
#: file's fixed cost, and the table got 256 files per batch (BENCHMARKS.md, "Scale with
#: partitions"). Tasks beyond the cores wait their turn anyway.
RECORDS_PER_TASK = 100_000

KAFKA_SCHEMA = T.StructType(
    [
        T.StructField("key", T.BinaryType()),
        T.StructField("value", T.BinaryType()),
        T.StructField("topic", T.StringType()),
        T.StructField("partition", T.IntegerType()),
        T.StructField("offset", T.LongType()),
        T.StructField("timestamp", T.TimestampType()),
        T.StructField("timestampType", T.IntegerType()),
    ]
)


def reader_group(
    base: str,
    bootstrap_servers: str,
    options: Mapping[str, str],
    topic_ids: Mapping[str, str | None],
) -> str | None:
    """The group id a batch's read runs under: `base` (the pipeline's consumer group) and a
    digest of everything a pooled consumer was opened for; None (Spark's own group, unique
    to each read) when a topic's id is unknown.

    Why a group at all: Spark's Kafka source keeps each consumer it opened, and the records
    its last poll fetched beyond the range, in pools keyed by (group id, partition) for five
    minutes, and names every read a group of its own. Every batch therefore opened a
    consumer per partition that nothing used again: at 256 partitions the driver's live heap
    grew by ~75 MiB per 100k-record batch until the 2g heap ran out. Under one group per
    pipeline the next batch borrows them back, and its first poll of a partition is often
    served from the records the last one prefetched.

    What the digest keeps apart, since a pooled consumer or buffer is lent to any read of
    its key:
    - the topic ids (invariant 10): a buffer holds records of the incarnation it was read
      from, and a re-created topic's batch, planned on the new id, must never be served
      them at the same offsets. A batch planned on the old id staged after a re-creation is
      refused by the stage's own id check, whatever the buffer held.
    - the bootstrap servers and the Kafka settings, secrets included (only their digest is
      in the id): a consumer opened with a rotated password, or for another cluster behind
      the same name, is never lent to a read with the new ones.
    The group is never joined and never commits: Spark assigns partitions by hand and turns
    auto-commit off, so it is not the pipeline's committed group (`base` alone) and needs no
    group ACL. It is given to Spark as one more Kafka option (`group.id`), under the
    config's own: an operator's `group.id` in `kafka.spark_options` still wins.
    """
    if not topic_ids or any(v is None for v in topic_ids.values()):
        return None
    identity = {"bootstrap": bootstrap_servers, "options": options, "topics": topic_ids}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return f"{base}.read.{digest}"


def read_ranges(
    spark: SparkSession,
    bootstrap_servers: str,
    ranges: Sequence[OffsetRange],
    options: Mapping[str, str] | None = None,
) -> DataFrame:
    """Exactly the records of `ranges`, read_committed, through Spark's Kafka source.

    Empty ranges are left out of the request (an empty batch is valid); a range that Kafka
    no longer fully holds fails the read instead of returning fewer records.
    """
    wanted = [r for r in ranges if r.span > 0]
    if not wanted:
        return spark.createDataFrame([], KAFKA_SCHEMA)
    topics = sorted({r.topic for r in wanted})
    starting = {t: {str(r.partition): r.start for r in wanted if r.topic == t} for t in topics}
    ending = {t: {str(r.partition): r.end for r in wanted if r.topic == t} for t in topics}
    assign = {t: sorted(r.partition for r in wanted if r.topic == t) for t in topics}
    reader = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap_servers)
        .option("assign", json.dumps(assign))
        .option("startingOffsets", json.dumps(starting))
        .option("endingOffsets", json.dumps(ending))
        .option("failOnDataLoss", "true")
        .option("kafka.fetch.max.wait.ms", FETCH_MAX_WAIT_MS)
    )
    # the config's options next: an operator's fetch.max.wait.ms wins over ours; never the
    # isolation level (the config refuses another, resources/config/kafka_settings.py)
    for key, value in (options or {}).items():
        reader = reader.option(f"kafka.{key}", value)
    return reader.option("kafka.isolation.level", "read_committed").load()


def read_tasks(ranges: Sequence[OffsetRange], parallelism: int | None) -> int:
    """How many Spark tasks read a batch of `ranges`, then transform and write it: one per
    core of the session (`parallelism`), or one per RECORDS_PER_TASK records if that is
    more, never more than the partitions that hold records. Unknown cores (a Spark Connect
    session does not say them): a task per partition, Spark's own choice.

    Fewer tasks than partitions is a `coalesce`: a task reads several partitions' ranges one
    after the other, each range whole, so which records are read, and the per-coordinate
    check of the stage, are the same. A range is never split (Spark's `minPartitions`
    would): with read_committed a split could fall on a transaction marker.
    """
    holding = [r for r in ranges if r.span > 0]
    if not holding:
        return 1
    if parallelism is None:
        return len(holding)
    records = sum(r.span for r in holding)
    return min(len(holding), max(parallelism, -(-records // RECORDS_PER_TASK)))


def parallelism_of(spark: SparkSession) -> int | None:
    """The cores the session runs tasks on (`spark.default.parallelism`; in local mode the
    `local[N]`), or None when the session cannot say (Spark Connect keeps no SparkContext
    on the client, and the setting is unset unless the cluster's operator set it)."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:  # Spark Connect: no SparkContext here
        pass
    try:
        value = spark.conf.get("spark.default.parallelism", None)
    except Exception:  # an unreadable setting is an unknown one
        return None
    return int(value) if value and str(value).isdigit() else None


def in_tasks(
    records: DataFrame, ranges: Sequence[OffsetRange], parallelism: int | None
) -> DataFrame:
    """`records` (a read of `ranges`) in `read_tasks` tasks."""
    tasks = read_tasks(ranges, parallelism)
    holding = sum(1 for r in ranges if r.span > 0)
    return records.coalesce(tasks) if tasks < holding else records


def with_coordinates(records: DataFrame, batch_id: int) -> DataFrame:
    return records.select(
        "key",
        "value",
        F.col("topic").alias(TOPIC),
        F.col("partition").alias(PARTITION),
        F.col("offset").alias(OFFSET),
        F.col("timestamp").alias(TIMESTAMP),
        F.lit(batch_id).cast("long").alias(BATCH_ID),
    )
