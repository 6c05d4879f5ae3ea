"""Transforms used by the tests: a 'fixed' version of the page-view transform for the backfill
tests, schema changes (invariant 14) and transforms that break exactly-once (invariant 13)."""

from __future__ import annotations

import os

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from jobs.examples.pageviews import PAGEVIEW
from jobs.examples.pageviews import transform as pageviews
from ledger.core.layout import COORDINATES


def pageviews_v2(records: DataFrame) -> DataFrame:
    """The same parse, with the app name upper-cased: shows which rows a replace rewrote."""
    return pageviews(records).withColumn("app", F.upper("app"))


def pageviews_with_tombstones_v2(records: DataFrame) -> DataFrame:
    """`pageviews_with_tombstones` "fixed" for a replace under derived outputs: the app
    upper-cased (aggregate groups move), and every record at an odd offset given to another
    user (`<user>-v2`): a replace then brings keys in and leaves keys with no record at all.
    Tombstones keep the Kafka key's user."""
    out = pageviews_with_tombstones(records)
    renamed = F.when(
        F.col("value").isNotNull() & (F.col("_kafka_offset") % 2 == 1),
        F.concat(F.col("user"), F.lit("-v2")),
    ).otherwise(F.col("user"))
    return out.withColumn("app", F.upper("app")).withColumn("user", renamed)


# -- schema changes (invariant 14) ----------------------------------------------------------


def pageviews_with_referrer(records: DataFrame) -> DataFrame:
    """An additive change: one new nullable column (`referrer`), null for quarantined rows."""
    out = pageviews(records)
    return out.withColumn("referrer", F.concat(F.lit("ref-"), F.col("app")))


def pageviews_ts_as_string(records: DataFrame) -> DataFrame:
    """An incompatible change: `ts` stays the raw string instead of a timestamp."""
    return pageviews(records).withColumn("ts", F.col("ts").cast("string"))


# -- transforms that break exactly-once (invariant 13) --------------------------------------


def pageviews_twice(records: DataFrame) -> DataFrame:
    """A union with itself: every record comes out twice."""
    out = pageviews(records)
    return out.unionByName(out)


def pageviews_exploded(records: DataFrame) -> DataFrame:
    """A fan-out: an explode emits each record once per element (two here)."""
    out = pageviews(records)
    return out.withColumn("_copy", F.explode(F.array(F.lit(1), F.lit(2)))).drop("_copy")


def pageviews_drop_one_duplicate_another(records: DataFrame) -> DataFrame:
    """Offset 1 of every partition is lost and offset 0 comes out twice: the counts agree."""
    out = pageviews(records)
    return out.where(F.col("_kafka_offset") != 1).unionByName(
        out.where(F.col("_kafka_offset") == 0)
    )


def pageviews_moved_offset(records: DataFrame) -> DataFrame:
    """Offset 1 is relabelled as an offset nobody read: counts agree, no coordinate repeats."""
    offset = F.col("_kafka_offset")
    return pageviews(records).withColumn(
        "_kafka_offset", F.when(offset == 1, offset + 1_000_000).otherwise(offset)
    )


#: Set (to anything) to make `pageviews_or_fail` fail the way a transient Spark error does.
FAIL_STAGE_ENV = "EXACTLY_TEST_FAIL_STAGE"


def pageviews_or_fail(records: DataFrame) -> DataFrame:
    """The page-view transform, or, while $EXACTLY_TEST_FAIL_STAGE is set, a stage that dies:
    a run that fails between plan and vote, as a lost executor or a Kafka timeout makes it."""
    if os.environ.get(FAIL_STAGE_ENV):
        raise RuntimeError("simulated transient stage failure (EXACTLY_TEST_FAIL_STAGE is set)")
    return pageviews(records)


def pageviews_failing_in_spark(records: DataFrame) -> DataFrame:
    """The page-view transform with a column that fails inside Spark's tasks: an error
    nobody foresaw, raised by the JVM (its Java stack in the Py4J error's text)."""
    return pageviews(records).withColumn("app", F.raise_error(F.lit("a transform's own bug")))


# -- derived outputs (docs/derived-tables.md) ------------------------------------------------


def pageviews_with_tombstones(records: DataFrame) -> DataFrame:
    """The page-view parse for a topic keyed by user, where a null value is a tombstone
    (the user is deleted), not a bad record: it goes to the table with `user` taken from
    the Kafka key and its other fields null, so an upsert output can delete the key."""
    text = F.col("value").cast("string")
    parsed = F.when(
        F.ltrim(text).startswith("{"),
        F.from_json(
            text, PAGEVIEW, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt"}
        ),
    )
    with_json = records.withColumn("_p", parsed)
    tombstone = F.col("value").isNull()
    error = (
        F.when(tombstone, F.lit(None).cast("string"))
        .when(F.col("_p").isNull(), F.lit("value is not a JSON object"))
        .when(F.col("_p._corrupt").isNotNull(), F.lit("value is not valid JSON"))
        .when(F.col("_p.app").isNull(), F.lit("missing field: app"))
    )
    return with_json.select(
        F.col("_p.event_id").alias("event_id"),
        F.col("_p.app").alias("app"),
        F.when(tombstone, F.col("key").cast("string")).otherwise(F.col("_p.user")).alias("user"),
        F.col("_p.url").alias("url"),
        F.try_to_timestamp(F.col("_p.ts")).alias("ts"),
        *COORDINATES,
        "value",
        error.alias("_error"),
    )


