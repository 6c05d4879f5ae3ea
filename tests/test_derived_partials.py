"""jobs/derived/partials.py with real Spark: a batch's partial aggregate (with a tumbling window)
and its latest record per key, from frames shaped like the stage's transform output
(jobs/stage/staging.py: the table's columns, the coordinates, `value` and `_error`).

The partials are checked against the pyarrow recomputation (jobs/derived/invariants.py), and the
windowed aggregate end to end: partials of three batches merged into a real Delta table
equal one aggregate over every row.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from jobs.derived.invariants import (
    aggregate_differences,
    live_rows,
    recompute_aggregate,
    recompute_latest,
    upsert_differences,
)
from jobs.derived.partials import aggregate_partial, latest_per_key
from jobs.derived.replace import correction_partial, in_ranges, upsert_replacement
from ledger.core.errors import ConfigError
from ledger.core.protocol import OffsetRange
from resources.config.derived_spec import AggregateOutput, UpsertOutput, parse_output
from resources.delta.merge import merge_aggregate, merge_upsert
from resources.delta.table import DeltaTarget

STAGE_OUT = T.StructType(
    [
        T.StructField("user", T.StringType()),
        T.StructField("app", T.StringType()),
        T.StructField("size", T.LongType()),
        T.StructField("ts", T.TimestampType()),
        T.StructField("_kafka_topic", T.StringType()),
        T.StructField("_kafka_partition", T.IntegerType()),
        T.StructField("_kafka_offset", T.LongType()),
        T.StructField("_kafka_timestamp", T.TimestampType()),
        T.StructField("_batch_id", T.LongType()),
        T.StructField("value", T.BinaryType()),
        T.StructField("_error", T.StringType()),
    ]
)
T0 = dt.datetime(2026, 11, 25, 12, 0, tzinfo=dt.UTC)


def stage_out(
    spark: SparkSession,
    rows: list[tuple[Any, ...]],
    batch_id: int,
) -> DataFrame:
    """Rows (user, app, size, second, partition, offset, value, error) as the stage's frame."""
    return spark.createDataFrame(
        [
            (
                user, app, size, None if sec is None else T0 + dt.timedelta(seconds=sec),
                "pageviews", partition, offset, T0, batch_id, value, error,
            )
            for user, app, size, sec, partition, offset, value, error in rows
        ],
        STAGE_OUT,
    )  # fmt: skip


def windowed(uri: str) -> AggregateOutput:
    spec = parse_output(
        {
            "kind": "aggregate",
            "name": "views_per_minute",
            "table_uri": uri,
            "group_by": ["app"],
            "measures": [
                {"name": "views", "fn": "count"},
                {"name": "bytes", "fn": "sum", "column": "size"},
                {"name": "first_seen", "fn": "min", "column": "ts"},
                {"name": "largest", "fn": "max", "column": "size"},
            ],
            "window": {"column": "ts", "size": "1 minute"},
        }
    )
    assert isinstance(spec, AggregateOutput)
    return spec


V = b"{}"
BATCHES = [
    [
        ("u1", "a", 10, 1, 0, 0, V, None),
        ("u2", "a", 20, 59, 1, 0, V, None),
        ("u1", "a", 5, 60, 0, 1, V, None),  # the next minute
        ("u3", "b", None, 61, 1, 1, V, None),
        ("u4", None, 7, 62, 0, 2, V, None),  # no app: a group of its own
        ("u5", "a", 1000, 3, 0, 3, b"x", "value is not valid JSON"),  # quarantined
        ("u6", "c", 1, None, 1, 2, V, None),  # no event time: no window
    ],
    [
        ("u1", "a", 1, 30, 0, 4, V, None),
        ("u2", "b", 2, 125, 1, 3, V, None),
        ("u7", None, 3, 2, 1, 4, V, None),
    ],
    [
        ("u1", "a", 4, 59, 0, 5, V, None),
        ("u1", "c", 6, 10_000, 0, 6, V, None),
    ],
]


