"""Freshness: how long a record takes from its producer to a Delta commit that shows it.

What a user of a micro-batch pipeline feels, and what throughput does not show. A producer
process writes page views at a steady rate (records/s) for a while; a contender reads the
topic as it grows and commits to Delta; afterwards, each record's latency is the commit
timestamp of the Delta version that added its file minus the record's Kafka timestamp
(CreateTime, set by the producer as it sends). Both clocks are this machine's.

The contenders, one after the other on topics of their own, with the same Spark session:
- exactly in continuous mode (jobs/wiring/continuous.py): batch after batch, never closer than
  `min_interval` seconds apart, both tables (table + quarantine) counted;
- Structured Streaming with a processing-time trigger of the same interval, Delta sink.

A contender must commit every produced record exactly once, or its figures are refused.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow.parquet as pq

from bench import peer, product
from bench.data import MALFORMED_EVERY
from bench.memory import driver_meter
from jobs.examples.sample_data import pageviews
from jobs.wiring.continuous import Cadence, run_continuously
from jobs.wiring.pipeline import build
from resources.kafka.client import KafkaClient
from resources.object_storage import storage

#: How long a contender may take after the producer stopped to commit the last record.
CATCH_UP_TIMEOUT_S = 120.0
#: Distinct record values the producer cycles through (generating each one costs CPU the
#: contenders need more).
VALUE_POOL = 20_000


def produce_steadily(
    bootstrap: str, topic: str, *, rate: int, seconds: float, record_bytes: int
) -> dict[str, Any]:
    """Send `rate` records per second for `seconds`, paced every few milliseconds; wait for
    every acknowledgement. Runs in a process of its own (see `main`) so that its CPU and its
    GIL are not the contender's."""
    from confluent_kafka import Producer

    values = list(
        pageviews(
            min(VALUE_POOL, max(rate, 1)), pad_to=record_bytes, malformed_every=MALFORMED_EVERY
        )
    )
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": True}
    )
    failures: list[str] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(str(error))

    sent, started = 0, time.monotonic()
    while (elapsed := time.monotonic() - started) < seconds:
        due = min(int(elapsed * rate), int(seconds * rate))
        while sent < due:
            try:
                producer.produce(topic, values[sent % len(values)], on_delivery=delivered)
                sent += 1
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
        time.sleep(0.005)
    producer.flush(60)
    if failures:
        raise RuntimeError(f"{len(failures)} record(s) not delivered: {failures[0]}")
    return {"records": sent, "seconds": time.monotonic() - started}


@dataclass(frozen=True)
class FreshnessSettings:
    """The steady load and the cadence: `rate` records/s for `seconds`, batches (triggers)
    every `min_interval` seconds at most."""

    rate: int
    seconds: float
    min_interval: float
    partitions: int
    record_bytes: int


class Producing:
    """The producer process of one contender; `done` says how many records it sent."""

    def __init__(self, bootstrap: str, topic: str, settings: FreshnessSettings) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.freshness",
                "--bootstrap",
                bootstrap,
                "--topic",
                topic,
                "--rate",
                str(settings.rate),
                "--seconds",
                str(settings.seconds),
                "--record-bytes",
                str(settings.record_bytes),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )

    def done(self) -> dict[str, Any]:
        out, _ = self.process.communicate(timeout=CATCH_UP_TIMEOUT_S * 2)
        if self.process.returncode != 0:
            raise RuntimeError(f"the steady producer failed (exit {self.process.returncode})")
        return json.loads(out.strip().splitlines()[-1])


def commit_times(table: Path) -> dict[str, float]:
    """Each data file of a local Delta table -> the epoch seconds of the commit that added
    it (the commit's own timestamp, written by delta-rs and delta-spark alike)."""
    added: dict[str, float] = {}
    for entry in sorted((table / "_delta_log").glob("*.json")):
        when: float | None = None
        paths: list[str] = []
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "commitInfo" in action:
                when = action["commitInfo"]["timestamp"] / 1000.0
            elif "add" in action:
                paths.append(unquote(action["add"]["path"]))
        if when is None:
            when = entry.stat().st_mtime
        added.update(dict.fromkeys(paths, when))
    return added


