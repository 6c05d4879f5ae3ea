"""One whole benchmark run: broker, data set, every contender, every repetition, the summary.

The contenders run interleaved inside each repetition (never all of one, then all of the
other), and the two stage plans swap order from one repetition to the next, so slow drifts
of a shared machine's load land on both sides of every ratio.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import commits, limits, peer, product, spark_profile
from bench.data import produce, split
from bench.report import batch_label, summarize
from jobs.micro_batch import build
from resources.broker import EmbeddedBroker, free_port, java_executable
from resources.kafka import KafkaClient

TOPIC = "bench-pageviews"
BROKER_START_TIMEOUT = 180.0


@dataclass(frozen=True)
class Settings:
    """What one run measures; the defaults are the full benchmark of BENCHMARKS.md."""

    records: int = 2_000_000
    partitions: int = 8
    record_bytes: int = 500
    #: records per batch (max_records_per_partition * partitions); None = all at once
    batch_records: tuple[int | None, ...] = (100_000, 1_000_000, None)
    dagster_batch_records: int | None = 100_000
    repeat: int = 3
    empty_batches: int = 3
    file_counts: tuple[int, ...] = (10, 100, 1000)
    history: int = 1000
    spark_master: str = "local[2]"
    work_dir: Path | None = None
    keep: bool = False
    #: write Spark's event log here and summarise it per contender (changes Spark settings)
    profile_dir: Path | None = None


SMOKE = Settings(
    records=2_000,
    partitions=8,
    record_bytes=500,
    batch_records=(None,),
    dagster_batch_records=None,
    repeat=1,
    empty_batches=1,
    file_counts=(10, 100, 1000),
    history=20,
)


def describe_machine() -> dict[str, Any]:
    """nproc, memory, CPU model, Java and Python: what BENCHMARKS.md must state."""
    cpu_model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gib = 0.0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gib = int(line.split()[1]) / (1 << 20)
    except OSError:
        pass
    java = subprocess.run(
        [java_executable(), "-version"], capture_output=True, text=True, check=False
    ).stderr.splitlines()
    import deltalake
    import pyspark

    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model,
        "memory_gib": memory_gib,
        "java": java[0].strip() if java else "unknown",
        "python": platform.python_version(),
        "platform": platform.platform(),
        "pyspark": pyspark.__version__,
        "deltalake": deltalake.__version__,
    }


def _load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def _per_partition(batch_records: int | None, records: int, partitions: int) -> int:
    """max_records_per_partition for a batch of `batch_records` over `partitions`."""
    if batch_records is None:
        return max(split(records, partitions))
    return -(-batch_records // partitions)


def _warm_up(spark: Any, root: Path, bootstrap: str) -> None:
    """Load the Kafka source, Parquet writer, Delta and delta-spark classes into the JVM and
    let the JIT see them once, so the first measured contender is not charged for it."""
    config = product.pipeline_config(root / "warmup", "warmup", bootstrap, TOPIC, 100)
    build(config, spark_factory=lambda: spark).run_batch()
    spark.range(10).write.format("delta").save(str(root / "warmup" / "delta"))


def run(settings: Settings, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the whole benchmark and return the raw figures with their summary.

    Everything lives in a fresh temporary folder (removed at the end unless `keep`); the
    broker and the Spark session are stopped whatever happens.
    """
    from resources.spark import build_session

    started = time.perf_counter()
    result: dict[str, Any] = {
        "settings": {
            **{k: v for k, v in asdict(settings).items() if k not in ("work_dir", "profile_dir")},
            "batch_records": list(settings.batch_records),
        },
        "machine": describe_machine(),
        "load_before": _load(),
        "command": " ".join(sys.argv),
    }
    root = Path(tempfile.mkdtemp(prefix="exactly-bench-", dir=settings.work_dir))
    log(f"bench: working in {root}")
    broker = EmbeddedBroker(root / "kafka", port=free_port())
    try:
        t = time.perf_counter()
        bootstrap = broker.start(timeout=BROKER_START_TIMEOUT)
        result["broker_start_s"] = time.perf_counter() - t
        with KafkaClient(bootstrap, timeout=60) as client:
            data = produce(
                client,
                TOPIC,
                records=settings.records,
                partitions=settings.partitions,
                record_bytes=settings.record_bytes,
            )
        result["data_set"] = data.as_dict()
        log(
            f"bench: produced {data.records:,} records ({data.value_bytes / 2**20:,.0f} MiB) "
            f"to {settings.partitions} partitions in {data.produce_seconds:.1f} s"
        )
        conf = spark_profile.event_log_conf(settings.profile_dir) if settings.profile_dir else {}
        t = time.perf_counter()
        spark = build_session(settings.spark_master, conf)
        result["spark_session_start_s"] = time.perf_counter() - t
        try:
            _warm_up(spark, root, bootstrap)
            result["repetitions"] = [
                _repetition(spark, root / f"rep-{i + 1}", bootstrap, data.records, settings, i, log)
                for i in range(settings.repeat)
            ]
            log(f"bench: delta-rs history of {settings.history} commits")
            result["history"] = commits.commit_vs_history(root / "history", settings.history)
        finally:
            spark.stop()
    finally:
        broker.stop()
        if not settings.keep:
            shutil.rmtree(root, ignore_errors=True)
    result["load_after"] = _load()
    result["total_seconds"] = time.perf_counter() - started
    if settings.profile_dir:
        result["spark_profile"] = spark_profile.summarize(settings.profile_dir)
    result["summary"] = summarize(result)
    return result


