"""The stage job: read exactly a batch's offset ranges with Spark's Kafka source, apply the
pipeline's transform, and write Parquet into a folder unique to (batch id, attempt).

Nothing is deleted first and nothing becomes visible to readers: the files wait there until
the prepare vote records them and the commit publishes them (docs/protocol.md: STAGED).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from jobs.derived.partials import aggregate_partial, latest_per_key
from jobs.stage import coordinates, parquet_files
from jobs.stage.partition_columns import read_back, with_partition_columns
from ledger.coordinator.crash import crashpoint
from ledger.core.errors import ConfigError, UnreachableError
from ledger.core.ports import StageOutput
from ledger.core.protocol import OffsetRange
from resources.config.derived_spec import DELETED, AnyOutput, UpsertOutput
from resources.config.partitioning import PartitionColumn
from resources.delta.schema import encode_schema
from resources.object_storage import storage

COORDINATES = ("_kafka_topic", "_kafka_partition", "_kafka_offset", "_kafka_timestamp", "_batch_id")
TABLE, QUARANTINE = "table", "quarantine"
#: A derived output's target in the vote (`StagedFile.target`, the schemas' keys):
#: `derived:<name>`. Its files are partials (groups, latest records), not records.
DERIVED_PREFIX = "derived:"
#: The column that routes each row to its output in the stage's one write. Spark writes the
#: rows of each value into a folder of their own (`exactly_output=table/`, `=quarantine/`),
#: never into the files. Not `_`-prefixed: Delta's VACUUM treats such folders as hidden.
ROUTE = "exactly_output"
#: Columns the stage adds to the transform's output; a transform may not return them.
RESERVED = ("_raw_value", ROUTE)
#: The key of the Spark schema Spark stores in every Parquet footer it writes.
_SPARK_SCHEMA_KEY = b"org.apache.spark.sql.parquet.row.metadata"
RECORDS_READ = "records_read"
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


def derived_target(name: str) -> str:
    """The vote's target for derived output `name`."""
    return f"{DERIVED_PREFIX}{name}"


def is_derived(target: str) -> bool:
    return target.startswith(DERIVED_PREFIX)


def carries_tombstones(derived: Sequence[AnyOutput]) -> bool:
    """Whether the raw table keeps `_deleted` (Kafka's value was null): an upsert output
    reads its tombstones from the table's rows, which no longer hold `value`."""
    return any(isinstance(d, UpsertOutput) for d in derived)


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
    """A transform must keep what the commit and the quarantine need, and leave the
    columns the stage adds to it."""
    missing = [c for c in (*COORDINATES, "value", "_error") if c not in out.columns]
    if missing:
        raise ConfigError(
            f"transform {transform_name} returned no column(s) {missing}: a transform must "
            "keep the _kafka_* and _batch_id columns and `value`, and add `_error`"
        )
    taken = [c for c in out.columns if c.lower() in RESERVED]
    if taken:
        raise ConfigError(
            f"transform {transform_name} returned column(s) {taken}, which the stage adds "
            f"itself ({', '.join(RESERVED)}): rename them"
        )


def split_outputs(out: DataFrame, tombstones: bool = False) -> tuple[DataFrame, DataFrame]:
    """The table's rows and the quarantine's: a row with an `_error` goes to quarantine, with
    its raw value; every other row to the table, without it. With `tombstones` (a pipeline
    with an upsert output) the table's rows keep `_deleted = value IS NULL`, so a
    tombstone stays one once `value` is gone (jobs/derived/partials.py)."""
    good = out.where(F.col("_error").isNull())
    if tombstones:
        good = good.withColumn(DELETED, F.col("value").isNull())
    good = good.drop("_error", "value")
    bad = out.where(F.col("_error").isNotNull()).select(
        *COORDINATES, "_error", F.col("value").alias("_raw_value")
    )
    return good, bad


def routed(out: DataFrame, tombstones: bool = False) -> DataFrame:
    """Both outputs' rows in one frame, for one write routed by ROUTE.

    A row keeps the transform's columns and `_error`; the raw value (`_raw_value`) is kept
    on quarantined rows only. So a table file also holds `_error` and `_raw_value`, always
    null there: readers go by the table's schema (the vote records `split_outputs`'s) and
    never see them, and a compaction drops them. A quarantine file holds the transform's
    columns too, which `move_quarantine` drops.
    """
    error = F.col("_error").isNotNull()
    kept = [c for c in out.columns if c not in ("value", "_error")]
    deleted = [F.col("value").isNull().alias(DELETED)] if tombstones else []
    return out.select(
        *kept,
        *deleted,
        "_error",
        F.when(error, F.col("value")).alias("_raw_value"),
        F.when(error, F.lit(QUARANTINE)).otherwise(F.lit(TABLE)).alias(ROUTE),
    )