# -- every column type (tests/test_types.py) --------------------------------------------------

#: One column of every type a Delta table holds, as a JSON record spells it: decimals of
#: each Parquet encoding Spark picks (INT32 up to precision 9, INT64 up to 18, fixed bytes
#: up to 38), every integer width, floats that may be NaN or infinite, dates and timestamps
#: with and without time zone, binary (base64 in JSON), unicode text and nested types.
EVERY_TYPE = T.StructType(
    [
        T.StructField("id", T.IntegerType()),
        T.StructField("dec9", T.DecimalType(9, 2)),
        T.StructField("dec18", T.DecimalType(18, 4)),
        T.StructField("dec38", T.DecimalType(38, 10)),
        T.StructField("tiny", T.ByteType()),
        T.StructField("small", T.ShortType()),
        T.StructField("medium", T.IntegerType()),
        T.StructField("big", T.LongType()),
        T.StructField("f32", T.FloatType()),
        T.StructField("f64", T.DoubleType()),
        T.StructField("f64_finite", T.DoubleType()),
        T.StructField("flag", T.BooleanType()),
        T.StructField("day", T.DateType()),
        T.StructField("ts", T.TimestampType()),
        T.StructField("ts_ntz", T.TimestampNTZType()),
        T.StructField("blob", T.BinaryType()),
        T.StructField("text", T.StringType()),
        T.StructField("tags", T.ArrayType(T.StringType())),
        T.StructField("amounts", T.MapType(T.StringType(), T.DecimalType(12, 2))),
        T.StructField(
            "point",
            T.StructType(
                [
                    T.StructField("x", T.DoubleType()),
                    T.StructField("label", T.StringType()),
                    T.StructField("day", T.DateType()),
                    T.StructField("amount", T.DecimalType(12, 2)),
                    T.StructField("dims", T.ArrayType(T.IntegerType())),
                ]
            ),
        ),
        T.StructField("_corrupt", T.StringType()),
    ]
)


def every_type(records: DataFrame) -> DataFrame:
    """JSON records into one typed column per field of EVERY_TYPE, parsed by Spark itself
    (decimals exactly from the JSON numbers, NaN and Infinity accepted, base64 binary), the
    way a data engineer's transform builds typed columns."""
    text = F.col("value").cast("string")
    parsed = F.from_json(
        text, EVERY_TYPE, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt"}
    )
    with_json = records.withColumn("_p", F.when(F.ltrim(text).startswith("{"), parsed))
    error = (
        F.when(F.col("_p").isNull(), F.lit("value is not a JSON object"))
        .when(F.col("_p._corrupt").isNotNull(), F.lit("value is not valid JSON"))
        .when(F.col("_p.id").isNull(), F.lit("missing field: id"))
    )
    fields = [f.name for f in EVERY_TYPE.fields if f.name != "_corrupt"]
    return with_json.select(
        *(F.col(f"_p.{name}").alias(name) for name in fields),
        *COORDINATES,
        "value",
        error.alias("_error"),
    )


def pageviews_exhausting_memory(records: DataFrame) -> DataFrame:
    """The page-view transform with a column no heap holds: each row an array of 200 million
    copies of its value, so the JVM running the task runs out of memory."""
    huge = F.array_repeat(F.col("value").cast("string"), 200_000_000)
    return pageviews(records).withColumn("app", F.concat_ws(",", huge))


#: A file the first task attempt of `pageviews_killing_its_executor` creates; given to the
#: executors through `spark.executorEnv.<this>`.
KILL_MARKER_ENV = "EXACTLY_TEST_EXECUTOR_KILL_MARKER"


def pageviews_killing_its_executor(records: DataFrame) -> DataFrame:
    """The page-view transform, whose first task attempt kills the executor running it (a
    lost executor, as a node's OOM killer or a preempted VM causes); the retry parses."""

    def kill_own_executor_once(value):  # type: ignore[no-untyped-def]  # (hints: a warning)
        """In a Spark Python worker: the first call anywhere (the marker file is created
        exclusively) SIGKILLs the executor JVM this worker serves, found up the parent
        chain; every other call returns `value` as it is. Nested, so that cloudpickle
        ships it by value: the cluster's Python workers cannot import `tests`."""
        import signal
        from pathlib import Path

        try:
            fd = os.open(os.environ[KILL_MARKER_ENV], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return value
        os.close(fd)
        pid = os.getpid()
        while pid > 1:
            if b"CoarseGrainedExecutorBackend" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
                break
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        return value

    killer = F.udf(kill_own_executor_once, T.BinaryType())
    return pageviews(records.withColumn("value", killer("value")))


def _same(value):  # type: ignore[no-untyped-def]  # (hints: pyspark warns it cannot use them)
    return value


def pageviews_via_a_top_level_udf(records: DataFrame) -> DataFrame:
    """The page-view transform through a UDF defined at this module's top level, which
    cloudpickle ships by reference: a Python worker must import `tests.transforms`, which a
    cluster's workers cannot (a transform importable in the driver only)."""
    return pageviews(records.withColumn("value", F.udf(_same, T.BinaryType())("value")))
