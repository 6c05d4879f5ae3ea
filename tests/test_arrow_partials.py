"""The stage's derived partials without a Spark job (jobs/derived/arrow_partials.py), against
Spark's definition of them (jobs/derived/partials.py), with real Spark: the table's files are
staged as the stage stages them (one routed write, a partitioned table), then
`stage_partials` computes each output's partial from them.

Each partial is compared, row for row and type for type, with Spark's over the same staged
rows: decimals (widened by a sum), nulls in every column, windows before 1970 and without an
event time, tombstones. Where Arrow's answer might differ from Spark's (a sum that may
overflow, a float's max over NaN) the stage must ask Spark, and Spark's answer is the one
voted.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from jobs.derived.partials import aggregate_partial, latest_per_key
from jobs.stage import staged_partials
from jobs.stage.partition_columns import read_back, with_partition_columns
from jobs.stage.routing import routed, routed_folder, split_outputs, write_routed
from jobs.stage.staged_partials import stage_partials
from jobs.stage.staging import staged_output
from ledger.core.layout import QUARANTINE, TABLE, derived_target
from ledger.core.ports import StageOutput
from resources.config.derived_spec import AnyOutput, UpsertOutput, parse_output
from resources.config.partitioning import PartitionColumn
from resources.delta.schema import decode_schema
from resources.object_storage import storage
from tests.test_derived_partials import STAGE_OUT as DERIVED_STAGE_OUT

D = decimal.Decimal
STAGE_OUT = T.StructType(
    [
        T.StructField("user", T.StringType()),
        T.StructField("app", T.StringType()),
        T.StructField("amount", T.DecimalType(10, 2)),
        T.StructField("size", T.IntegerType()),
        T.StructField("score", T.DoubleType()),
        T.StructField("ts", T.TimestampType()),
        # the stage's own columns, as tests/test_derived_partials.py's frame has them
        *[f for f in DERIVED_STAGE_OUT.fields if f.name.startswith("_") or f.name == "value"],
    ]
)
T0 = dt.datetime(2026, 11, 25, 12, 0, tzinfo=dt.UTC)
EPOCH_DAY_2 = dt.datetime(1970, 1, 2, tzinfo=dt.UTC)
DAY = [PartitionColumn(name="day", date_of="ts")]


def frame(
    spark: SparkSession, n: int, schema: T.StructType = STAGE_OUT, **overrides: Any
) -> DataFrame:
    """`n` records over 4 apps, 7 users and 3 Kafka partitions; every tenth has no amount,
    every seventh no event time, every thirteenth is a tombstone, every 17th malformed."""
    rows = []
    for i in range(n):
        minute = None if i % 7 == 0 else (i * 37) % 8000 - 4000  # 1969 too
        record = {
            "user": f"u{i % 7}",
            "app": None if i % 11 == 0 else f"app{i % 4}",
            "amount": None if i % 10 == 0 else D(i % 1000) / 100 - D(3),
            "size": i % 500,
            "score": (i % 9) / 3.0,
            "ts": None if minute is None else EPOCH_DAY_2 + dt.timedelta(seconds=minute * 61),
            "_kafka_topic": "t",
            "_kafka_partition": i % 3,
            "_kafka_offset": i,
            "_kafka_timestamp": T0,
            "_batch_id": 1,
            "value": None if i % 13 == 0 else b"{}",
            "_error": "value is not valid JSON" if i % 17 == 0 else None,
        }
        record.update({k: v(i) for k, v in overrides.items()})
        rows.append(tuple(record[f.name] for f in schema.fields))
    return spark.createDataFrame(rows, schema)


def specs(root: Path) -> list[AnyOutput]:
    return [
        parse_output(
            {
                "kind": "aggregate",
                "name": "per_app_minute",
                "table_uri": str(root / "per_app_minute"),
                "group_by": ["app"],
                "measures": [
                    {"name": "views", "fn": "count"},
                    {"name": "spent", "fn": "sum", "column": "amount"},
                    {"name": "bytes", "fn": "sum", "column": "size"},
                    {"name": "points", "fn": "sum", "column": "score"},
                    {"name": "first_seen", "fn": "min", "column": "ts"},
                    {"name": "largest", "fn": "max", "column": "amount"},
                    {"name": "best", "fn": "max", "column": "score"},
                ],
                "window": {"column": "ts", "size": "1 minute"},
            }
        ),
        parse_output(
            {
                "kind": "aggregate",
                "name": "per_user_day",
                "table_uri": str(root / "per_user_day"),
                "group_by": ["user", "day"],
                "measures": [{"name": "views", "fn": "count"}],
            }
        ),
        parse_output(
            {"kind": "upsert", "name": "users", "table_uri": str(root / "users"), "key": ["user"]}
        ),
    ]


def staged(spark: SparkSession, out: DataFrame, root: Path) -> tuple[StageOutput, DataFrame, dict]:
    """Stage `out` as the stage does: partition columns, one routed write, described."""
    out = with_partition_columns(out, DAY, "test")
    good, bad = split_outputs(out, tombstones=True)
    roots = {TABLE: str(root / "table"), QUARANTINE: str(root / "quarantine")}
    dirs = {TABLE: str(root / "table/_staged/a1"), QUARANTINE: str(root / "quarantine/_staged/a1")}
    write_routed(routed(out, tombstones=True), dirs, ["day"])
    output = staged_output(
        good,
        bad,
        batch_id=1,
        records_read=0,
        attempt_dirs={TABLE: routed_folder(dirs[TABLE], TABLE), QUARANTINE: dirs[QUARANTINE]},
        table_roots=roots,
        seconds={},
    )
    return output, good, roots


def partials(
    spark: SparkSession, out: DataFrame, root: Path, outputs: list[AnyOutput]
) -> tuple[StageOutput, list[int], DataFrame]:
    """Stage `out` and its partials; the Spark jobs the partials ran, and the staged rows."""
    output, good, roots = staged(spark, out, root)
    for spec in outputs:
        roots[derived_target(spec.name)] = spec.table_uri
    dirs = {derived_target(s.name): f"{s.table_uri}/_staged/a1" for s in outputs}
    spark.sparkContext.setJobGroup("partials", "the stage's derived partials")
    try:
        output = stage_partials(
            spark, output, good, outputs, attempt_dirs=dirs, table_roots=roots, partition_by=DAY
        )
    finally:
        jobs = list(spark.sparkContext.statusTracker().getJobIdsForGroup("partials"))
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    paths = [storage.join(roots[TABLE], f.path) for f in output.files if f.target == TABLE]
    schema = T.StructType([T.StructField(f.name, f.dataType, True) for f in good.schema.fields])
    return output, jobs, read_back(spark.read, paths, schema, DAY)


def voted(output: StageOutput, spec: AnyOutput) -> pa.Table:
    """The partial the vote describes for `spec`: its files, read with its voted schema."""
    target = derived_target(spec.name)
    schema = decode_schema(output.schemas[target])
    tables = [
        storage.read_parquet(storage.join(spec.table_uri, f.path)).select(schema.names)
        for f in output.files
        if f.target == target
    ]
    return pa.concat_tables([t.cast(schema) for t in tables]) if tables else schema.empty_table()


def spark_partial(rows: DataFrame, spec: AnyOutput) -> pa.Table:
    partial = (
        latest_per_key(rows, spec)
        if isinstance(spec, UpsertOutput)
        else aggregate_partial(rows, spec)
    )
    return partial.toArrow()


def _comparable(value: Any) -> Any:
    """A float as its value to 12 significant digits (a sum's last bits follow the order
    it adds in, which Spark does not fix either) and NaN as a NaN."""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else float(f"{value:.12g}")
    return value


def same_rows(actual: pa.Table, expected: pa.Table) -> None:
    assert actual.schema == expected.schema

    def rows(table: pa.Table) -> list[dict[str, Any]]:
        found = [{k: _comparable(v) for k, v in r.items()} for r in table.to_pylist()]
        return sorted(found, key=lambda r: tuple((v is None, str(v)) for v in r.values()))

    assert rows(actual) == rows(expected)


def test_the_stage_s_partials_run_no_spark_job_and_equal_spark_s(
    spark: SparkSession, tmp_path: Path
) -> None:
    outputs = specs(tmp_path)
    output, jobs, rows = partials(spark, frame(spark, 700), tmp_path, outputs)
    assert jobs == [], f"the partials ran Spark jobs {jobs}"
    for spec in outputs:
        same_rows(voted(output, spec), spark_partial(rows, spec))
    spent = voted(output, outputs[0]).schema.field("spent").type
    assert spent == pa.decimal128(20, 2)  # Spark's widening of a sum of decimal(10, 2)


def test_each_staged_file_is_read_once_for_every_output(
    spark: SparkSession, tmp_path: Path, monkeypatch: Any
) -> None:
    """Three outputs, one read of each staged file: a read per output was a third of the
    partials' cost (bench/derived_cost.py)."""
    outputs = specs(tmp_path)
    output, good, roots = staged(spark, frame(spark, 700), tmp_path)
    roots.update({derived_target(s.name): s.table_uri for s in outputs})
    dirs = {derived_target(s.name): f"{s.table_uri}/_staged/a1" for s in outputs}
    reads: list[str] = []
    real = storage.read_parquet

    def counted(uri: str, columns: Any = None) -> pa.Table:
        reads.append(uri)
        return real(uri, columns)

    monkeypatch.setattr(storage, "read_parquet", counted)
    stage_partials(
        spark, output, good, outputs, attempt_dirs=dirs, table_roots=roots, partition_by=DAY
    )
    staged_files = [storage.join(roots[TABLE], f.path) for f in output.files if f.target == TABLE]
    assert len(staged_files) > 1
    assert sorted(r for r in reads if r.startswith(roots[TABLE])) == sorted(staged_files)