def test_the_partial_aggregate_per_window_matches_the_recomputation(
    spark: SparkSession, tmp_path: Path
) -> None:
    spec = windowed(str(tmp_path / "agg"))
    frame = stage_out(spark, BATCHES[0], 1)
    partial = aggregate_partial(frame, spec).toArrow()
    assert set(partial.column_names) == {
        "app", "window_start", "window_end", "views", "bytes", "first_seen", "largest"
    }  # fmt: skip
    expected = recompute_aggregate(frame.toArrow(), spec)
    assert aggregate_differences(expected, partial, spec) == []
    rows = {
        (r["app"], None if r["window_start"] is None else r["window_start"].minute): r
        for r in partial.to_pylist()
    }
    assert rows[("a", 0)]["views"] == 2  # the quarantined row is in no output
    assert rows[("a", 0)]["bytes"] == 30
    assert rows[("a", 0)]["window_end"] - rows[("a", 0)]["window_start"] == dt.timedelta(minutes=1)
    assert rows[("a", 1)]["views"] == 1
    assert rows[("b", 1)]["bytes"] is None
    assert rows[(None, 1)]["views"] == 1
    assert rows[("c", None)]["window_end"] is None


def test_merged_partials_equal_one_aggregate_over_every_row(
    spark: SparkSession, tmp_path: Path
) -> None:
    uri = str(tmp_path / "agg")
    spec = windowed(uri)
    target = DeltaTarget(uri)
    frames = [stage_out(spark, rows, i) for i, rows in enumerate(BATCHES, start=1)]
    for batch_id, frame in enumerate(frames, start=1):
        partial = aggregate_partial(frame, spec).toArrow()
        outcome = merge_aggregate(
            target, spec, partial, app_id=spec.app_id("pv"), batch_id=batch_id
        )
        assert outcome.applied
    # batch 2 re-driven: already applied
    redriven = merge_aggregate(
        target, spec, aggregate_partial(frames[1], spec).toArrow(), app_id=spec.app_id("pv"),
        batch_id=2,
    )  # fmt: skip
    assert not redriven.applied
    every_row = pa.concat_tables([f.toArrow() for f in frames])
    actual = DeltaTable(uri).to_pyarrow_table()
    assert aggregate_differences(recompute_aggregate(every_row, spec), actual, spec) == []
    a_first_minute = [r for r in actual.to_pylist() if r["app"] == "a" and r["window_start"] == T0]
    assert [(r["views"], r["bytes"], r["largest"]) for r in a_first_minute] == [(4, 35, 20)]
    assert a_first_minute[0]["first_seen"] == T0 + dt.timedelta(seconds=1)


def users(uri: str) -> UpsertOutput:
    spec = parse_output({"kind": "upsert", "name": "users", "table_uri": uri, "key": ["user"]})
    assert isinstance(spec, UpsertOutput)
    return spec


def test_latest_per_key_takes_the_highest_partition_and_offset(
    spark: SparkSession, tmp_path: Path
) -> None:
    spec = users(str(tmp_path / "users"))
    frame = stage_out(
        spark,
        [
            ("u1", "a", 1, 1, 0, 7, V, None),
            ("u1", "b", 2, 2, 0, 9, V, None),  # the latest of u1
            ("u1", "c", 3, 3, 0, 8, V, None),
            ("u2", "a", 1, 1, 1, 2, V, None),
            ("u2", "z", 1, 1, 0, 50, V, None),  # a lower partition loses, whatever its offset
            ("u3", "a", 1, 1, 0, 3, V, None),
            ("u3", None, None, None, 0, 4, None, None),  # tombstone: the latest of u3
            ("u4", None, None, None, 1, 5, None, None),  # tombstone ...
            ("u4", "d", 4, 4, 1, 6, V, None),  # ... then a new record
            ("u5", "q", 1, 1, 0, 99, b"!", "value is not valid JSON"),  # quarantined
        ],
        1,
    )
    partial = latest_per_key(frame, spec).toArrow()
    assert "value" not in partial.column_names and "_error" not in partial.column_names
    got = {
        r["user"]: (r["app"], r["_kafka_partition"], r["_kafka_offset"], r["_deleted"])
        for r in partial.to_pylist()
    }
    assert got == {
        "u1": ("b", 0, 9, False),
        "u2": ("a", 1, 2, False),
        "u3": (None, 0, 4, True),
        "u4": ("d", 1, 6, False),
    }
    target = DeltaTarget(spec.table_uri)
    merge_upsert(target, spec, partial, app_id=spec.app_id("pv"), batch_id=1)
    table = DeltaTable(spec.table_uri).to_pyarrow_table()
    assert sorted(live_rows(table).column("user").to_pylist()) == ["u1", "u2", "u4"]
    # u3's tombstone stays as a row, so an older fill of u3 cannot bring it back
    assert [r["user"] for r in table.to_pylist() if r["_deleted"]] == ["u3"]
    assert upsert_differences(recompute_latest(frame.toArrow(), spec), table, spec) == []


