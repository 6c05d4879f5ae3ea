"""The former two-pass stage plan, kept only so the benchmark can compare it with the product's.

It cached the Kafka source, counted it in a Spark job of its own, cached the transformed
frame, then wrote the table and the quarantine: two caches of the whole batch where the
product's single-pass plan (jobs/stage.py) holds one. BENCHMARKS.md shows what that costs.
Everything but the plan (reading, splitting, writing, describing) is the product's own code.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from pyspark.sql import DataFrame, SparkSession

from jobs.spark_stager import SparkStager
from jobs.stage import (
    check_coordinates,
    check_output,
    read_ranges,
    split_outputs,
    staged_output,
    with_coordinates,
    write_outputs,
)
from ledger.batch import Batch
from ledger.protocol import OffsetRange
from ledger.two_phase import StageOutput


def stage_two_pass(
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
) -> StageOutput:
    """jobs/stage.py's `stage`, with the source cached and counted before the transform."""
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    source = with_coordinates(
        read_ranges(spark, bootstrap_servers, ranges, kafka_options), batch_id
    ).persist()
    try:
        records_read = source.count()
        seconds["read"] = time.perf_counter() - started
        out = transform(source)
        check_output(out, transform_name)
        out = out.persist()
        try:
            good, bad = split_outputs(out)
            seconds["write"] = write_outputs(good, bad, attempt_dirs)
        finally:
            out.unpersist()
    finally:
        source.unpersist()
    output = staged_output(
        good,
        bad,
        batch_id=batch_id,
        records_read=records_read,
        attempt_dirs=attempt_dirs,
        table_roots=table_roots,
        seconds=seconds,
    )
    # the product's exactly-once check, from the staged files and counts alone
    check_coordinates(
        spark,
        output,
        bootstrap_servers=bootstrap_servers,
        kafka_options=kafka_options,
        ranges=ranges,
        batch_id=batch_id,
        table_roots=table_roots,
    )
    return output


class TwoPassStager(SparkStager):
    """The product's stager running the two-pass plan."""

    def stage(self, batch: Batch) -> StageOutput:
        return stage_two_pass(self.spark_factory(), **self.job_arguments(batch))
