"""The stage job: read exactly a batch's offset ranges with Spark's Kafka source, apply the
pipeline's transform, and write Parquet into a folder unique to (batch id, attempt).

Nothing is deleted first and nothing becomes visible to readers: the files wait there until
the prepare vote records them and the commit publishes them (docs/protocol.md: STAGED).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from jobs import coordinates, parquet_files
from ledger.crash import crashpoint
from ledger.errors import ConfigError
from ledger.protocol import OffsetRange
from ledger.two_phase import StageOutput
from resources import storage
from resources.delta import encode_schema

COORDINATES = ("_kafka_topic", "_kafka_partition", "_kafka_offset", "_kafka_timestamp", "_batch_id")
TABLE, QUARANTINE = "table", "quarantine"
_RECORDS_READ = "records_read"
#: how long the observed count may lag behind the job that produced it (listener bus)
_OBSERVATION_WAIT_S = 10.0

#: How long the broker may hold a fetch of a Spark Kafka task that has no data to return
#: yet (the Java consumer's default is 500 ms). Every task of a batch read is a consumer of
#: one partition, and each paid that half second: with two cores, a quarter of a second of
#: every batch per partition, 17 s to read 64 partitions of 31 records against 1.5 s with
#: 10 ms (BENCHMARKS.md, "Scale with partitions"). Which records are read does not depend
#: on it: the ranges are fixed, and a poll still waits its whole timeout for its records.
FETCH_MAX_WAIT_MS = "10"

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


def attempt_folder(root: str, app_id: str, batch_id: int, attempt: int, token: str) -> str:
    """Unique to one attempt, and not `_`-prefixed so vacuum cleans orphans of abandoned
    attempts (protocol.md).

    The attempt's token is part of the name: after a lost ledger is rebuilt, batch ids and
    attempt numbers start over where the ledger stopped, and the folder of a batch the old
    ledger planned may still be there; a stage never writes into a folder that exists
    (invariant 4).
    """
    name = f"batch-{batch_id:012d}-attempt-{attempt}-{token}"
    return storage.join(root, "staged", app_id, name)


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
        .option("kafka.isolation.level", "read_committed")
        .option("failOnDataLoss", "true")
        .option("kafka.fetch.max.wait.ms", FETCH_MAX_WAIT_MS)
    )
    # the config's options come last: an operator's fetch.max.wait.ms wins over ours
    for key, value in (options or {}).items():
        reader = reader.option(f"kafka.{key}", value)
    return reader.load()


def with_coordinates(records: DataFrame, batch_id: int) -> DataFrame:
    return records.select(
        "key",
        "value",
        F.col("topic").alias("_kafka_topic"),
        F.col("partition").alias("_kafka_partition"),
        F.col("offset").alias("_kafka_offset"),
        F.col("timestamp").alias("_kafka_timestamp"),
        F.lit(batch_id).cast("long").alias("_batch_id"),
    )


def check_output(out: DataFrame, transform_name: str) -> None:
    """A transform must keep what the commit and the quarantine need."""
    missing = [c for c in (*COORDINATES, "value", "_error") if c not in out.columns]
    if missing:
        raise ConfigError(
            f"transform {transform_name} returned no column(s) {missing}: a transform must "
            "keep the _kafka_* and _batch_id columns and `value`, and add `_error`"
        )


def split_outputs(out: DataFrame) -> tuple[DataFrame, DataFrame]:
    """The table's rows and the quarantine's: a row with an `_error` goes to quarantine, with
    its raw value; every other row to the table, without it."""
    good = out.where(F.col("_error").isNull()).drop("_error", "value")
    bad = out.where(F.col("_error").isNotNull()).select(
        *COORDINATES, "_error", F.col("value").alias("_raw_value")
    )
    return good, bad


def write_outputs(good: DataFrame, bad: DataFrame, attempt_dirs: Mapping[str, str]) -> float:
    """Write both outputs into the attempt's folders (never over anything); the seconds taken.

    Save mode "error" (= "errorifexists" in a classic session, the only spelling Spark
    Connect's client accepts): a folder that exists already fails the write, never merges.
    """
    started = time.perf_counter()
    good.write.mode("error").parquet(storage.spark_uri(attempt_dirs[TABLE]))
    crashpoint("during_stage")
    bad.write.mode("error").parquet(storage.spark_uri(attempt_dirs[QUARANTINE]))
    return time.perf_counter() - started


def staged_output(
    good: DataFrame,
    bad: DataFrame,
    *,
    batch_id: int,
    records_read: int,
    attempt_dirs: Mapping[str, str],
    table_roots: Mapping[str, str],
    seconds: dict[str, float],
) -> StageOutput:
    """Describe what the attempt wrote: the vote's input. `check_coordinates` then proves
    every coordinate read is in it exactly once."""
    started = time.perf_counter()
    schemas = {
        TABLE: encode_schema(to_arrow_schema(good.schema, timezone="UTC")),
        QUARANTINE: encode_schema(to_arrow_schema(bad.schema, timezone="UTC")),
    }
    files = [
        *parquet_files.describe(attempt_dirs[TABLE], table_roots[TABLE], TABLE),
        *parquet_files.describe(attempt_dirs[QUARANTINE], table_roots[QUARANTINE], QUARANTINE),
    ]
    seconds["describe"] = time.perf_counter() - started
    table_records = sum(f.records for f in files if f.target == TABLE)
    quarantine_records = sum(f.records for f in files if f.target == QUARANTINE)
    return StageOutput(files, schemas, records_read, table_records, quarantine_records, seconds)


def stage(
    spark: SparkSession,
    *,
    bootstrap_servers: str,
    kafka_options: Mapping[str, str],
    ranges: Sequence[OffsetRange],
    batch_id: int,
    attempt_dirs: Mapping[str, str],
    table_roots: Mapping[str, str],
    transform: Callable[[DataFrame], DataFrame],
    transform_name: str = "transform",
) -> StageOutput:
    """Write one attempt's output for the table and the quarantine; describe the files.

    Every record read ends up in exactly one of the two outputs (invariant 9): the counts
    are checked before the vote.

    The records are read and transformed once: the count of records read is observed inside
    the job that writes the table, and only the transformed frame is cached for the
    quarantine write, with `value` kept only on the rows that need it. (The former plan,
    which cached and counted the source first, survives only in the benchmark, which
    compares the two: bench/two_pass.py, BENCHMARKS.md.)
    """
    seconds: dict[str, float] = {}
    observation = Observation()
    source = with_coordinates(
        read_ranges(spark, bootstrap_servers, ranges, kafka_options), batch_id
    ).observe(observation, F.count(F.lit(1)).alias(_RECORDS_READ), coordinates.fingerprint())
    out = transform(source)
    check_output(out, transform_name)
    # the table drops `value`; only quarantined rows need it, so only they cache it
    out = out.withColumn("value", F.when(F.col("_error").isNotNull(), F.col("value"))).persist()
    try:
        good, bad = split_outputs(out)
        written = {TABLE: Observation(), QUARANTINE: Observation()}
        good = good.observe(written[TABLE], coordinates.fingerprint())
        bad = bad.observe(written[QUARANTINE], coordinates.fingerprint())
        seconds["write"] = write_outputs(good, bad, attempt_dirs)
        records_read = _observed_records(observation)
        if records_read is None:
            # the transform's output does not derive from its input (or the metrics did not
            # arrive): count the source in a job of its own rather than trust nothing
            records_read = source.count()
    finally:
        out.unpersist()
    output = staged_output(
        good,
        bad,
        batch_id=batch_id,
        records_read=records_read,
        attempt_dirs=attempt_dirs,
        table_roots=table_roots,
        seconds=seconds,
    )
    check_coordinates(
        spark,
        output,
        bootstrap_servers=bootstrap_servers,
        kafka_options=kafka_options,
        ranges=ranges,
        batch_id=batch_id,
        table_roots=table_roots,
        # the count above already waited for this observation: do not wait twice
        read_fingerprint=_observed_fingerprint(observation, wait_s=0.0),
        written=written,
    )
    return output


def check_coordinates(
    spark: SparkSession,
    output: StageOutput,
    *,
    bootstrap_servers: str,
    kafka_options: Mapping[str, str],
    ranges: Sequence[OffsetRange],
    batch_id: int,
    table_roots: Mapping[str, str],
    read_fingerprint: int | None = None,
    written: Mapping[str, Observation] | None = None,
) -> None:
    """Invariant 13 before the vote: every coordinate read is staged exactly once.

    Fewer loses records, more duplicates them, and equal counts can still hide one record
    dropped and another doubled: the counts, the read and written fingerprints and the
    staged files' coordinate columns decide together (jobs/coordinates.py). Kafka is read a
    second time only to name an example when a mismatch is already proven.
    """
    started = time.perf_counter()
    parts = [_observed_fingerprint(o) for o in (written or {}).values()]
    staged_fingerprint = None if not parts or None in parts else coordinates.combine(*parts)

    def read_again() -> pa.Table:
        source = with_coordinates(
            read_ranges(spark, bootstrap_servers, ranges, kafka_options), batch_id
        )
        return source.select(*coordinates.KEY).toArrow()

    coordinates.check_exactly_once(
        coordinates.Counts(output.records_read, output.table_records, output.quarantine_records),
        read_fingerprint=read_fingerprint,
        staged_fingerprint=staged_fingerprint,
        staged_files=[storage.join(table_roots[f.target], f.path) for f in output.files],
        ranges=ranges,
        read_coordinates=read_again,
    )
    output.seconds["check"] = time.perf_counter() - started


def _observed_fingerprint(
    observation: Observation | None, wait_s: float = _OBSERVATION_WAIT_S
) -> int | None:
    """The coordinates' fingerprint observed, 0 for no rows, None if none was reported."""
    metrics = _observed_metrics(observation, wait_s)
    if metrics is None or coordinates.FINGERPRINT not in metrics:
        return None
    return coordinates.combine(metrics[coordinates.FINGERPRINT])


def _observed_records(observation: Observation | None) -> int | None:
    """The records counted by `observation`, or None if no finished job reported them."""
    value = (_observed_metrics(observation) or {}).get(_RECORDS_READ)
    return None if value is None else int(value)


def _observed_metrics(
    observation: Observation | None, wait_s: float = _OBSERVATION_WAIT_S
) -> dict[str, Any] | None:
    """The metrics `observation` holds, or None if no finished job reported them.

    Never blocks for long: a classic Observation is completed by a listener on Spark's
    asynchronous listener bus, so its future is given a few seconds, not forever (its `get`
    would wait for a job that may never come); a Spark Connect one holds `{}` until reported.
    """
    if observation is None:
        return None
    handle = getattr(observation, "_jo", None)
    if handle is not None:
        deadline = time.monotonic() + wait_s
        while not handle.future().isCompleted():
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)
    return dict(observation.get or {})