def test_a_frame_that_cannot_show_tombstones_is_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    spec = users(str(tmp_path / "users"))
    table_rows = stage_out(spark, BATCHES[1], 2).drop("value", "_error")
    with pytest.raises(ConfigError, match="neither `value` nor `_deleted`"):
        latest_per_key(table_rows, spec)
    flagged = table_rows.withColumn("_deleted", table_rows["user"] == "u7")
    got = {r["user"]: r["_deleted"] for r in latest_per_key(flagged, spec).toArrow().to_pylist()}
    assert got == {"u1": False, "u2": False, "u7": True}
    with pytest.raises(ConfigError, match="no column"):
        aggregate_partial(table_rows, windowed(str(tmp_path / "x")).model_copy(
            update={"group_by": ["country"]}
        ))  # fmt: skip


REPLACED = [OffsetRange("pageviews", 1, 3, 5)]  # batch 2's rows of partition 1
NEW_ROWS = [
    ("u2", "d", 9, 125, 1, 3, V, None),  # b's minute-2 row becomes d's
    ("u7", None, 3, 2, 1, 4, b"x", "value is not valid JSON"),  # now quarantined
]


def counts(uri: str) -> AggregateOutput:
    """The windowed output without min/max, which a replace refuses."""
    spec = windowed(uri)
    return spec.model_copy(update={"measures": spec.measures[:2]})


