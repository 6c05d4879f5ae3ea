"""Each derived output's partial, staged with the batch: computed from the table's staged
files (in Arrow, or by Spark where Arrow's answer might differ), written into the output's
own attempt folder and described for the vote. What a partial is (groups, latest records)
is jobs/derived/partials.py's; this module is only where and when the stage writes one.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

from jobs.derived.arrow_partials import Aggregation, partials_from_files
from jobs.derived.invariants import aggregate_columns
from jobs.derived.partials import aggregate_partial, latest_per_key
from jobs.stage import parquet_files
from jobs.stage.partition_columns import read_back
from ledger.core.errors import InconsistencyError
from ledger.core.layout import TABLE, derived_target
from ledger.core.ports import StageOutput
from resources.config.derived_spec import AnyOutput, UpsertOutput
from resources.config.partitioning import PartitionColumn
from resources.delta.schema import encode_schema
from resources.object_storage import storage


def _spark_partial(rows: DataFrame, spec: AnyOutput) -> DataFrame:
    if isinstance(spec, UpsertOutput):
        return latest_per_key(rows, spec)
    return aggregate_partial(rows, spec)  # kept in Delta or in PostgreSQL: the same partial


#: Each partial's Spark schema by (session, output spec, rows' schema): Spark's analysis of
#: the plan costs 0.1-0.3 s per output here, more than Arrow's partial of a 100k batch, and
#: its answer changes only with the spec or the rows' schema.
_SCHEMAS: dict[tuple[int, str, str], T.StructType] = {}
#: The fields of an output that say where it is written, not what it holds.
_WHERE = {"table_uri", "url", "table"}


def partial_schema(spark: SparkSession, spec: AnyOutput, rows: T.StructType) -> T.StructType:
    """The Spark schema of `spec`'s partial over rows of schema `rows`: analysis only, no
    job; once per computation and schema in a session. Where the output lives (its table,
    its database) is no part of its schema, so outputs that compute the same thing in other
    places (another pipeline's, a test's) share the analysis."""
    key = (id(spark), spec.model_dump_json(exclude=_WHERE), rows.json())
    if key not in _SCHEMAS:
        _SCHEMAS[key] = _spark_partial(spark.createDataFrame([], rows), spec).schema
    return _SCHEMAS[key]


def aggregate_arrow_schema(spark: SparkSession, spec: Aggregation, rows: pa.Schema) -> pa.Schema:
    """`partial_schema` of an aggregate over rows of the Arrow schema `rows` (a raw
    table's), as Arrow: the types a rebuild writes, so that the next batch's partial fits
    the table it made (jobs/derived/postgres_rebuild.py). Only the columns the aggregate
    reads are given to Spark: another column of a type Spark cannot take from Arrow must
    not fail a rebuild it plays no part in."""
    used = aggregate_columns(spec)
    read = pa.schema([rows.field(name) for name in rows.names if name in used])
    fields = from_arrow_schema(read).fields
    struct = T.StructType([T.StructField(f.name, f.dataType, True) for f in fields])
    return to_arrow_schema(partial_schema(spark, spec, struct), timezone="UTC")


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

    The partial is computed from the table's staged files, not from the transform's
    frame: Kafka is not read a second time (the stage's one job has no cache), and the
    partial is a function of exactly the rows the vote publishes to the raw table, which
    is what the recomputation check compares it with.

    In Arrow, file by file, with no Spark job (jobs/derived/arrow_partials.py says why
    and where Arrow's answer is Spark's); where it might not be, in a Spark job of its
    own reading the files back, as jobs/derived/partials.py defines the partial. Either
    way the partial has Spark's schema, taken from the plan without running it, and is
    written into its output's own attempt folder (fresh per attempt, invariant 4). An
    empty partial still votes its schema: the commit must record the batch in that output
    even when it changes no row (resources/delta/merge.py).
    """
    started = time.perf_counter()
    staged = [
        (storage.join(table_roots[TABLE], f.path), f.path)
        for f in output.files
        if f.target == TABLE
    ]
    # every column nullable, as Spark reads any Parquet file back: an empty batch's
    # partial must have the schema of every other batch's (invariant 14 compares them)
    schema = T.StructType([T.StructField(f.name, f.dataType, True) for f in good.schema.fields])
    names = [c.name for c in partition_by]
    files, schemas = list(output.files), dict(output.schemas)
    read_back_rows: DataFrame | None = None  # for the outputs Spark computes, read once
    kinds = [partial_schema(spark, spec, schema) for spec in derived]
    arrow_kinds = [to_arrow_schema(kind, timezone="UTC") for kind in kinds]
    in_arrow = partials_from_files(
        staged, list(zip(derived, arrow_kinds, strict=True)), schema, names
    )
    for spec, kind, arrow_kind, partial in zip(derived, kinds, arrow_kinds, in_arrow, strict=True):
        target = derived_target(spec.name)
        folder = attempt_dirs[target]
        if partial is None:
            if read_back_rows is None:
                read_back_rows = (
                    read_back(
                        spark.read, [storage.spark_uri(u) for u, _ in staged], schema, partition_by
                    )
                    if staged
                    else spark.createDataFrame([], schema)
                )
            partial_rows = _spark_partial(read_back_rows, spec)
            partial_rows.write.mode("error").parquet(storage.spark_uri(folder))
        else:
            _write_once(partial, folder, kind.json())
        files += parquet_files.describe(folder, table_roots[target], target, arrow_kind.names)
        schemas[target] = encode_schema(arrow_kind)
    seconds = {**output.seconds, "derived": time.perf_counter() - started}
    return dataclasses.replace(output, files=files, schemas=schemas, seconds=seconds)


def _write_once(partial: pa.Table, folder: str, spark_schema_json: str) -> None:
    """Write an Arrow partial into its attempt folder, which nothing may have written yet
    (as Spark's save mode "error" refuses a folder that exists: an attempt's folders are
    its own, invariant 4)."""
    if storage.list_files(folder):
        raise InconsistencyError(
            f"{folder} holds files already: an attempt folder is written once (invariant 4)"
        )
    parquet_files.write_as_spark(partial, folder, spark_schema_json)
