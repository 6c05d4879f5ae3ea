"""A stage plan that caches the transformed frame, kept only so the benchmark can compare it
with the product's routed plan (jobs/stage/staging.py, jobs/stage/routing.py).

It reads and transforms the batch once, caches the transformed frame, and writes the table
and the quarantine from it in two Spark jobs; the product writes both in one job without a
cache. BENCHMARKS.md shows what the cache and the second job cost. Everything
but the plan (reading, splitting, describing, the exactly-once check) is the product's code.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from jobs.stage import coordinates
from jobs.stage.kafka_read import read_ranges, with_coordinates
from jobs.stage.routing import check_output, split_outputs
from jobs.stage.spark_stager import SparkStager
from jobs.stage.staging import (
    RECORDS_READ,
    check_coordinates,
    observed_fingerprint,
    observed_records,
    staged_output,
)
from ledger.coordinator.crash import crashpoint
from ledger.core.batch import Batch
from ledger.core.errors import ConfigError
from ledger.core.layout import QUARANTINE, TABLE
from ledger.core.ports import StageOutput
from ledger.core.protocol import OffsetRange
from resources.object_storage import storage


def write_outputs(good: DataFrame, bad: DataFrame, attempt_dirs: Mapping[str, str]) -> float:
    """Write the two outputs in two jobs into the attempt's folders; the seconds taken."""
    started = time.perf_counter()
    good.write.mode("error").parquet(storage.spark_uri(attempt_dirs[TABLE]))
    crashpoint("during_stage")
    bad.write.mode("error").parquet(storage.spark_uri(attempt_dirs[QUARANTINE]))
    return time.perf_counter() - started


def stage_cached(
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
    derived: Sequence[Any] = (),
    partition_by: Sequence[Any] = (),
) -> StageOutput:
    """jobs/stage/staging.py's `stage` as it was: the transformed frame cached, two write jobs.
    It predates derived outputs and partitioned tables and stages neither: a pipeline with
    either is refused."""
    if derived:
        raise ConfigError("the cached-plan benchmark stages no derived outputs")
    if partition_by:
        raise ConfigError("the cached-plan benchmark stages no partitioned table")
    seconds: dict[str, float] = {}
    observation = Observation()
    source = with_coordinates(
        read_ranges(spark, bootstrap_servers, ranges, kafka_options), batch_id
    ).observe(observation, F.count(F.lit(1)).alias(RECORDS_READ), coordinates.fingerprint())
    out = transform(source)
    check_output(out, transform_name)
    out = out.withColumn("value", F.when(F.col("_error").isNotNull(), F.col("value"))).persist()
    try:
        good, bad = split_outputs(out)
        written = {TABLE: Observation(), QUARANTINE: Observation()}
        good = good.observe(written[TABLE], coordinates.fingerprint())
        bad = bad.observe(written[QUARANTINE], coordinates.fingerprint())
        seconds["write"] = write_outputs(good, bad, attempt_dirs)
        records_read = observed_records(observation)
        if records_read is None:
            records_read = source.count()
    finally:
        out.unpersist()
    output = staged_output(
        good,
        bad,
        batch_id=batch_id,
        records_read=records_read,
        attempt_dirs=attempt_dirs,
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
        read_fingerprint=observed_fingerprint(observation, wait_s=0.0),
        written=written,
    )
    return output


class CachedStager(SparkStager):
    """The product's stager running the former cached plan."""

    def stage(self, batch: Batch) -> StageOutput:
        return stage_cached(self.spark_factory(), **self.job_arguments(batch))