def test_a_replace_correction_over_spark_partials_matches_the_raw_rows_after_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The table is built from Spark's partials, the new rows' partial is Spark's, the old
    rows' is pyarrow's (they are read from the raw table): their types must meet, and the
    table must end equal to the recomputation over the raw rows after the replace."""
    uri = str(tmp_path / "agg")
    spec = counts(uri)
    target = DeltaTarget(uri)
    frames = [stage_out(spark, rows, i) for i, rows in enumerate(BATCHES, start=1)]
    for batch_id, frame in enumerate(frames, start=1):
        partial = aggregate_partial(frame, spec).toArrow()
        merge_aggregate(target, spec, partial, app_id=spec.app_id("pv"), batch_id=batch_id)
    raw_before = pa.concat_tables([f.toArrow() for f in frames])
    hit = in_ranges(raw_before, REPLACED)
    new_frame = stage_out(spark, NEW_ROWS, 4)
    correction = correction_partial(
        recompute_aggregate(raw_before.filter(hit), spec),
        aggregate_partial(new_frame, spec).toArrow(),
        spec,
    )
    outcome = merge_aggregate(
        target, spec, correction, app_id=spec.app_id("pv.backfill"), batch_id=1,
        correction=True,
    )  # fmt: skip
    assert outcome.applied
    raw_after = pa.concat_tables([raw_before.filter(pc.invert(hit)), new_frame.toArrow()])
    actual = DeltaTable(uri).to_pyarrow_table()
    assert aggregate_differences(recompute_aggregate(raw_after, spec), actual, spec) == []
    two_minutes = T0 + dt.timedelta(minutes=2)
    groups = {(r["app"], r["window_start"]) for r in actual.to_pylist()}
    assert ("b", two_minutes) not in groups and ("d", two_minutes) in groups


def test_an_upsert_replace_over_spark_partials_matches_the_raw_rows_after_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The same for an upsert: a table built from Spark's latest_per_key, the replacement
    computed in pyarrow from the stage's rows (tombstones by Kafka's value)."""
    uri = str(tmp_path / "users")
    spec = users(uri)
    target = DeltaTarget(uri)
    batches = [
        [("u1", "a", 1, 1, 0, 1, V, None), ("u2", "a", 1, 1, 1, 1, V, None)],
        [
            ("u1", "b", 2, 2, 0, 2, V, None),
            ("u2", None, None, None, 1, 2, None, None),  # tombstone, replaced by a record
            ("u3", "c", 3, 3, 1, 3, V, None),  # u3's only record, replaced by nothing
        ],
    ]
    frames = [stage_out(spark, rows, i) for i, rows in enumerate(batches, start=1)]
    for batch_id, frame in enumerate(frames, start=1):
        partial = latest_per_key(frame, spec).toArrow()
        merge_upsert(target, spec, partial, app_id=spec.app_id("pv"), batch_id=batch_id)
    ranges = [OffsetRange("pageviews", 1, 2, 4)]
    new_frame = stage_out(spark, [("u2", "z", 9, 9, 1, 2, V, None)], 3)
    raw_before = pa.concat_tables([f.toArrow() for f in frames])
    replacement = upsert_replacement(raw_before, ranges, new_frame.toArrow(), spec)
    merge_upsert(
        target, spec, replacement, app_id=spec.app_id("pv.backfill"), batch_id=1,
        replaced=ranges,
    )  # fmt: skip
    hit = in_ranges(raw_before, ranges)
    raw_after = pa.concat_tables([raw_before.filter(pc.invert(hit)), new_frame.toArrow()])
    table = DeltaTable(uri).to_pyarrow_table()
    assert upsert_differences(recompute_latest(raw_after, spec), table, spec) == []
    assert sorted(live_rows(table)["user"].to_pylist()) == ["u1", "u2"]


def test_a_tombstone_row_is_no_event_for_an_aggregate(spark: SparkSession, tmp_path: Path) -> None:
    # a pipeline with an upsert output keeps its tombstones in the raw table (`_deleted`
    # true, every parsed field null): a delete marker, not a page view of no app
    from pyspark.sql import functions as F

    spec = windowed(str(tmp_path / "agg"))
    rows = [
        ("u1", "a", 10, 1, 0, 0, V, None),
        ("u2", None, 7, 2, 0, 1, V, None),  # a record with no app: a group of its own
        (None, None, None, None, 0, 2, None, None),  # the tombstone of a key
    ]
    staged = stage_out(spark, rows, 1).withColumn("_deleted", F.col("value").isNull())
    table_rows = staged.drop("value", "_error")
    partial = aggregate_partial(table_rows, spec).toArrow()
    by_app = sorted((r["app"] or "", r["views"]) for r in partial.to_pylist())
    assert by_app == [("", 1), ("a", 1)]
    recomputed = recompute_aggregate(table_rows.toArrow(), spec)
    assert sorted((r["app"] or "", r["views"]) for r in recomputed.to_pylist()) == by_app


