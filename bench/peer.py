"""The peer: a Spark Structured Streaming query from Kafka into a Delta table (delta-spark).

What a user would write instead of this product: the Kafka source, the same transform, the
Delta sink (exactly once through its checkpoint and the table's txn version), and
`trigger(availableNow=True)` so it reads what is there and stops. `maxOffsetsPerTrigger`
splits the backlog into batches of the same size as the product's.

It writes one table: rows that do not parse keep their `_error` and raw value in columns of
that table instead of going to a quarantine table, so it does a little less work than the
product (one output, no cache). Same session, hence the same Spark settings.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from deltalake import DeltaTable
from pyspark.sql import functions as F

from bench.product import BenchError
from jobs.examples.pageviews import transform
from jobs.stage.kafka_read import FETCH_MAX_WAIT_MS, with_coordinates
from resources.object_storage import storage


def streaming_frame(spark: Any, *, bootstrap: str, topic: str, max_offsets: int | None) -> Any:
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
        .option("failOnDataLoss", "true")
        # the product's stage reads with this too (jobs/stage/kafka_read.py): the same consumer
        # settings on both sides, so the figures compare plans, not a fetch option
        .option("kafka.fetch.max.wait.ms", FETCH_MAX_WAIT_MS)
    )
    if max_offsets is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets))
    out = transform(with_coordinates(reader.load(), 0))
    return out.withColumn("_raw_value", F.when(F.col("_error").isNotNull(), F.col("value"))).drop(
        "value"
    )


def _run(
    frame: Any, table: Path, checkpoint: Path, name: str
) -> tuple[float, list[dict[str, Any]]]:
    started = time.perf_counter()
    query = (
        frame.writeStream.queryName(name)
        .format("delta")
        .outputMode("append")
        .option("checkpointLocation", storage.spark_uri(str(checkpoint)))
        .trigger(availableNow=True)
        .start(storage.spark_uri(str(table)))
    )
    try:
        query.awaitTermination()
    finally:
        if query.isActive:
            query.stop()
    seconds = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"the Structured Streaming query failed: {query.exception()}")
    return seconds, [p for p in query.recentProgress if p.get("numInputRows", 0) > 0]


def table_records(table: Path) -> int:
    """Rows in the Delta table, from its log's statistics (the progress list is capped)."""
    counts = DeltaTable(str(table)).get_add_actions(flatten=True).column("num_records")
    return int(sum(counts.to_pylist()))


def run_structured_streaming(
    spark: Any,
    root: Path,
    *,
    bootstrap: str,
    topic: str,
    max_offsets_per_trigger: int | None,
    expected_records: int,
    name: str = "structured-streaming",
) -> dict[str, Any]:
    """Run the query until it has read the whole topic; then once more with nothing new.

    The second run (same checkpoint) is the peer's fixed cost of a run that finds nothing:
    query start, offset listing, stop. `name` is the query's name, which Spark puts at the
    start of its jobs' descriptions (the profile groups jobs by it).
    """
    frame = streaming_frame(
        spark, bootstrap=bootstrap, topic=topic, max_offsets=max_offsets_per_trigger
    )
    table, checkpoint = root / "table", root / "checkpoint"
    seconds, progress = _run(frame, table, checkpoint, name)
    records = table_records(table)
    if records != expected_records:
        raise BenchError(f"Structured Streaming read {records} records, not {expected_records}")
    idle_seconds, idle_progress = _run(frame, table, checkpoint, name)
    if idle_progress:
        raise BenchError("the Structured Streaming query found new records on its idle run")
    return {
        "records": records,
        "seconds": seconds,
        "batches": [
            {
                "records": int(p["numInputRows"]),
                "seconds": p["durationMs"].get("triggerExecution", 0) / 1000.0,
                "duration_ms": dict(p["durationMs"]),
            }
            for p in progress
        ],
        "idle_run_seconds": idle_seconds,
    }
