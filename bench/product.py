"""This product, end to end: Kafka to committed Delta, through the CLI path and through Dagster.

Every run gets its own pipeline name, tables, ledger and consumer group, and reads the shared
topic from its first offset, so runs never see each other's state. The Spark session is the
harness's (created once, as `exactly run` creates one per process): its start is measured
once, apart, instead of being charged to whichever run happens to come first.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from bench.cached_plan import CachedStager
from jobs.wiring.pipeline import build
from ledger.coordinator.reports import BatchReport
from ledger.core.errors import ExactlyError
from resources.config.loading import load_config
from resources.config.pipeline_config import PipelineConfig

#: The phases of one batch, as BatchReport.seconds names them.
PHASES = ("plan", "stage", "prepare", "commit", "ack")


class BenchError(ExactlyError):
    """A contender produced a wrong result: its figures would mean nothing."""


def config_file(root: Path) -> Path:
    """Where `pipeline_config` writes the config of the pipeline under `root`."""
    return root / "pipeline.yaml"


def pipeline_config(
    root: Path,
    name: str,
    bootstrap: str,
    topic: str,
    max_records_per_partition: int,
    tables: str | None = None,
    spark: dict[str, Any] | None = None,
) -> PipelineConfig:
    """A pipeline of its own under `root` on the shared topic, with the product's defaults;
    its tables under `tables` (an `s3://` URI) when given, else under `root`; `spark`, when
    given, is the config's `spark` section as written (e.g. `{"master": ..., "server": ...}`).

    Written to `config_file(root)` and read back, as a user's config is (the Dagster code
    location reads pipelines from their files). Spark settings are left at the defaults on
    purpose: the peer runs with the very same.
    """
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    where = tables or str(root)
    doc = {
        "pipeline": name,
        "kafka": {"bootstrap_servers": bootstrap, "topic": topic},
        "delta": {"table_uri": f"{where}/table", "quarantine_uri": f"{where}/quarantine"},
        "ledger": {"url": f"sqlite:///{root / 'ledger.db'}"},
        "batch": {"max_records_per_partition": max_records_per_partition},
    }
    if spark is not None:
        doc["spark"] = dict(spark)
    path = config_file(root)
    path.write_text(yaml.safe_dump(doc))
    return load_config(path)


def _batch_figures(report: BatchReport) -> dict[str, Any]:
    return {
        "batch_id": report.batch.batch_id,
        "records": report.output.records_read,
        "files": len(report.output.files),
        "seconds": sum(report.seconds.values()),
        "phases": {p: report.seconds.get(p, 0.0) for p in PHASES},
        "stage_detail": dict(report.output.seconds),
    }


def _check(name: str, records: int, table: int, quarantine: int, expected: int) -> None:
    if records != expected or table + quarantine != expected:
        raise BenchError(
            f"{name}: read {records} records and staged {table} + {quarantine} quarantined, "
            f"but the topic holds {expected}"
        )


def run_cli_path(
    spark: Any,
    config: PipelineConfig,
    *,
    expected_records: int,
    routed: bool = True,
    empty_batches: int = 0,
    ready: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """`exactly run --until-caught-up` in this process: recover, then batches until caught up.

    Then `empty_batches` batches with nothing new (`run_batch(allow_empty=True)`): the fixed
    cost every batch pays whatever its size. `ready` is called once the pipeline is built,
    just before the clock starts: pipelines run side by side in threads (bench/scale.py)
    wait there for each other, so none of them is charged for the others' set-up.
    """
    tpc = build(config, spark_factory=lambda: spark)
    if not routed:
        # the former stage plan, for the before/after comparison (bench/cached_plan.py)
        tpc.stager = CachedStager(config, lambda: spark)
    if ready is not None:
        ready()
    reports: list[BatchReport] = []
    started = time.perf_counter()
    tpc.recover_and_commit()
    while (report := tpc.run_batch()) is not None:
        reports.append(report)
    seconds = time.perf_counter() - started
    batches = [_batch_figures(r) for r in reports]
    _check(
        config.pipeline,
        sum(r.output.records_read for r in reports),
        sum(r.output.table_records for r in reports),
        sum(r.output.quarantine_records for r in reports),
        expected_records,
    )
    empty = []
    for _ in range(empty_batches):
        report = tpc.run_batch(allow_empty=True)
        if report is None or report.output.records_read:
            raise BenchError(f"{config.pipeline}: an empty batch read {report and report.output}")
        empty.append(_batch_figures(report))
    return {
        "records": expected_records,
        "seconds": seconds,
        "batches": batches,
        "empty_batches": empty,
    }


#: Dagster's console logger prints every step event at DEBUG; the report is what we print.
QUIET_RUN_CONFIG = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def run_dagster(root: Path, *, expected_records: int, idle_runs: int = 1) -> dict[str, Any]:
    """The Dagster micro-batch job of the pipeline under `root`, one in-process run per batch,
    until caught up.

    Each run is launched the way the schedule launches it: a new dynamic partition named
    after the next batch id, then the run for that partition, on one long-lived instance.
    The run that finds nothing to plan ends the loop; `idle_runs` more such runs measure the
    fixed cost of a run that does nothing. The runs share the process's Pipeline (as a code
    server's runs would), whose Spark session is the harness's (one per process), so no new
    JVM starts.
    """
    import dagster as dg

    from orchestration.pipeline_definitions import pipeline_definitions

    jobs = pipeline_definitions(config_file(root))
    config = jobs.config
    commit_step = f"{config.pipeline}_commit"
    runs: list[dict[str, Any]] = []
    idle: list[float] = []
    records = table = quarantine = 0
    # the Pipeline is closed before the harness removes the pipeline's files
    with dg.DagsterInstance.ephemeral() as instance, contextlib.closing(jobs.resource):

        def launch(batch_id: int) -> tuple[float, Any]:
            instance.add_dynamic_partitions(jobs.batches.name, [str(batch_id)])
            t = time.perf_counter()
            result = jobs.micro_batch.execute_in_process(
                run_config=QUIET_RUN_CONFIG,
                instance=instance,
                partition_key=str(batch_id),
                raise_on_error=True,
            )
            return time.perf_counter() - t, result

        started = time.perf_counter()
        batch_id = 1
        while True:
            seconds, result = launch(batch_id)
            done = {e.step_key for e in result.all_events if e.event_type_value == "STEP_SUCCESS"}
            if commit_step not in done:
                idle.append(seconds)
                break
            batch = result.output_for_node(commit_step)
            records += batch.metrics.get("records_read", 0)
            table += batch.metrics.get("table_records", 0)
            quarantine += batch.metrics.get("quarantine_records", 0)
            runs.append(
                {
                    "batch_id": batch.batch_id,
                    "records": batch.metrics.get("records_read", 0),
                    "seconds": seconds,
                    "steps": _step_seconds(result, config.pipeline),
                }
            )
            batch_id += 1
        total = time.perf_counter() - started - idle[0]
        for extra in range(idle_runs - 1):
            idle.append(launch(batch_id + 1 + extra)[0])
    _check(f"{config.pipeline} (Dagster)", records, table, quarantine, expected_records)
    return {"records": records, "seconds": total, "runs": runs, "idle_runs": idle}


def _step_seconds(result: Any, pipeline: str) -> dict[str, float]:
    """Wall time of each op in a run, from its STEP_SUCCESS event."""
    found: dict[str, float] = {}
    for event in result.all_events:
        if event.event_type_value == "STEP_SUCCESS" and event.step_key:
            data = event.event_specific_data
            name = event.step_key.removeprefix(f"{pipeline}_")
            found[name] = float(getattr(data, "duration_ms", 0.0) or 0.0) / 1000.0
    return found