def test_records_of_two_topics_at_the_same_coordinates_are_ordered_by_topic_everywhere(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Kafka orders no record of one topic against another's: an upsert on several topics
    breaks a tie of (partition, offset) by the topic's name, in Spark's partial, in the
    MERGE and in the recomputation the checks and a rebuild use, so all three agree
    whichever order the rows come in, batch by batch or all at once."""
    spec = users(str(tmp_path / "users"))

    def frame(rows: list[tuple[str, str, str]], batch_id: int) -> DataFrame:
        """(user, app, topic), every one at partition 0, offset 5."""
        return spark.createDataFrame(
            [(u, a, 1, T0, t, 0, 5, T0, batch_id, V, None) for u, a, t in rows], STAGE_OUT
        )

    both = frame([("u1", "from b", "orders-b"), ("u1", "from a", "orders-a"),
                  ("u2", "from a", "orders-a"), ("u2", "from b", "orders-b")], 1)  # fmt: skip
    got = {r["user"]: r["app"] for r in latest_per_key(both, spec).toArrow().to_pylist()}
    assert got == {"u1": "from b", "u2": "from b"}
    expected = recompute_latest(both.toArrow(), spec)
    assert {r["user"]: r["app"] for r in expected.to_pylist()} == got

    # one topic's record per batch, in either order: the MERGE keeps orders-b's
    target = DeltaTarget(spec.table_uri)
    applied = []
    for batch_id, (user, topic) in enumerate(
        [("u1", "orders-a"), ("u1", "orders-b"), ("u2", "orders-b"), ("u2", "orders-a")], 1
    ):
        one = frame([(user, f"from {topic[-1]}", topic)], batch_id)
        applied.append(one.toArrow())
        merge_upsert(
            target, spec, latest_per_key(one, spec).toArrow(), app_id="pv", batch_id=batch_id
        )
    table = DeltaTable(spec.table_uri).to_pyarrow_table()
    assert {r["user"]: r["app"] for r in live_rows(table).to_pylist()} == got
    assert upsert_differences(recompute_latest(pa.concat_tables(applied), spec), table, spec) == []


def test_a_rebuilt_postgres_output_is_typed_as_the_stage_s_partials(spark: SparkSession) -> None:
    """A PostgreSQL output's columns are created from the first partial it gets, and every
    later partial must have exactly those types (resources/postgres/target.py
    `check_schema`). A rebuild creates them from its recomputation, whose Arrow sum of
    decimal(10, 2) is decimal(38, 2) where Spark's partial has decimal(20, 2): typed so,
    every later batch would be refused. The rebuild's rows are cast to Spark's analysis of
    the partial over the raw table's schema, and come out as a staged partial does."""
    from jobs.stage.staged_partials import aggregate_arrow_schema

    spec = parse_output(
        {
            "kind": "postgres",
            "name": "revenue",
            "url": "postgresql+psycopg://nobody@127.0.0.1/none",
            "table": "revenue",
            "group_by": ["app"],
            "window": {"column": "ts", "size": "1 minute"},
            "measures": [
                {"name": "orders", "fn": "count"},
                {"name": "amount", "fn": "sum", "column": "amount"},
                {"name": "items", "fn": "sum", "column": "items"},
                {"name": "cheapest", "fn": "min", "column": "amount"},
            ],
        }
    )
    raw = pa.table(
        {
            "app": ["web", "web", None],
            "ts": pa.array([dt.datetime(2026, 1, 1, tzinfo=dt.UTC)] * 3, pa.timestamp("us", "UTC")),
            "amount": pa.array([1, 2, 3], pa.decimal128(10, 2)),
            "items": pa.array([1, 2, 3], pa.int32()),
        }
    )
    # a column the aggregate does not read, of a type Spark cannot take from Arrow
    unread = raw.append_column("checksum", pa.array([1, 2, 3], pa.uint64()))
    kind = aggregate_arrow_schema(spark, spec, unread.schema)
    staged = aggregate_partial(spark.createDataFrame(raw.to_pandas()), spec)
    assert kind.names == staged.columns
    assert kind.field("amount").type == pa.decimal128(20, 2)
    assert kind.field("items").type == pa.int64()
    assert kind.field("cheapest").type == pa.decimal128(10, 2)
    assert recompute_aggregate(raw, spec).field("amount").type != kind.field("amount").type
    rows = recompute_aggregate(raw, spec).select(kind.names).cast(kind)
    assert rows.schema == kind and rows.num_rows == 2
