"""The machine's limits for this work: how fast the topic can be read, and Parquet written.

Neither includes JSON parsing or a Delta commit, so the product can only approach them:
they say how much of the time is the unavoidable part.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import Consumer, KafkaError, TopicPartition
from deltalake import DeltaTable

from bench.memory import SAMPLE_INTERVAL_S, PeakMemory, status_kib
from bench.product import BenchError
from resources.jvm.jars import kafka_classpath
from resources.jvm.process import java_executable

PERF_TOOL = "org.apache.kafka.tools.ConsumerPerformance"


def consume_confluent(bootstrap: str, topic: str, partitions: int, records: int) -> dict[str, Any]:
    """Read every record of the topic with one librdkafka consumer, doing nothing with them.

    The Python loop touches each message once (its value's length), which is the least any
    Python consumer can do.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-consume-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )
    count = value_bytes = 0
    remaining = set(range(partitions))
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        started = time.perf_counter()
        deadline = time.monotonic() + 600
        while remaining and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=10_000, timeout=1.0):
                error = message.error()
                if error is None:
                    count += 1
                    value_bytes += len(message.value() or b"")
                elif error.code() == KafkaError._PARTITION_EOF:
                    remaining.discard(message.partition())
                else:
                    raise BenchError(f"consuming {topic}: {error.str()}")
        seconds = time.perf_counter() - started
    finally:
        consumer.close()
    if count != records:
        raise BenchError(f"the consumer read {count} records of {topic}, not {records}")
    return {"records": count, "bytes": value_bytes, "seconds": seconds}


