"""The stage's one write and what it owes the transform contract: which columns a
transform must keep and may not take, how each row is routed to the table or the quarantine
(one Spark write into one folder per output, `exactly_output=<target>/`), and the move of
the quarantined rows into the quarantine's own attempt folder afterwards.

Kept apart from the stage job (jobs/stage/staging.py) because the routing is a contract of
its own: the transform decoders (jobs/formats/) keep it, the Delta publisher reads files
written this way, and the benchmark's cached plan reuses it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from jobs.stage import parquet_files
from ledger.core.errors import ConfigError, UnreachableError
from ledger.core.layout import COORDINATES, QUARANTINE, ROUTE, TABLE
from resources.config.derived_spec import DELETED, AnyOutput, UpsertOutput
from resources.object_storage import storage

#: Columns the stage adds to the transform's output; a transform may not return them.
RESERVED = ("_raw_value", ROUTE)


def carries_tombstones(derived: Sequence[AnyOutput]) -> bool:
    """Whether the raw table keeps `_deleted` (Kafka's value was null): an upsert output
    reads its tombstones from the table's rows, which no longer hold `value`."""
    return any(isinstance(d, UpsertOutput) for d in derived)


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
    spark_schema = bad.schema.json()
    for info in storage.list_data_files(source):
        rows = storage.read_parquet(info.uri, columns)
        name = info.uri.rsplit("/", 1)[-1]
        parquet_files.write_as_spark(rows, attempt_dirs[QUARANTINE], spark_schema, name)
    for info in storage.list_files(source):
        try:
            storage.delete_file(info.uri)
        except (OSError, UnreachableError):
            break  # tidiness only: an unvoted file, which the cleaner deletes anyway
    return time.perf_counter() - started