def test_an_empty_batch_s_partials_have_spark_s_schema(spark: SparkSession, tmp_path: Path) -> None:
    outputs = specs(tmp_path)
    output, jobs, rows = partials(spark, frame(spark, 0), tmp_path, outputs)
    assert jobs == []
    for spec in outputs:
        same_rows(voted(output, spec), spark_partial(rows, spec))


def one_aggregate(root: Path, measure: dict[str, str]) -> list[AnyOutput]:
    spec = {"kind": "aggregate", "name": "agg", "table_uri": str(root / "agg")}
    return [parse_output({**spec, "group_by": ["app"], "measures": [measure]})]


def test_a_sum_that_might_overflow_is_spark_s(spark: SparkSession, tmp_path: Path) -> None:
    """Two amounts of 3e35 in decimal(38, 2): their sum fits Spark's decimal(38, 2), but
    passes half its range, where Arrow's sum is no longer known not to wrap."""
    outputs = one_aggregate(tmp_path, {"name": "spent", "fn": "sum", "column": "amount"})
    big = T.StructType(
        [T.StructField(f.name, T.DecimalType(38, 2)) if f.name == "amount" else f
         for f in STAGE_OUT.fields]
    )  # fmt: skip
    rows = frame(spark, 40, big, amount=lambda i: D("3e35") if i in (1, 5) else D(i))
    output, jobs, staged_rows = partials(spark, rows, tmp_path, outputs)
    assert jobs, "Spark was not asked"
    same_rows(voted(output, outputs[0]), spark_partial(staged_rows, outputs[0]))
    assert max(voted(output, outputs[0]).column("spent").to_pylist()) > D("6e35")