def _run_measured(
    command: list[str], timeout: float
) -> tuple[subprocess.CompletedProcess[str], float, int | None]:
    """Run `command` and return its output with the CPU seconds that process itself used
    and its peak resident memory in KiB (the whole life of that process is the limit's run).

    Read from the child's own rusage (wait4), not from RUSAGE_CHILDREN: the latter also
    takes in any other child reaped meanwhile, such as a Spark JVM that died of
    OutOfMemoryError earlier, and once charged hundreds of its CPU seconds to this tool.
    The peak is not rusage's ru_maxrss, which exec carries over from the process it
    replaced: Python starts the child by vfork, so that is this (large) process's peak.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        watchdog = threading.Timer(timeout, process.kill)
        watchdog.start()
        peak = _ChildPeak(process.pid, command[0])
        try:
            _pid, status, usage = os.wait4(process.pid, 0)
        finally:
            watchdog.cancel()
            peak.stop()
        process.returncode = os.waitstatus_to_exitcode(status)  # reaped: Popen must not wait
        out.seek(0)
        err.seek(0)
        result = subprocess.CompletedProcess(
            command, process.returncode, out.read().decode(), err.read().decode()
        )
    return result, usage.ru_utime + usage.ru_stime, peak.kib


class _ChildPeak:
    """The largest VmHWM of a child seen while it runs (its own, after the exec of
    `executable`: before that it shares this process's memory), read every 50 ms."""

    def __init__(self, pid: int, executable: str) -> None:
        self.pid = pid
        self.executable = os.path.realpath(executable)
        self.kib: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="child-peak", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            try:
                if os.path.realpath(f"/proc/{self.pid}/exe") != self.executable:
                    continue  # not yet exec'd (or gone)
            except OSError:
                continue
            hwm = status_kib(self.pid, "VmHWM")
            if hwm is not None:
                self.kib = max(self.kib or 0, hwm)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def consume_java(bootstrap: str, topic: str, records: int) -> dict[str, Any]:
    """Kafka's own ConsumerPerformance tool, from the broker's jars, in a JVM of its own.

    Its `fetch` figures exclude the consumer group's join, and the JVM's start is outside
    both: this is the rate the Java client (the one Spark uses) can read the topic at.
    """
    command = [
        java_executable(),
        "-Xmx512m",
        "-cp",
        kafka_classpath(),
        PERF_TOOL,
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--messages",
        str(records),
        "--timeout",
        "120000",
    ]
    started = time.perf_counter()
    result, cpu_s, peak_kib = _run_measured(command, timeout=600)
    wall = time.perf_counter() - started
    lines = [line for line in result.stdout.splitlines() if line.count(",") >= 9]
    if result.returncode != 0 or len(lines) < 2:
        tail = " | ".join((result.stdout + result.stderr).strip().splitlines()[-3:])
        raise BenchError(f"{PERF_TOOL} failed (exit {result.returncode}): {tail}")
    header = [h.strip() for h in lines[0].split(",")]
    row = dict(zip(header, (v.strip() for v in lines[-1].split(",")), strict=True))
    consumed = int(float(row["data.consumed.in.nMsg"]))
    if consumed != records:
        raise BenchError(f"{PERF_TOOL} read {consumed} records of {topic}, not {records}")
    fetch_ms = float(row["fetch.time.ms"])
    return {
        "records": consumed,
        "seconds": fetch_ms / 1000.0,
        "with_group_join_seconds": fetch_ms / 1000.0 + float(row["rebalance.time.ms"]) / 1000.0,
        "jvm_wall_seconds": wall,
        "child_cpu_s": cpu_s,
        "child_peak_kib": peak_kib,
        "tool": dict(row),
    }


def table_rows(table_uri: str) -> pa.Table:
    """The rows a product run committed to its data table: the input of the Parquet limit."""
    return DeltaTable(table_uri).to_pyarrow_table()


def parquet_write(rows: pa.Table, folder: Path, threads: int | None = None) -> dict[str, Any]:
    """Write `rows` as snappy Parquet (Spark's codec here), one slice per core, in parallel.

    pyarrow releases the GIL while encoding, so the threads use every core as Spark's tasks
    do; the folder is on the same disk as the tables.
    """
    threads = threads or os.cpu_count() or 1
    folder.mkdir(parents=True, exist_ok=True)
    step = -(-rows.num_rows // threads)
    slices = [rows.slice(i * step, step) for i in range(threads)]

    def write(index: int) -> int:
        path = folder / f"part-{index:05d}.parquet"
        pq.write_table(slices[index], path, compression="snappy")
        return path.stat().st_size

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        written = sum(pool.map(write, range(threads)))
    seconds = time.perf_counter() - started
    return {
        "records": rows.num_rows,
        "seconds": seconds,
        "threads": threads,
        "arrow_bytes": rows.nbytes,
        "parquet_bytes": written,
    }


def spark_floors(
    spark: Any,
    bootstrap: str,
    topic: str,
    partitions: int,
    records: int,
    folder: Path,
    meter: Callable[[], dict[str, float]] | None = None,
    memory: Callable[[], PeakMemory] | None = None,
) -> dict[str, dict[str, Any]]:
    """What Spark itself costs for this data, in the session every contender uses.

    Three single-job passes over the whole topic, each adding one step: read it through the
    Kafka source and discard it (`noop` sink); read and apply the transform; read, transform
    and write the table's rows as Parquet (one output). The product's stage does the last,
    plus the quarantine's rows routed to a folder of their own in the same write and then
    moved, and the exactly-once observations.
    `meter` (CPU seconds per process so far) gives each pass its CPU seconds, and `memory`
    (a new meter of peak resident memory) the driver's peak while it ran.
    """
    from jobs.examples.pageviews import transform
    from jobs.stage.kafka_read import read_ranges, with_coordinates
    from ledger.core.protocol import OffsetRange
    from resources.object_storage import storage

    ranges = [
        OffsetRange(topic, p, 0, n) for p, n in enumerate(_ends(bootstrap, topic, partitions))
    ]

    def source() -> Any:
        return with_coordinates(read_ranges(spark, bootstrap, ranges), 0)

    def parsed() -> Any:
        return transform(source())

    passes = {
        "kafka_read": lambda: source().write.format("noop").mode("overwrite").save(),
        "kafka_read_parse": lambda: parsed().write.format("noop").mode("overwrite").save(),
        "kafka_read_parse_parquet": lambda: (
            parsed().drop("value", "_error").write.parquet(storage.spark_uri(str(folder / "floor")))
        ),
    }
    found: dict[str, dict[str, Any]] = {}
    for name, action in passes.items():
        before = meter() if meter else {}
        peak = memory() if memory else contextlib.nullcontext()
        with peak:
            started = time.perf_counter()
            action()
            seconds = time.perf_counter() - started
        found[name] = {"records": records, "seconds": seconds}
        if isinstance(peak, PeakMemory):
            found[name]["memory"] = peak.result()
        if meter:
            after = meter()
            found[name]["cpu_s"] = {k: max(0.0, after[k] - before[k]) for k in after}
    return found


def _ends(bootstrap: str, topic: str, partitions: int) -> list[int]:
    """Each partition's last stable offset (the topic is written once, before any pass)."""
    from resources.kafka.client import KafkaClient

    with KafkaClient(bootstrap, timeout=60) as client:
        offsets = client.offsets(topic, range(partitions))
    return [offsets[p].last_stable for p in range(partitions)]