@contextlib.contextmanager
def _described(spark: Any, label: str) -> Iterator[None]:
    """Name the Spark jobs run inside, so the profile can tell the contenders apart."""
    spark.sparkContext.setJobDescription(f"{spark_profile.DESCRIPTION_PREFIX} {label}")
    try:
        yield
    finally:
        spark.sparkContext.setJobDescription(None)


def _repetition(
    spark: Any,
    root: Path,
    bootstrap: str,
    records: int,
    settings: Settings,
    index: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Every contender once. Run folders are removed as soon as their figures are taken."""
    tag = f"[{index + 1}/{settings.repeat}]"
    out: dict[str, Any] = {"product": {"single-pass": {}, "two-pass": {}}, "peer": {}}
    plans = [True, False] if index % 2 == 0 else [False, True]
    parquet_rows = None
    for position, batch_records in enumerate(settings.batch_records):
        label = batch_label(batch_records)
        per_partition = _per_partition(batch_records, records, settings.partitions)
        for single_pass in plans:
            plan = "single-pass" if single_pass else "two-pass"
            name = f"bench_{plan.replace('-', '_')}_{label}"
            config = product.pipeline_config(root / name, name, bootstrap, TOPIC, per_partition)
            with _described(spark, f"exactly {plan} {label}"):
                figures = product.run_cli_path(
                    spark,
                    config,
                    expected_records=records,
                    single_pass=single_pass,
                    empty_batches=settings.empty_batches if position == 0 else 0,
                )
            out["product"][plan][label] = figures
            log(_line(tag, f"exactly {plan} batch={label}", figures))
            if single_pass and parquet_rows is None:
                parquet_rows = limits.table_rows(config.delta.table_uri)
            shutil.rmtree(root / name, ignore_errors=True)
        figures = peer.run_structured_streaming(
            spark,
            root / f"peer-{label}",
            bootstrap=bootstrap,
            topic=TOPIC,
            max_offsets_per_trigger=batch_records,
            expected_records=records,
            name=f"{spark_profile.DESCRIPTION_PREFIX} structured-streaming {label}",
        )
        out["peer"][label] = figures
        log(_line(tag, f"Structured Streaming batch={label}", figures))
        shutil.rmtree(root / f"peer-{label}", ignore_errors=True)

    label = batch_label(settings.dagster_batch_records)
    name = f"bench_dagster_{label}"
    config = product.pipeline_config(
        root / name,
        name,
        bootstrap,
        TOPIC,
        _per_partition(settings.dagster_batch_records, records, settings.partitions),
    )
    with _described(spark, f"exactly dagster {label}"):
        out["dagster"] = product.run_dagster(config, expected_records=records)
    log(_line(tag, f"exactly Dagster batch={label}", out["dagster"]))
    shutil.rmtree(root / name, ignore_errors=True)

    consume = limits.consume_confluent(bootstrap, TOPIC, settings.partitions, records)
    log(_line(tag, "limit: consume (confluent-kafka)", consume))
    java = limits.consume_java(bootstrap, TOPIC, records)
    log(_line(tag, "limit: consume (ConsumerPerformance)", java))
    if parquet_rows is None:
        raise product.BenchError("no single-pass run left its rows for the Parquet limit")
    parquet = limits.parquet_write(parquet_rows, root / "parquet-limit")
    log(_line(tag, "limit: Parquet write (pyarrow)", parquet))
    shutil.rmtree(root / "parquet-limit", ignore_errors=True)
    out["limits"] = {"consume_confluent": consume, "consume_java": java, "parquet": parquet}
    out["commits"] = {
        "files": commits.commit_vs_files(root / "commits", list(settings.file_counts))
    }
    files = ", ".join(
        f"{n}: {v['median_s'] * 1000:.0f} ms" for n, v in out["commits"]["files"].items()
    )
    log(f"{tag} delta-rs commit by files: {files}")
    shutil.rmtree(root, ignore_errors=True)
    return out


def _line(tag: str, what: str, figures: dict[str, Any]) -> str:
    seconds = figures["seconds"]
    return (
        f"{tag} {what}: {figures['records']:,} records in {seconds:.1f} s "
        f"({figures['records'] / seconds:,.0f} records/s)"
    )