def test_a_float_max_over_nan_is_spark_s(spark: SparkSession, tmp_path: Path) -> None:
    outputs = one_aggregate(tmp_path, {"name": "best", "fn": "max", "column": "score"})
    rows = frame(spark, 40, score=lambda i: float("nan") if i == 5 else 1.0)
    output, jobs, staged_rows = partials(spark, rows, tmp_path, outputs)
    assert jobs, "Spark was not asked"
    same_rows(voted(output, outputs[0]), spark_partial(staged_rows, outputs[0]))


def test_a_partial_s_schema_is_analysed_once_wherever_its_output_lives(
    spark: SparkSession, tmp_path: Path, monkeypatch: Any
) -> None:
    """The schema depends on what an output computes, not on where it is written: two
    pipelines with the same outputs in other folders (every test, every Dagster pipeline
    of one code location) share one analysis."""
    analysed: list[str] = []
    real = staged_partials._spark_partial

    def counted(rows: DataFrame, spec: AnyOutput) -> DataFrame:
        analysed.append(spec.name)
        return real(rows, spec)

    monkeypatch.setattr(staged_partials, "_spark_partial", counted)
    rows = frame(spark, 1).schema

    def schemas(root: Path) -> list[T.StructType]:
        # per_user_day groups by the table's partition column, which these rows lack
        outputs = [s for s in specs(root) if s.name != "per_user_day"]
        return [staged_partials.partial_schema(spark, s, rows) for s in outputs]

    first = schemas(tmp_path / "a")
    again = schemas(tmp_path / "b")
    assert again == first
    assert len(analysed) <= len(first)
