"""The stage's side of a partitioned table: each row's partition values, computed in Spark
with the generation expression the table stores (resources/config/partitioning.py), so the value
a row is filed under is the value delta-spark would compute for it.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame, DataFrameReader
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ledger.core.errors import ConfigError
from resources.config.partitioning import PartitionColumn, generation_expression


def with_partition_columns(
    out: DataFrame, columns: Sequence[PartitionColumn], transform_name: str
) -> DataFrame:
    """The transform's output with each partition column added.

    The source must be a timestamp (an instant): a string or a timestamp without time zone
    would be read in the Spark session's zone, the very dependence the declared zone is
    there to remove. A quarantined row (`_error` set) gets null partition values: the
    quarantine is not partitioned, and one folder for all of its rows keeps the stage's
    move of them (jobs/stage/routing.py `move_quarantine`, which copies by file name) from
    meeting two files of one name from two partition folders.
    """
    if not columns:
        return out
    types = {f.name: f.dataType for f in out.schema.fields}
    lowered = {name.lower() for name in types}
    for i, column in enumerate(columns):
        where = f"delta.partition_by.{i}"
        if column.name.lower() in lowered:
            raise ConfigError(
                f"{where}.name: transform {transform_name} already returns a column "
                f"{column.name}; a partition column is generated, never given"
            )
        kind = types.get(column.date_of)
        if kind is None:
            raise ConfigError(
                f"{where}.date_of: transform {transform_name} returns no column "
                f"{column.date_of} (give a timestamp column of its output, or _kafka_timestamp)"
            )
        if not isinstance(kind, T.TimestampType):
            raise ConfigError(
                f"{where}.date_of: column {column.date_of} is {kind.simpleString()}, not a "
                "timestamp: its instant would depend on the Spark session's time zone"
            )
    good = F.col("_error").isNull() if "_error" in types else F.lit(True)
    return out.select(
        "*",
        *(
            F.when(good, F.expr(generation_expression(c))).cast("date").alias(c.name)
            for c in columns
        ),
    )


def read_back(
    reader: DataFrameReader,
    paths: Sequence[str],
    schema: T.StructType,
    columns: Sequence[PartitionColumn],
) -> DataFrame:
    """The rows of the table's staged files, read by their paths, with their partition
    columns: the files do not hold those (their folders say them), and Spark reading a
    file by its path does not take its folders for partitions, so each value is computed
    again from the row, by the same expression that chose its folder."""
    names = {c.name for c in columns}
    stored = T.StructType([f for f in schema.fields if f.name not in names])
    rows = reader.schema(stored).parquet(*paths)
    if not columns:
        return rows
    rows = with_partition_columns(rows, columns, "(the staged rows)")
    return rows.select(*schema.fieldNames())