def routed_folder(attempt_dir: str, target: str) -> str:
    """Where the one write puts the rows of output `target` below the table's attempt folder."""
    return storage.join(attempt_dir, f"{ROUTE}={target}")


def write_routed(
    rows: DataFrame, attempt_dirs: Mapping[str, str], partitions: Sequence[str] = ()
) -> float:
    """Write both outputs in one Spark job into the table's attempt folder; the seconds
    taken. The rows of each output land in a folder of their own (`routed_folder`), and
    in a partitioned table's, in one folder per partition value below it
    (`<name>=<value>/`, which the commit reads the partition values from).

    Save mode "error" (= "errorifexists" in a classic session, the only spelling Spark
    Connect's client accepts): a folder that exists already fails the write, never merges.
    """
    started = time.perf_counter()
    writer = rows.write.mode("error").partitionBy(ROUTE, *partitions)
    writer.parquet(storage.spark_uri(attempt_dirs[TABLE]))
    return time.perf_counter() - started


def move_quarantine(bad: DataFrame, attempt_dirs: Mapping[str, str]) -> float:
    """Rewrite the quarantined rows the one write left below the table's attempt folder
    into the quarantine's own attempt folder, with the quarantine's columns only; the
    seconds taken.

    The two tables may live anywhere (another bucket, another file system), so this is a
    rewrite through pyarrow, file by file, not a rename: quarantined rows are few, and a
    file of them is read only once. What it leaves behind is never voted: a crash halfway
    leaves a new attempt to stage the batch again into new folders, the originals are
    deleted once copied, and the cleaner deletes whatever a crash kept (invariant 18).
    The copies carry Spark's schema for the quarantine's columns, as a file Spark wrote.
    """
    started = time.perf_counter()
    source = routed_folder(attempt_dirs[TABLE], QUARANTINE)
    columns = bad.columns
    spark_schema = bad.schema.json().encode()
    for info in storage.list_data_files(source):
        rows = storage.read_parquet(info.uri, columns)
        rows = rows.replace_schema_metadata({_SPARK_SCHEMA_KEY: spark_schema})
        name = info.uri.rsplit("/", 1)[-1]
        storage.write_parquet(rows, storage.join(attempt_dirs[QUARANTINE], name))
    for info in storage.list_files(source):
        try:
            storage.delete_file(info.uri)
        except (OSError, UnreachableError):
            break  # tidiness only: an unvoted file, which the cleaner deletes anyway
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
    """Describe what the attempt wrote into `attempt_dirs` (per output, the folder holding
    its files): the vote's input. `check_coordinates` then proves every coordinate read is
    in it exactly once. The vote's schemas are the outputs' own, whatever else the files
    hold (`routed`), and so are the files' statistics."""
    started = time.perf_counter()
    schemas = {
        TABLE: encode_schema(to_arrow_schema(good.schema, timezone="UTC")),
        QUARANTINE: encode_schema(to_arrow_schema(bad.schema, timezone="UTC")),
    }
    files = [
        *parquet_files.describe(
            attempt_dirs[TABLE], table_roots[TABLE], TABLE, columns=good.columns
        ),
        *parquet_files.describe(
            attempt_dirs[QUARANTINE], table_roots[QUARANTINE], QUARANTINE, columns=bad.columns
        ),
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
    derived: Sequence[AnyOutput] = (),
    partition_by: Sequence[PartitionColumn] = (),
) -> StageOutput:
    """Write one attempt's output for the table and the quarantine; describe the files.
    Then each derived output's partial, computed from the table's staged files
    (`stage_partials`).

    Every record read ends up in exactly one of the two outputs (invariant 9): the counts
    are checked before the vote.

    The records are read, transformed and written once, in one Spark job and without a
    cache: the rows of both outputs go through one write that routes each row to its
    output's folder (`routed`), the count and fingerprint of the records read and the
    fingerprint of the rows written are observed inside that job, and the quarantined rows
    are then moved to the quarantine's folder (`move_quarantine`). (The former plans, which
    cached the batch to write the two outputs in two jobs, survive only in the benchmark,
    which compares them: bench/, BENCHMARKS.md.)
    """
    seconds: dict[str, float] = {}
    observation = Observation()
    source = with_coordinates(
        read_ranges(spark, bootstrap_servers, ranges, kafka_options), batch_id
    ).observe(observation, F.count(F.lit(1)).alias(RECORDS_READ), coordinates.fingerprint())
    out = transform(source)
    check_output(out, transform_name)
    out = with_partition_columns(out, partition_by, transform_name)
    tombstones = carries_tombstones(derived)
    good, bad = split_outputs(out, tombstones)
    written = Observation()
    rows = routed(out, tombstones).observe(written, coordinates.fingerprint())
    seconds["write"] = write_routed(rows, attempt_dirs, [c.name for c in partition_by])
    crashpoint("during_stage")
    seconds["move"] = move_quarantine(bad, attempt_dirs)
    records_read = observed_records(observation)
    if records_read is None:
        # the transform's output does not derive from its input (or the metrics did not
        # arrive): count the source in a job of its own rather than trust nothing
        records_read = source.count()
    output = staged_output(
        good,
        bad,
        batch_id=batch_id,
        records_read=records_read,
        attempt_dirs={
            TABLE: routed_folder(attempt_dirs[TABLE], TABLE),
            QUARANTINE: attempt_dirs[QUARANTINE],
        },
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
        read_fingerprint=observed_fingerprint(observation, wait_s=0.0),
        written={"both": written},
    )
    if not derived:
        return output
    return stage_partials(
        spark,
        output,
        good,
        derived,
        attempt_dirs=attempt_dirs,
        table_roots=table_roots,
        partition_by=partition_by,
    )


