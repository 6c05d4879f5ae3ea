"""`exactly bench --smoke`: every section of the benchmark runs and yields figures.

Speed is never asserted here (the machine is shared; figures are for BENCHMARKS.md): only
that the harness still works end to end and its JSON holds every section, with positive
figures. It runs as a child process because the harness starts and stops its own broker and
Spark session, which must not be the test session's shared ones.

A soak (tests/fixtures/soak.py): `make test` runs every section at the smallest sizes the
bench's flags accept while each section still has something to measure (two points where a
section compares sizes, four batches in the scale section); `make soak` runs `--smoke` as
it is.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.product import PHASES
from tests.fixtures.soak import soak

REPO = Path(__file__).resolve().parent.parent
SMOKE_TIMEOUT_S = 600


@dataclass(frozen=True)
class Sizes:
    """The flags given after `--smoke`, and what the JSON must then hold."""

    flags: tuple[str, ...]
    records: int
    scale_partitions: tuple[int, ...]
    pipelines: int
    files: tuple[int, ...]
    history: int


#: `--smoke` itself (bench/harness.py SMOKE).
FULL = Sizes((), 2_000, (8, 64), 4, (10, 100, 1000), 20)
#: 400 records in batches of 100: still four batches per scale run; two partition counts,
#: two pipelines at once, two file counts: every comparison keeps two sides.
SMALL = Sizes(
    (
        *("--records", "400", "--partitions", "2"),
        *("--scale-partitions", "1,2", "--scale-batch", "100", "--scale-pipelines", "2"),
        *("--files", "1,10", "--history", "10"),
        *("--freshness-rate", "200", "--freshness-seconds", "3"),
    ),
    400,
    (1, 2),
    2,
    (1, 10),
    10,
)
SIZES = soak(SMALL, FULL)


def _numbers(value: Any, path: str = "") -> Iterator[tuple[str, float]]:
    """Every number in a JSON document, with where it is."""
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _numbers(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _numbers(item, f"{path}[{index}]")


def _may_be_zero(where: str) -> bool:
    """The Dagster overhead is a difference of two times, which noise can make negative;
    a per-process CPU split is zero for a process a contender does not use; a process's
    growth during a contender is zero when it fitted in what the process already held."""
    return "overhead" in where or "by_process" in where or "rise_mib" in where


@pytest.mark.integration
@pytest.mark.soak
@pytest.mark.wide  # the benchmark's harness: every pipeline path it times is in `make test`
def test_smoke_run_measures_every_section(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    command = [sys.executable, "-m", "exactly_cli", "bench", "--smoke", *SIZES.flags]
    result = subprocess.run(
        [*command, "--json-out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=SMOKE_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # nothing but the bench's own lines on the terminal: no library's warning
    assert "Warning" not in result.stderr, result.stderr[-3000:]
    for heading in ("Throughput", "Time per phase", "Fixed cost", "Limits", "Ratios", "delta-rs"):
        assert heading in result.stdout
    doc = json.loads(out.read_text())
    summary = doc["summary"]

    systems = {(t["system"], t["plan"], t["batch"]) for t in summary["throughput"]}
    batches = {"all"}
    for batch in batches:
        assert ("exactly", "routed", batch) in systems
        assert ("exactly", "cached", batch) in systems
        assert ("structured-streaming", "delta sink", batch) in systems
        # the same pipeline with its tables on the loopback S3 server, in the same run
        assert ("exactly", "routed on S3", batch) in systems
    assert all(r["s3_over_local_disk"] > 0 for r in summary["ratios"])
    assert "loopback S3 server (s3proxy) over local disk" in result.stdout
    for t in summary["throughput"]:
        assert t["records_per_s"] > 0 and t["mib_per_s"] > 0 and t["batches"] >= 1

    # the driver's peak resident memory per contender: this process and Spark's JVM, apart
    # and summed, in every table where a driver runs (bench/memory.py)
    assert "py+JVM MiB*" in result.stdout and "(JVM grew)" in result.stdout
    assert "upper bound of their combined peak" in result.stdout
    for row in [*summary["throughput"], summary["dagster"], *summary["limits"].values()]:
        peaks = row["peak_mib"]
        assert peaks["python"] > 0 and peaks["jvm"] > 0, row
        assert row["driver_sum_of_peaks_mib"] == pytest.approx(peaks["python"] + peaks["jvm"])
        assert 0 < row["driver_sampled_peak_mib"] <= row["driver_sum_of_peaks_mib"] * 1.001
        assert row["memory_method"], row
        assert row["rise_mib"]["jvm"] > -16, row  # a peak is never below the start, noise aside
    assert summary["limits"]["consume_java"]["peak_mib"]["child"] > 0
    for t in summary["throughput"]:
        if t["system"] == "exactly":
            assert set(t["phases_per_batch_s"]) == {"plan", "stage", "prepare", "commit", "ack"}
    assert summary["dagster"]["records_per_s"] > 0 and summary["dagster"]["batches"] == 1
    assert summary["dagster"]["idle_run_s"] > 0
    assert set(summary["empty_batch"]) == {
        "routed",
        "cached",
        "structured-streaming idle run",
        "dagster idle run",
    }
    assert not doc["failures"] and not summary["failures"]
    assert set(summary["limits"]) == {
        "consume_confluent",
        "consume_java",
        "spark_kafka_read",
        "spark_kafka_read_parse",
        "spark_kafka_read_parse_parquet",
        "parquet",
    }
    assert {r["batch"] for r in summary["ratios"]} == batches
    assert all(v is not None for r in summary["ratios"] for v in r.values())
    assert set(summary["delta_commit"]["files"]) == {str(n) for n in SIZES.files}
    history = summary["delta_commit"]["history"]
    assert history["commits"] == SIZES.history and len(history["windows"]) == 4
    compacted = summary["delta_commit"]["history_compacted"]
    assert compacted["commits"] == SIZES.history and len(compacted["tenth_medians_ms"]) == 10
    assert compacted["compactions"] > 0
    assert "the same history compacted between commits past 2 files" in result.stdout

    # the scale section: the same data at two partition counts (8 and 64 in the full
    # smoke), several pipelines (four) against one
    for heading in ("Scale with partitions", "Scale with pipelines", "at once / one alone"):
        assert heading in result.stdout
    scale = summary["scale"]
    rows = {r["partitions"]: r for r in scale["partitions"]}
    assert set(rows) == set(SIZES.scale_partitions), rows
    for row in rows.values():
        assert row["records"] == SIZES.records and row["batches"] >= 4, row
        assert set(row["phases_per_batch_s"]) == set(PHASES), row
        assert row["fixed_cost_s"] > 0 and set(row["fixed_cost_phases_s"]) == set(PHASES), row
        first = SIZES.scale_partitions[0]
        assert row["vs_first"]["partitions"] == row["partitions"] / first, row
        assert isinstance(row["fixed_cost_within_partitions"], bool), row
    pipelines = scale["pipelines"]
    assert pipelines["alone"]["records"] == pipelines["together"]["records"] == SIZES.records
    assert len(pipelines["together"]["each_records_per_s"]) == SIZES.pipelines
    assert pipelines["together_over_alone"] > 0
    assert isinstance(pipelines["target_met"], bool)

    # every figure of every section is there and positive: a zero or a negative time or
    # rate means a section measured nothing
    sections = (
        "throughput",
        "dagster",
        "empty_batch",
        "limits",
        "ratios",
        "delta_commit",
        "scale",
    )
    for section in sections:
        figures = list(_numbers(summary[section], section))
        assert figures, f"section {section} has no figures"
        bad = [(where, v) for where, v in figures if not v > 0 and not _may_be_zero(where)]
        assert not bad, f"figures that are not positive: {bad}"
    for section in ("repetitions", "history", "data_set", "machine"):
        assert doc[section], section

    # freshness: both contenders committed every record the steady producer sent, and the
    # percentiles are ordered (the smoke load is tiny; only the harness is checked)
    fresh = doc["freshness"]
    assert "Freshness: Kafka timestamp -> Delta commit" in result.stdout
    for contender in ("exactly", "structured_streaming"):
        f = fresh[contender]
        assert f["records"] > 0 and f["commits"] >= 1, f
        assert 0 < f["p50_s"] <= f["p95_s"] <= f["p99_s"] <= f["max_s"], f
        assert f["memory"]["peak_mib"]["python"] > 0 and f["memory"]["peak_mib"]["jvm"] > 0, f
