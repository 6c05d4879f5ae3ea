"""A batch's partial for each derived output, as Spark computes it: the definition. The stage
computes the same partial in Arrow, without a Spark job, wherever Arrow's answer is
provably this one (jobs/derived/arrow_partials.py), and runs this where it might not be.

The input is the transform's output as the stage holds it before splitting it between the
table and the quarantine (jobs/stage/staging.py `stage`: `out`), or the table's own rows: the
table's columns plus the coordinates `_kafka_topic`, `_kafka_partition`, `_kafka_offset`
(ledger/core/layout.py KEY). Rows with an `_error` are quarantined (invariant 9) and are part
of no derived output, so they are left out here.

Tombstones. The stage keeps Kafka's `value` on the transform's output and drops it from the
table's rows (jobs/stage/routing.py `split_outputs`); the shipped example transform quarantines a
record with no value ("record has no value"). So a tombstone is a record whose Kafka `value`
is null and whose `_error` is null: a transform for an upsert output must let such records
through, with the key columns taken from the Kafka key. A frame without `value` (the raw
table's rows) must carry a boolean `_deleted` column instead, or `latest_per_key` refuses
it: the table's rows alone cannot tell a tombstone from a record whose fields are all null.

Order within a batch is (`_kafka_partition`, `_kafka_offset`, `_kafka_topic`), highest
last. Keys are assumed to hash to one partition (Kafka's default partitioner), where this
is Kafka's own order; a key seen in two partitions (a changed partitioner or partition
count) is resolved to the higher partition, which is deterministic (the same whatever order
batches are applied in) but not "latest in time". Kafka orders no topic's records against
another's: on a pipeline reading several topics, a key's records at the same partition and
offset of two topics are resolved by the topic's name, for the same reason (and the MERGE,
resources/delta/merge.py `_newer`, and the recomputation, jobs/derived/invariants.py
`latest_of`, break the tie the same way, so a rebuild equals the live table). The Kafka
timestamp is never the order: producers set it, and two records of one partition may
carry it out of order.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from ledger.core.errors import ConfigError
from ledger.core.layout import OFFSET, PARTITION, TOPIC
from resources.config.derived_spec import (
    DELETED,
    STAGE_ONLY,
    WINDOW_END,
    WINDOW_START,
    AggregateOutput,
    PostgresOutput,
    UpsertOutput,
)


def good_rows(df: DataFrame) -> DataFrame:
    """The rows that go to the table: those without an `_error` (invariant 9)."""
    return df.where(F.col("_error").isNull()) if "_error" in df.columns else df


def event_rows(df: DataFrame) -> DataFrame:
    """The rows an aggregate counts: the table's, less the tombstones a pipeline with an
    upsert output keeps in the raw table (`_deleted` true): a delete marker is no event."""
    rows = good_rows(df)
    return rows.where(~F.coalesce(F.col(DELETED), F.lit(False))) if DELETED in df.columns else rows


def _missing(df: DataFrame, columns: list[str], name: str) -> None:
    absent = [c for c in columns if c not in df.columns]
    if absent:
        raise ConfigError(
            f"derived output {name}: the batch has no column(s) {', '.join(absent)} "
            f"(it has {', '.join(df.columns)})"
        )


def _measure(fn: str, column: str | None) -> Column:
    if fn == "count":
        return F.count(F.lit(1))
    assert column is not None  # the spec's validation
    return {"sum": F.sum, "min": F.min, "max": F.max}[fn](F.col(column))


def aggregate_partial(df: DataFrame, spec: AggregateOutput | PostgresOutput) -> DataFrame:
    """The batch's partial aggregate: one row per group (and window), its measures over the
    batch's good rows only. Merged into the table by resources/delta/merge.py `merge_aggregate`.

    A window is tumbling and aligned to the epoch, as Spark's `window` with no start offset
    aligns it: columns `window_start` (inclusive) and `window_end` (exclusive). A row whose
    event time is null falls in no window: its window columns are null, a group of its own.
    Not Spark's `window` itself, which drops such rows from the aggregate without a word
    (tests/test_derived_partials.py found it): here every good row is counted somewhere.
    The bounds are integer microseconds (pmod), exact where a floating division is not.
    """
    needed = [*spec.group_by, *(m.column for m in spec.measures if m.column)]
    if spec.window is not None:
        needed.append(spec.window.column)
    _missing(df, needed, spec.name)
    rows = event_rows(df)
    keys: list[Column] = [F.col(c) for c in spec.group_by]
    if spec.window is not None:
        size = F.lit(spec.window.micros).cast("long")
        micros = F.unix_micros(F.col(spec.window.column).cast("timestamp"))
        start = micros - F.pmod(micros, size)
        keys += [
            F.timestamp_micros(start).alias(WINDOW_START),
            F.timestamp_micros(start + size).alias(WINDOW_END),
        ]
    measures = [_measure(m.fn, m.column).alias(m.name) for m in spec.measures]
    return rows.groupBy(*keys).agg(*measures)


def tombstone(df: DataFrame, name: str) -> Column:
    """Whether a row is a tombstone (module docstring): `_deleted` if the frame has it,
    else a null Kafka `value`; a frame with neither is refused."""
    if DELETED in df.columns:
        return F.coalesce(F.col(DELETED).cast("boolean"), F.lit(False))
    if "value" in df.columns:
        return F.col("value").isNull()
    raise ConfigError(
        f"derived output {name}: the batch has neither `value` nor `{DELETED}`, so a "
        "tombstone cannot be told from a record whose fields are all null"
    )


def latest_per_key(df: DataFrame, spec: UpsertOutput) -> DataFrame:
    """Per key, the batch's record with the highest (`_kafka_partition`, `_kafka_offset`),
    tombstones included and flagged `_deleted` (merge.py deletes the key for them).

    Columns: the frame's own minus the stage's (`value`, `_error`, ...), plus `_deleted`.
    A tombstone's other columns are whatever the transform gave it (typically null).
    """
    _missing(df, [*spec.key, PARTITION, OFFSET], spec.name)
    deleted = tombstone(df, spec.name)
    rows = good_rows(df).withColumn("_tomb", deleted)
    latest_first = [F.col(c).desc() for c in (PARTITION, OFFSET, TOPIC) if c in df.columns]
    order = Window.partitionBy(*[F.col(k) for k in spec.key]).orderBy(*latest_first)
    kept = [c for c in df.columns if c not in (*STAGE_ONLY, DELETED)]
    return (
        rows.withColumn("_rank", F.row_number().over(order))
        .where(F.col("_rank") == 1)
        .select(*kept, F.col("_tomb").alias(DELETED))
    )
