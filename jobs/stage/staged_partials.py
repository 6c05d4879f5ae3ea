"""Each derived output's partial, staged with the batch: computed by Spark from the table's
staged files read back, written into the output's own attempt folder and described for the
vote. What a partial is (groups, latest records) is jobs/derived/partials.py's; this module
is only where and when the stage writes one.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from jobs.derived.partials import aggregate_partial, latest_per_key
from jobs.stage import parquet_files
from jobs.stage.partition_columns import read_back
from ledger.core.layout import TABLE, derived_target
from ledger.core.ports import StageOutput
from resources.config.derived_spec import AnyOutput, UpsertOutput
from resources.config.partitioning import PartitionColumn
from resources.delta.schema import encode_schema
from resources.object_storage import storage


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
