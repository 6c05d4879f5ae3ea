"""The stage job: read exactly a batch's offset ranges with Spark's Kafka source, apply the
pipeline's transform, and write Parquet into a folder unique to (batch id, attempt); then
prove every record read is staged exactly once and describe the files for the vote.

Nothing is deleted first and nothing becomes visible to readers: the files wait there until
the prepare vote records them and the commit publishes them (docs/protocol.md: STAGED).
Where the folders are is ledger/core/layout.py's; the read is jobs/stage/kafka_read.py's,
the routed write jobs/stage/routing.py's, the derived partials jobs/stage/staged_partials.py's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from jobs.stage import coordinates, parquet_files
from jobs.stage.kafka_read import in_tasks, parallelism_of, read_ranges, with_coordinates
from jobs.stage.partition_columns import with_partition_columns
from jobs.stage.routing import (
    carries_tombstones,
    check_output,
    move_quarantine,
    routed,
    routed_folder,
    split_outputs,
    write_routed,
)
from jobs.stage.staged_partials import stage_partials
from ledger.coordinator.crash import crashpoint
from ledger.core.layout import KEY, QUARANTINE, TABLE, TIMESTAMP, attempt_path
from ledger.core.ports import StageOutput
from ledger.core.protocol import OffsetRange
from resources.config.derived_spec import AnyOutput
from resources.config.partitioning import PartitionColumn
from resources.delta.schema import encode_schema
from resources.object_storage import storage

RECORDS_READ = "records_read"
#: the newest Kafka timestamp read (epoch ms), observed in the same job as the count
NEWEST_RECORD_MS = "newest_record_ms"
#: how long the observed count may lag behind the job that produced it (listener bus)
_OBSERVATION_WAIT_S = 10.0


def attempt_folder(root: str, app_id: str, batch_id: int, attempt: int, token: str) -> str:
    """The attempt's own folder in the output at `root` (ledger/core/layout.py
    `attempt_path`: unique to the attempt, invariant 4)."""
    return storage.join(root, attempt_path(app_id, batch_id, attempt, token))


def staged_output(
    good: DataFrame,
    bad: DataFrame,
    *,
    batch_id: int,
    records_read: int,
    attempt_dirs: Mapping[str, str],
    table_roots: Mapping[str, str],
    seconds: dict[str, float],
) -> StageOutput:
    """Describe what the attempt wrote into `attempt_dirs` (per output, the folder holding
    its files): the vote's input. `check_coordinates` then proves every coordinate read is
    in it exactly once. The vote's schemas are the outputs' own, whatever else the files
    hold (`routed`), and so are the files' statistics."""
    started = time.perf_counter()
    schemas = {
        TABLE: encode_schema(to_arrow_schema(good.schema, timezone="UTC")),
        QUARANTINE: encode_schema(to_arrow_schema(bad.schema, timezone="UTC")),
    }
    files = [
        *parquet_files.describe(
            attempt_dirs[TABLE], table_roots[TABLE], TABLE, columns=good.columns
        ),
        *parquet_files.describe(
            attempt_dirs[QUARANTINE], table_roots[QUARANTINE], QUARANTINE, columns=bad.columns
        ),
    ]
    seconds["describe"] = time.perf_counter() - started
    table_records = sum(f.records for f in files if f.target == TABLE)
    quarantine_records = sum(f.records for f in files if f.target == QUARANTINE)
    return StageOutput(files, schemas, records_read, table_records, quarantine_records, seconds)


def stage(
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
    derived: Sequence[AnyOutput] = (),
    partition_by: Sequence[PartitionColumn] = (),
) -> StageOutput:
    """Write one attempt's output for the table and the quarantine; describe the files.
    Then each derived output's partial, computed from the table's staged files
    (`stage_partials`).

    Every record read ends up in exactly one of the two outputs (invariant 9): the counts
    are checked before the vote.

    The records are read, transformed and written once, in one Spark job and without a
    cache: the rows of both outputs go through one write that routes each row to its
    output's folder (`routed`), the count and fingerprint of the records read and the
    fingerprint of the rows written are observed inside that job, and the quarantined rows
    are then moved to the quarantine's folder (`move_quarantine`). (The former plans, two
    jobs over a cached batch, survive in the benchmark only: bench/, BENCHMARKS.md.)
    """
    seconds: dict[str, float] = {}
    observation = Observation()
    read = read_ranges(spark, bootstrap_servers, ranges, kafka_options)
    source = _observed(
        with_coordinates(in_tasks(read, ranges, parallelism_of(spark)), batch_id), observation
    )
    out = _transformed(source, transform, transform_name)
    out = with_partition_columns(out, partition_by, transform_name)
    tombstones = carries_tombstones(derived)
    good, bad = split_outputs(out, tombstones)
    written = _write(out, bad, tombstones, attempt_dirs, partition_by, seconds)
    records_read = observed_records(observation)
    if records_read is None:
        # the transform's output does not derive from its input (or the metrics did not
        # arrive): count the source in a job of its own rather than trust nothing
        records_read = source.count()
    output = staged_output(
        good,
        bad,
        batch_id=batch_id,
        records_read=records_read,
        attempt_dirs={
            TABLE: routed_folder(attempt_dirs[TABLE], TABLE),
            QUARANTINE: attempt_dirs[QUARANTINE],
        },
        table_roots=table_roots,
        seconds=seconds,
    )
    output = replace(output, newest_record_ms=_newest_record_ms(observation))
    check_coordinates(
        spark,
        output,
        bootstrap_servers=bootstrap_servers,
        kafka_options=kafka_options,
        ranges=ranges,
        batch_id=batch_id,
        table_roots=table_roots,
        # the count above already waited for this observation: do not wait twice
        read_fingerprint=observed_fingerprint(observation, wait_s=0.0),
        written={"both": written},
    )
    if not derived:
        return output
    return stage_partials(
        spark,
        output,
        good,
        derived,
        attempt_dirs=attempt_dirs,
        table_roots=table_roots,
        partition_by=partition_by,
    )