def _spark_file(uri: str) -> str:
    """A staged file as Spark reads it back. Not `storage.spark_uri` for a local file: its
    `file:` URI percent-encodes the `=` of the routed folder (`exactly_output%3Dtable`),
    which Hadoop then takes literally and finds no such file."""
    return storage.spark_uri(uri) if storage.is_remote(uri) else uri


def stage_partials(
    spark: SparkSession,
    output: StageOutput,
    good: DataFrame,
    derived: Sequence[AnyOutput],
    *,
    attempt_dirs: Mapping[str, str],
    table_roots: Mapping[str, str],
    partition_by: Sequence[PartitionColumn] = (),
) -> StageOutput:
    """`output` with each derived output's partial staged and described.

    The partial is computed from the table's staged files, read back, not from the
    transform's frame: Kafka is not read a second time (the stage's one job has no
    cache), and the partial is a function of exactly the rows the vote publishes to the
    raw table, which is what the recomputation check compares it with. Each partial is
    written, in a job of its own, into its output's own attempt folder (fresh per attempt,
    invariant 4). An empty partial still votes its schema: the commit must record the
    batch in that output even when it changes no row (resources/delta/merge.py).
    """
    started = time.perf_counter()
    paths = [
        _spark_file(storage.join(table_roots[TABLE], f.path))
        for f in output.files
        if f.target == TABLE
    ]
    # every column nullable, as Spark reads any Parquet file back: an empty batch's
    # partial must have the schema of every other batch's (invariant 14 compares them)
    schema = T.StructType([T.StructField(f.name, f.dataType, True) for f in good.schema.fields])
    if paths:
        rows = read_back(spark.read, paths, schema, partition_by)
    else:
        rows = spark.createDataFrame([], schema)
    files, schemas = list(output.files), dict(output.schemas)
    for spec in derived:
        target = derived_target(spec.name)
        if isinstance(spec, UpsertOutput):
            partial = latest_per_key(rows, spec)
        else:  # an aggregate, kept in Delta or in PostgreSQL: the same partial
            partial = aggregate_partial(rows, spec)
        folder = attempt_dirs[target]
        partial.write.mode("error").parquet(storage.spark_uri(folder))
        files += parquet_files.describe(folder, table_roots[target], target, partial.columns)
        schemas[target] = encode_schema(to_arrow_schema(partial.schema, timezone="UTC"))
    seconds = {**output.seconds, "derived": time.perf_counter() - started}
    return dataclasses.replace(output, files=files, schemas=schemas, seconds=seconds)


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
    staged files' coordinate columns decide together (jobs/stage/coordinates.py). Kafka is read a
    second time only to name an example when a mismatch is already proven.
    """
    started = time.perf_counter()
    parts = [observed_fingerprint(o) for o in (written or {}).values()]
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
        # a derived output's partial holds groups, not records: not coordinates to count
        staged_files=[
            storage.join(table_roots[f.target], f.path)
            for f in output.files
            if f.target in (TABLE, QUARANTINE)
        ],
        ranges=ranges,
        read_coordinates=read_again,
    )
    output.seconds["check"] = time.perf_counter() - started


def observed_fingerprint(
    observation: Observation | None, wait_s: float = _OBSERVATION_WAIT_S
) -> int | None:
    """The coordinates' fingerprint observed, 0 for no rows, None if none was reported."""
    metrics = _observed_metrics(observation, wait_s)
    if metrics is None or coordinates.FINGERPRINT not in metrics:
        return None
    return coordinates.combine(metrics[coordinates.FINGERPRINT])


def observed_records(observation: Observation | None) -> int | None:
    """The records counted by `observation`, or None if no finished job reported them."""
    value = (_observed_metrics(observation) or {}).get(RECORDS_READ)
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