def latencies(tables: list[Path]) -> np.ndarray:
    """Seconds from each record's Kafka timestamp to the commit that made it readable."""
    found: list[np.ndarray] = []
    for table in tables:
        if not (table / "_delta_log").is_dir():
            continue
        for path, committed in commit_times(table).items():
            column = pq.read_table(table / path, columns=["_kafka_timestamp"]).column(0)
            produced = column.cast("timestamp[us]").cast("int64").to_numpy() / 1e6
            found.append(committed - produced)
    return np.concatenate(found) if found else np.array([])


def _figures(lat: np.ndarray, produced: dict[str, Any], commits: int) -> dict[str, Any]:
    p50, p95, p99 = (float(np.percentile(lat, q)) for q in (50, 95, 99))
    return {
        "records": int(lat.size),
        "produced_per_s": produced["records"] / produced["seconds"],
        "commits": commits,
        "p50_s": p50,
        "p95_s": p95,
        "p99_s": p99,
        "max_s": float(lat.max()),
        "batch_phases_median_s": produced.get("phases_s", {}),
    }


def _exactly(spark: Any, root: Path, bootstrap: str, topic: str, s: FreshnessSettings) -> Any:
    config = product.pipeline_config(root, "freshness", bootstrap, topic, 10_000_000)
    tpc = build(config, spark_factory=lambda: spark)
    stop = threading.Event()
    committed = {"records": 0, "batches": 0}
    phases: list[dict[str, float]] = []
    produced: dict[str, Any] = {}
    producing = Producing(bootstrap, topic, s)

    def on_batch(report: Any) -> None:
        committed["records"] += report.output.records_read
        committed["batches"] += 1
        phases.append({**report.seconds, **report.output.seconds})
        if "records" in produced and committed["records"] >= produced["records"]:
            stop.set()

    def watch() -> None:
        """Stop the loop once the producer is done and (on_batch) all it sent committed, or
        when the catch-up takes too long (the record count check then fails the run)."""
        try:
            produced.update(producing.done())
            if committed["records"] < produced["records"]:
                stop.wait(CATCH_UP_TIMEOUT_S)
        finally:
            stop.set()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    run_continuously(tpc.run_batch, Cadence(s.min_interval), stop, on_batch)
    watcher.join()
    if "records" not in produced:
        raise RuntimeError("the steady producer failed")
    tables = [Path(config.delta.table_uri), Path(config.delta.quarantine_uri)]
    produced["phases_s"] = (
        {k: float(np.median([p.get(k, 0.0) for p in phases])) for k in phases[0]} if phases else {}
    )
    return produced, tables, committed["batches"]


def _structured_streaming(
    spark: Any, root: Path, bootstrap: str, topic: str, s: FreshnessSettings
) -> Any:
    table, checkpoint = root / "table", root / "checkpoint"
    frame = peer.streaming_frame(spark, bootstrap=bootstrap, topic=topic, max_offsets=None)
    producing = Producing(bootstrap, topic, s)
    query = (
        frame.writeStream.queryName("freshness-structured-streaming")
        .format("delta")
        .outputMode("append")
        .option("checkpointLocation", storage.spark_uri(str(checkpoint)))
        .trigger(processingTime=f"{max(s.min_interval, 0.001)} seconds")
        .start(storage.spark_uri(str(table)))
    )
    try:
        produced = producing.done()
        deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
        while _records_in(table) < produced["records"] and time.monotonic() < deadline:
            if query.exception() is not None:
                raise RuntimeError(f"the Structured Streaming query failed: {query.exception()}")
            time.sleep(0.2)
    finally:
        query.stop()
    commits = len(list((table / "_delta_log").glob("*.json")))
    return produced, [table], commits


def _records_in(table: Path) -> int:
    return peer.table_records(table) if (table / "_delta_log").is_dir() else 0