def _transformed(
    source: DataFrame, transform: Callable[[DataFrame], DataFrame], name: str
) -> DataFrame:
    """The transform's output, refused unless it keeps the stage's contract."""
    out = transform(source)
    check_output(out, name)
    return out


def _write(
    out: DataFrame,
    bad: DataFrame,
    tombstones: bool,
    attempt_dirs: Mapping[str, str],
    partition_by: Sequence[PartitionColumn],
    seconds: dict[str, float],
) -> Observation:
    """Write both outputs in one routed write, then move the quarantined rows to the
    quarantine's folder; the observation of the fingerprint of the rows written."""
    written = Observation()
    rows = routed(out, tombstones).observe(written, coordinates.fingerprint())
    seconds["write"] = write_routed(rows, attempt_dirs, [c.name for c in partition_by])
    crashpoint("during_stage")
    seconds["move"] = move_quarantine(bad, attempt_dirs)
    return written


def check_coordinates(
    spark: SparkSession,
    output: StageOutput,
    *,
    bootstrap_servers: str,
    kafka_options: Mapping[str, str],
    ranges: Sequence[OffsetRange],
    batch_id: int,
    table_roots: Mapping[str, str],
    read_fingerprint: int | None = None,
    written: Mapping[str, Observation] | None = None,
) -> None:
    """Invariant 13 before the vote: every coordinate read is staged exactly once.

    Fewer loses records, more duplicates them, and equal counts can still hide one record
    dropped and another doubled: the counts, the read and written fingerprints and the
    staged files' coordinate columns decide together (jobs/stage/coordinates.py). Kafka is read a
    second time only to name an example when a mismatch is already proven.
    """
    started = time.perf_counter()
    parts = [observed_fingerprint(o) for o in (written or {}).values()]
    staged_fingerprint = None if not parts or None in parts else coordinates.combine(*parts)

    def read_again() -> pa.Table:
        source = with_coordinates(
            read_ranges(spark, bootstrap_servers, ranges, kafka_options), batch_id
        )
        return source.select(*KEY).toArrow()

    coordinates.check_exactly_once(
        coordinates.Counts(output.records_read, output.table_records, output.quarantine_records),
        read_fingerprint=read_fingerprint,
        staged_fingerprint=staged_fingerprint,
        # a derived output's partial holds groups, not records: not coordinates to count
        staged_files=[
            storage.join(table_roots[f.target], f.path)
            for f in output.files
            if f.target in (TABLE, QUARANTINE)
        ],
        ranges=ranges,
        read_coordinates=read_again,
    )
    output.seconds["check"] = time.perf_counter() - started


def _observed(source: DataFrame, observation: Observation) -> DataFrame:
    """`source` observed in the job that reads it: the records' count and fingerprint (the
    vote's proof, `check_coordinates`) and the newest Kafka timestamp (the freshness
    check's, orchestration/health/freshness.py), all in the one pass that stages them."""
    return source.observe(
        observation,
        F.count(F.lit(1)).alias(RECORDS_READ),
        coordinates.fingerprint(),
        F.max(F.unix_millis(F.col(TIMESTAMP))).alias(NEWEST_RECORD_MS),
    )


def _newest_record_ms(observation: Observation) -> int | None:
    """The newest Kafka timestamp `_observed` saw (epoch ms), if it was reported."""
    newest = (_observed_metrics(observation, wait_s=0.0) or {}).get(NEWEST_RECORD_MS)
    return None if newest is None else int(newest)


def observed_fingerprint(
    observation: Observation | None, wait_s: float = _OBSERVATION_WAIT_S
) -> int | None:
    """The coordinates' fingerprint observed, 0 for no rows, None if none was reported."""
    metrics = _observed_metrics(observation, wait_s)
    if metrics is None or coordinates.FINGERPRINT not in metrics:
        return None
    return coordinates.combine(metrics[coordinates.FINGERPRINT])


def observed_records(observation: Observation | None) -> int | None:
    """The records counted by `observation`, or None if no finished job reported them."""
    value = (_observed_metrics(observation) or {}).get(RECORDS_READ)
    return None if value is None else int(value)


def _observed_metrics(
    observation: Observation | None, wait_s: float = _OBSERVATION_WAIT_S
) -> dict[str, Any] | None:
    """The metrics `observation` holds, or None if no finished job reported them.

    Never blocks for long: a classic Observation is completed by a listener on Spark's
    asynchronous listener bus, so its future is given a few seconds, not forever (its `get`
    would wait for a job that may never come); a Spark Connect one holds `{}` until reported.
    """
    if observation is None:
        return None
    handle = getattr(observation, "_jo", None)
    if handle is not None:
        deadline = time.monotonic() + wait_s
        while not handle.future().isCompleted():
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)
    return dict(observation.get or {})
