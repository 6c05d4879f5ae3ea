"""The stage's Arrow partials over several staged files (jobs/derived/arrow_partials.py
`partials_from_files`): a bound that only the files together pass must still send the
output to Spark. Plain pyarrow files and a hand-written partial schema: no JVM."""

from __future__ import annotations

import decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import types as T

from jobs.derived.arrow_partials import partials_from_files
from resources.config.derived_spec import parse_output

pytestmark = pytest.mark.unit

D = decimal.Decimal
AMOUNT = pa.decimal128(38, 2)
ROWS = T.StructType(
    [
        T.StructField("user", T.StringType()),
        T.StructField("app", T.StringType()),
        T.StructField("amount", T.DecimalType(38, 2)),
        T.StructField("_kafka_topic", T.StringType()),
        T.StructField("_kafka_partition", T.IntegerType()),
        T.StructField("_kafka_offset", T.LongType()),
        T.StructField("_deleted", T.BooleanType()),
    ]
)
SUM = parse_output(
    {
        "kind": "aggregate",
        "name": "spent",
        "table_uri": "unused",
        "group_by": ["app"],
        "measures": [{"name": "spent", "fn": "sum", "column": "amount"}],
    }
)
SUM_SCHEMA = pa.schema([("app", pa.string()), ("spent", AMOUNT)])


def staged_file(folder: Path, name: str, partition: int, amounts: list[D]) -> tuple[str, str]:
    rows = pa.table(
        {
            "user": [f"u{i % 3}" for i in range(len(amounts))],
            "app": [f"app{i % 2}" for i in range(len(amounts))],
            "amount": pa.array(amounts, AMOUNT),
            "_kafka_topic": ["t"] * len(amounts),
            "_kafka_partition": pa.array([partition] * len(amounts), pa.int32()),
            "_kafka_offset": pa.array(range(len(amounts)), pa.int64()),
            "_deleted": [False] * len(amounts),
        }
    )
    path = folder / name
    pq.write_table(rows, path)
    return str(path), name


def test_a_sum_bound_only_the_files_together_pass_goes_to_spark(tmp_path: Path) -> None:
    """Each file's magnitudes (3e35) are below half of decimal(38, 2)'s range (5e35); the
    two files' together are not, so Arrow's sum is not known not to wrap."""
    one = staged_file(tmp_path, "a.parquet", 0, [D("3e35")])
    two = staged_file(tmp_path, "b.parquet", 1, [D("3e35")])
    for files in ([one], [two]):
        (alone,) = partials_from_files(files, [(SUM, SUM_SCHEMA)], ROWS)
        assert alone is not None and alone["spent"].to_pylist() == [D("3e35")]
    assert partials_from_files([one, two], [(SUM, SUM_SCHEMA)], ROWS) == [None]