def compare(spark: Any, root: Path, bootstrap: str, s: FreshnessSettings) -> dict[str, Any]:
    """Each contender under the same steady load, one after the other; their latencies, and
    the driver's peak resident memory while it ran (not the producer's: it is the load)."""
    results: dict[str, Any] = {"rate": s.rate, "seconds": s.seconds, "interval": s.min_interval}
    contenders = {"exactly": _exactly, "structured_streaming": _structured_streaming}
    with KafkaClient(bootstrap, timeout=60) as client:
        for name, contender in contenders.items():
            topic = f"{root.name}-{name.replace('_', '-')}"
            client.create_topic(topic, s.partitions)
            try:
                with driver_meter(spark) as memory:
                    produced, tables, commits = contender(spark, root / name, bootstrap, topic, s)
                lat = latencies(tables)
                if lat.size != produced["records"]:
                    raise RuntimeError(
                        f"{lat.size} records committed, not the {produced['records']} produced"
                    )
                results[name] = _figures(lat, produced, commits)
                results[name]["memory"] = memory.result()
            except Exception as exc:  # recorded, and the run goes on (harness.py)
                results[name] = {"failed": f"{type(exc).__name__}: {exc}"}
    return results


def render(figures: dict[str, Any] | None) -> list[str]:
    """The freshness table of the report (nothing if the section did not run)."""
    if not figures:
        return []
    out = [
        "",
        f"Freshness: Kafka timestamp -> Delta commit, {figures['rate']:,} records/s for "
        f"{figures['seconds']:.0f} s, batches (triggers) every {figures['interval']:g} s at most",
    ]
    rows = []
    for name, label in (("exactly", "exactly --continuous"), ("structured_streaming", "SSS")):
        f = figures.get(name, {})
        if "failed" in f:
            rows.append([label, f"FAILED: {f['failed']}"])
            continue
        peaks = f.get("memory", {}).get("peak_mib", {})
        rows.append(
            [
                label,
                f"{f['produced_per_s']:,.0f}",
                str(f["commits"]),
                *(f"{f[k]:.2f}" for k in ("p50_s", "p95_s", "p99_s", "max_s")),
                *(_mib(peaks.get(k)) for k in ("python", "jvm")),
                _grew(f.get("memory", {})),
                _mib(f.get("memory", {}).get("driver_sum_of_peaks_mib")),
            ]
        )
    phases = figures.get("exactly", {}).get("batch_phases_median_s")
    if phases:
        shown = " ".join(f"{k}={v:.2f}" for k, v in phases.items())
        out.append(f"exactly's median batch, seconds: {shown}")
    header = ["system", "produced/s", "commits", "p50 s", "p95 s", "p99 s", "max s"]
    header += ["py MiB", "JVM MiB", "(JVM grew)", "py+JVM MiB*"]
    widths = [
        max(len(str(r[i])) for r in [header, *rows] if i < len(r)) for i in range(len(header))
    ]
    for row in [header, *rows]:
        out.append("  ".join(str(c).ljust(widths[i]) for i, c in enumerate(row)).rstrip())
    out.append(
        "* peak resident memory of the driver (this Python process, Spark's JVM) while each "
        "contender ran; py+JVM is the sum of the two peaks, an upper bound of their combined peak"
    )
    return out


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _grew(memory: dict[str, Any]) -> str:
    """The JVM's peak minus its size at the start (see bench/report.py)."""
    peak = memory.get("peak_mib", {}).get("jvm")
    start = memory.get("start_mib", {}).get("jvm")
    return "-" if peak is None or start is None else f"+{max(peak - start, 0.0):,.0f}"


def main() -> None:
    """The producer process: `python -m bench.freshness --bootstrap ... --topic ...`."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--rate", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--record-bytes", type=int, required=True)
    args = parser.parse_args()
    sent = produce_steadily(
        args.bootstrap,
        args.topic,
        rate=args.rate,
        seconds=args.seconds,
        record_bytes=args.record_bytes,
    )
    print(json.dumps(sent), flush=True)


if __name__ == "__main__":
    main()
