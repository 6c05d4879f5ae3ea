"""One whole benchmark run: broker, data set, every contender, every repetition, the summary.

The contenders run interleaved inside each repetition (never all of one, then all of the
other), and their order turns by one place from one repetition to the next
(`contender_order`), so slow drifts of a shared machine's load, and what one contender
leaves the next, land on every side of every ratio.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import (
    commit_history,
    commits,
    derived_cost,
    freshness,
    limits,
    peer,
    product,
    scale,
    spark_profile,
)
from bench.data import produce, split
from bench.freshness import FreshnessSettings
from bench.memory import PeakMemory, driver_meter, spark_jvm_pid
from bench.report import S3_PLAN, batch_label, summarize
from bench.scale import ScaleSettings
from jobs.wiring.pipeline import build
from resources.jvm.process import free_port, java_executable
from resources.kafka.client import KafkaClient
from resources.kafka.embedded_broker import EmbeddedBroker
from resources.object_storage.embedded_s3 import S3Server, start_s3_server

TOPIC = "bench-pageviews"
#: The loopback S3 server's bucket, which the S3 contender's tables are in.
BUCKET = "bench"
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
    #: the freshness section's steady load (records/s for seconds) and batch interval
    freshness_rate: int = 20_000
    freshness_seconds: float = 180.0
    freshness_interval: float = 1.0
    #: the scale section (bench/scale.py): partition counts of the same data, records per
    #: batch there, and pipelines run at once; `records` and `record_bytes` are shared
    scale_partitions: tuple[int, ...] = (8, 64, 256)
    scale_batch_records: int = 100_000
    scale_pipelines: int = 4
    #: Structured Streaming and the former stage beside each count (bench/scale.py)
    scale_beside: bool = True
    #: rounds of the derived outputs' cost (bench/derived_cost.py); 0: not measured
    derived_rounds: int = 3

    def scale(self) -> ScaleSettings:
        return ScaleSettings(
            records=self.records,
            record_bytes=self.record_bytes,
            partition_counts=self.scale_partitions,
            batch_records=self.scale_batch_records,
            empty_batches=self.empty_batches,
            pipelines=self.scale_pipelines,
            beside=self.scale_beside,
        )

    def freshness(self) -> FreshnessSettings:
        return FreshnessSettings(
            rate=self.freshness_rate,
            seconds=self.freshness_seconds,
            min_interval=self.freshness_interval,
            partitions=self.partitions,
            record_bytes=self.record_bytes,
        )


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
    freshness_rate=1_000,
    freshness_seconds=5.0,
    # 256 partitions would double the section's time in CI; 8 against 64 already shows
    # whether a per-partition cost is there
    scale_partitions=(8, 64),
    scale_batch_records=500,
    # Structured Streaming is measured in the smoke's throughput section already
    scale_beside=False,
    # three pipelines over the data set, each round: tests/test_bench_derived_cost.py
    # checks its arithmetic instead
    derived_rounds=0,
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


#: Records the warm-up reads: enough for the JIT to compile the hot paths of the Kafka
#: source, the JSON parser, the cache and the Parquet and Delta writers (a JVM that has
#: only seen a few hundred records runs its first large contender up to twice as slow).
WARM_UP_RECORDS = 200_000


def warm_up(
    spark: Any, root: Path, bootstrap: str, records: int, partitions: int, topic: str = TOPIC
) -> float:
    """Run the product's stage and a delta-spark write over the first records of the topic,
    in a throwaway pipeline; return how long it took.

    Run after every new session, so no contender is charged for a cold JVM: the first
    one measured, or the one that follows a session another contender killed.
    """
    from pyspark.sql import functions as F

    from jobs.examples.pageviews import transform
    from jobs.stage.kafka_read import read_ranges, with_coordinates
    from ledger.core.protocol import OffsetRange

    started = time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix="warm-up-", dir=root))
    try:
        count = min(records, WARM_UP_RECORDS)
        per_partition = _per_partition(count, records, partitions)
        config = product.pipeline_config(folder, "warm_up", bootstrap, topic, per_partition)
        build(config, spark_factory=lambda: spark).run_batch()
        ranges = [
            OffsetRange(topic, p, 0, min(n, per_partition))
            for p, n in enumerate(split(records, partitions))
        ]
        frame = transform(with_coordinates(read_ranges(spark, bootstrap, ranges), 0))
        frame = frame.withColumn("_raw_value", F.col("value")).drop("value")
        frame.write.format("delta").save(str(folder / "delta"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return time.perf_counter() - started


def _process_cpu(pid: int | None) -> float:
    """utime + stime of a live process, in seconds (0 if it is gone)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class SparkHolder:
    """The harness's Spark session, replaced if a contender kills its JVM.

    A contender that runs out of heap in local mode takes the whole driver JVM down with it
    (Spark exits on an uncaught OutOfMemoryError). That is a result to report, not a reason
    to lose the rest of the run: the next contender gets a fresh session.
    """

    def __init__(
        self,
        master: str,
        conf: dict[str, str],
        warm_up: Callable[[Any], float],
        object_store: Any = None,
    ) -> None:
        from resources.spark.session import build_session

        self.master = master
        self.conf = conf
        self.build = functools.partial(build_session, object_store=object_store)
        self.warm_up = warm_up
        self.broker_pid: int | None = None
        started = time.perf_counter()
        self.session = self.build(master, conf)
        self.start_seconds = time.perf_counter() - started
        self.jvm_pid = self._jvm_pid()
        self.warm_up_seconds = [warm_up(self.session)]
        self.restarts = 0

    def _jvm_pid(self) -> int | None:
        return spark_jvm_pid(self.session)

    def memory(self) -> PeakMemory:
        """A meter of the driver's peak resident memory (and the broker's, apart) for one
        contender: this process and the current JVM, which a restart replaces; garbage is
        collected first, so the contender does not start with the last one's heap."""
        return driver_meter(self.session, broker=self.broker_pid)

    def cpu(self) -> dict[str, float]:
        """CPU seconds used so far by Spark's JVM, the broker and this process: less
        sensitive to other processes' load than wall time, since it counts only work done.
        A contender that runs a child of its own reports that child's CPU itself."""
        own = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "spark": _process_cpu(self.jvm_pid),
            "broker": _process_cpu(self.broker_pid),
            "python": own.ru_utime + own.ru_stime,
        }

    def alive(self) -> bool:
        try:
            return not self.session.sparkContext._jsc.sc().isStopped()
        except Exception:
            return False

    def restart(self) -> float:
        """Forget the dead JVM's gateway, start a new session and warm it up; returns how
        long the start took (the warm-up is recorded apart)."""
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        with contextlib.suppress(Exception):
            self.session.stop()
        SparkContext._gateway = None
        SparkContext._jvm = None
        SparkContext._active_spark_context = None
        SparkSession._instantiatedSession = None
        SparkSession._activeSession = None
        started = time.perf_counter()
        self.session = self.build(self.master, self.conf)
        seconds = time.perf_counter() - started
        self.jvm_pid = self._jvm_pid()
        self.warm_up_seconds.append(self.warm_up(self.session))
        self.restarts += 1
        return seconds

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.session.stop()


def run(settings: Settings, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the whole benchmark and return the raw figures with their summary.

    Everything lives in a fresh temporary folder (removed at the end unless `keep`); the
    broker and the Spark session are stopped whatever happens. A contender that fails is
    recorded as failed (with why) and the run goes on.
    """
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
        # the broker's 1 GB of fresh segments would otherwise be written back to disk while
        # the first contender reads them, and charged to it
        os.sync()
        result["data_set"] = data.as_dict()
        log(
            f"bench: produced {data.records:,} records ({data.value_bytes / 2**20:,.0f} MiB) "
            f"to {settings.partitions} partitions in {data.produce_seconds:.1f} s"
        )
        conf = spark_profile.event_log_conf(settings.profile_dir) if settings.profile_dir else {}
        with _s3_server(root / "s3") as s3:
            # one session for every contender, with s3a loaded for the S3 one
            spark = SparkHolder(
                settings.spark_master,
                conf,
                functools.partial(
                    warm_up,
                    root=root,
                    bootstrap=bootstrap,
                    records=data.records,
                    partitions=settings.partitions,
                ),
                object_store=s3.access(),
            )
            spark.broker_pid = broker.status().pid
            result["spark_session_start_s"] = spark.start_seconds
            try:
                result["repetitions"] = [
                    _repetition(
                        spark, root / f"rep-{i + 1}", bootstrap, data.records, settings, i, log
                    )
                    for i in range(settings.repeat)
                ]
                result["scale"] = _scale(spark, root / "scale", bootstrap, settings, log)
                if settings.derived_rounds:
                    result["derived"] = derived_cost.compare(
                        spark.session, root / "derived", bootstrap, TOPIC, data.records,
                        settings.derived_rounds, log,
                    )  # fmt: skip
                log(f"bench: delta-rs history of {settings.history} commits")
                result["history"] = commits.commit_vs_history(root / "history", settings.history)
                # the same history as a continuous run with `compact.when_files_over` keeps it
                result["history_compacted"] = commit_history.run(
                    root / "history-compacted",
                    settings.history,
                    profile=False,
                    compact_over=commit_history.compact_limit(settings.history),
                )
                result["freshness"] = _freshness(spark.session, root, bootstrap, settings, log)
                result["spark_restarts"] = spark.restarts
                result["warm_up_s"] = spark.warm_up_seconds
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
    result["failures"] = failures(result)
    result["summary"] = summarize(result)
    return result


def _freshness(
    spark: Any, root: Path, bootstrap: str, settings: Settings, log: Callable[[str], None]
) -> dict[str, Any]:
    log(
        f"bench: freshness at {settings.freshness_rate:,} records/s for "
        f"{settings.freshness_seconds:g} s per contender"
    )
    return freshness.compare(spark, root / "freshness", bootstrap, settings.freshness())


def _scale(
    spark: SparkHolder,
    root: Path,
    bootstrap: str,
    settings: Settings,
    log: Callable[[str], None],
    data: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The scale section (bench/scale.py) on the run's broker and Spark session; its topics
    are produced first unless given."""
    wanted = settings.scale()
    if data is None:
        t = time.perf_counter()
        data = scale.produce_topics(bootstrap, wanted)
        log(f"bench: produced the scale section's topics in {time.perf_counter() - t:.1f} s")
        os.sync()

    def contend(what: str, action: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
        return _contend(spark, "[scale]", what, action, log)

    return scale.run(contend, root, bootstrap, wanted, data, log)


def run_scale_only(settings: Settings, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Only the scale section, on a broker and a Spark session of its own (warmed on the
    section's smallest-partition topic, as a full run warms on its data set)."""
    started = time.perf_counter()
    result: dict[str, Any] = {
        "machine": describe_machine(),
        "load_before": _load(),
        "command": " ".join(sys.argv),
    }
    root = Path(tempfile.mkdtemp(prefix="exactly-bench-", dir=settings.work_dir))
    log(f"bench: working in {root}")
    broker = EmbeddedBroker(root / "kafka", port=free_port())
    try:
        bootstrap = broker.start(timeout=BROKER_START_TIMEOUT)
        t = time.perf_counter()
        wanted = settings.scale()
        data = scale.produce_topics(bootstrap, wanted)
        os.sync()
        log(f"bench: produced the scale section's topics in {time.perf_counter() - t:.1f} s")
        first = min(wanted.partition_counts)
        spark = SparkHolder(
            settings.spark_master,
            {},
            functools.partial(
                warm_up,
                root=root,
                bootstrap=bootstrap,
                records=settings.records,
                partitions=first,
                topic=scale.partitions_topic(first),
            ),
        )
        spark.broker_pid = broker.status().pid
        try:
            result["scale"] = _scale(spark, root / "scale", bootstrap, settings, log, data)
            result["warm_up_s"] = spark.warm_up_seconds
        finally:
            spark.stop()
    finally:
        broker.stop()
        if not settings.keep:
            shutil.rmtree(root, ignore_errors=True)
    result["load_after"] = _load()
    result["total_seconds"] = time.perf_counter() - started
    result["failures"] = failures(result)
    result["scale_summary"] = scale.summarize(result["scale"])
    return result


def run_freshness_only(settings: Settings, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Only the freshness section, on a broker and a Spark session of its own, warmed first
    by a short run of the same section at a low rate (discarded): a continuous pipeline is a
    long-running process, so its cold first batches are not what its users feel."""
    from resources.spark.session import build_session

    result: dict[str, Any] = {"machine": describe_machine(), "load_before": _load()}
    root = Path(tempfile.mkdtemp(prefix="exactly-bench-", dir=settings.work_dir))
    broker = EmbeddedBroker(root / "kafka", port=free_port())
    try:
        bootstrap = broker.start(timeout=BROKER_START_TIMEOUT)
        spark = build_session(settings.spark_master, {})
        try:
            warm = dataclasses.replace(settings.freshness(), rate=1_000, seconds=10.0)
            freshness.compare(spark, root / "warm-up", bootstrap, warm)
            result["freshness"] = _freshness(spark, root, bootstrap, settings, log)
        finally:
            spark.stop()
    finally:
        broker.stop()
        if not settings.keep:
            shutil.rmtree(root, ignore_errors=True)
    result["load_after"] = _load()
    result["failures"] = failures(result)
    return result


def failures(result: dict[str, Any]) -> list[str]:
    """Every contender that failed, as 'repetition/what: why'."""
    found = []
    for index, rep in enumerate(result.get("repetitions", []), start=1):
        for what, figures in _contenders(rep):
            if isinstance(figures, dict) and "failed" in figures:
                found.append(f"{index}/{what}: {figures['failed']}")
    for what, figures in (result.get("freshness") or {}).items():
        if isinstance(figures, dict) and "failed" in figures:
            found.append(f"freshness/{what}: {figures['failed']}")
    return found + scale.failures(result.get("scale"))


def _contenders(rep: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    for plan, by_label in rep["product"].items():
        for label, figures in by_label.items():
            yield f"exactly {plan} {label}", figures
    for label, figures in rep["peer"].items():
        yield f"structured-streaming {label}", figures
    yield "dagster", rep["dagster"]
    for name, figures in rep["limits"].items():
        yield f"limit {name}", figures
    yield "delta commit by files", rep["commits"]["files"]


@contextlib.contextmanager
def _s3_server(root: Path) -> Iterator[S3Server]:
    """The loopback S3 server of the S3 contender, with this process's AWS variables
    pointing at it (delta-rs and boto3 read them; Spark is handed the same access) while it
    runs, and restored after."""
    with start_s3_server(root) as server:
        saved = {name: os.environ.get(name) for name in server.env()}
        os.environ.update(server.env())
        try:
            server.create_bucket(BUCKET)
            yield server
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


@contextlib.contextmanager
def _described(spark: Any, label: str) -> Iterator[None]:
    """Name the Spark jobs run inside, so the profile can tell the contenders apart."""
    spark.sparkContext.setJobDescription(f"{spark_profile.DESCRIPTION_PREFIX} {label}")
    try:
        yield
    finally:
        with contextlib.suppress(Exception):  # the JVM may be gone: that is reported
            spark.sparkContext.setJobDescription(None)


def _reason(exc: BaseException, spark_died: bool) -> str:
    """One line saying why a contender failed (py4j cannot even print a dead JVM's error)."""
    try:
        text = str(exc)
    except Exception:
        text = ""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if "OutOfMemoryError" in text:
        first = "java.lang.OutOfMemoryError: Java heap space"
    reason = f"{type(exc).__name__}: {first[:300]}" if first else type(exc).__name__
    if spark_died:
        reason += " (Spark's JVM died: its stderr says why, e.g. OutOfMemoryError)"
    return reason


def _contend(
    spark: SparkHolder,
    tag: str,
    what: str,
    action: Callable[[Any], dict[str, Any]],
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Run one contender on the current session; a failure is recorded, not raised.

    Its figures get the CPU seconds each process spent on it, the peak resident memory of
    the driver while it ran (bench/memory.py), and the 1-minute load average when it
    finished (how busy the shared machine was).
    """
    memory = spark.memory()
    before = spark.cpu()
    try:
        with _described(spark.session, what), memory:
            figures = action(spark.session)
        after = spark.cpu()
    except Exception as exc:
        died = not spark.alive()
        reason = _reason(exc, died)
        log(f"{tag} {what}: FAILED: {reason}")
        if died:
            log(f"{tag} Spark restarted in {spark.restart():.1f} s")
        return {"failed": reason}
    if "records" in figures and "seconds" in figures:
        figures["cpu_s"] = {k: max(0.0, after[k] - before[k]) for k in after}
        if "child_cpu_s" in figures:
            figures["cpu_s"]["child"] = figures.pop("child_cpu_s")
        memory.add("child", figures.pop("child_peak_kib", None))
        figures["memory"] = memory.result()
        figures["load_1m"] = float(_load().split()[0])
        log(_line(tag, what, figures))
    return figures


#: The name of the peer contender (Structured Streaming) in the run's lines and profile.
PEER = "structured-streaming"
#: The contenders of one batch size, in the order of the first repetition.
CONTENDERS = ("routed", "cached", PEER)


def contender_order(index: int) -> list[str]:
    """The order of a batch size's contenders in repetition `index` (from 0): the first
    repetition's order turned by one place per repetition, so over three repetitions each
    contender runs once in each place. A contender pays for what the one before it left
    (a cached run costs the next routed run a second or two, BENCHMARKS.md "The spread of
    the routed contender"), and a fixed order would charge it to one side of a ratio."""
    turn = index % len(CONTENDERS)
    return [*CONTENDERS[turn:], *CONTENDERS[:turn]]


def _repetition(
    spark: SparkHolder,
    root: Path,
    bootstrap: str,
    records: int,
    settings: Settings,
    index: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Every contender once. Run folders are removed as soon as their figures are taken."""
    tag = f"[{index + 1}/{settings.repeat}]"
    out: dict[str, Any] = {"product": {"routed": {}, "cached": {}}, "peer": {}}
    # the first routed run's table, kept on disk for the Parquet limit (`_cli_path`)
    parquet_input = root / "parquet-input"
    for position, batch_records in enumerate(settings.batch_records):
        label = batch_label(batch_records)
        per_partition = _per_partition(batch_records, records, settings.partitions)

        def product_run(plan: str, label: str = label, position: int = position,
                        per_partition: int = per_partition) -> None:  # fmt: skip
            name = f"bench_{plan}_{label}"
            config = product.pipeline_config(root / name, name, bootstrap, TOPIC, per_partition)
            cli_path = functools.partial(
                _cli_path,
                config=config,
                records=records,
                routed=plan == "routed",
                empty_batches=settings.empty_batches if position == 0 else 0,
                parquet_input=parquet_input,
            )
            out["product"][plan][label] = _contend(
                spark, tag, f"exactly {plan} {label}", cli_path, log
            )
            shutil.rmtree(root / name, ignore_errors=True)
            if plan == "routed" and position == 0:
                s3_run(label, per_partition)

        def s3_run(label: str, per_partition: int) -> None:
            # the same pipeline with its tables on the loopback S3 server, right after the
            # local-disk run, so both see the same load
            name = f"bench_s3_{label}"
            # a folder per repetition, as on local disk: the bucket outlives the repetition,
            # and a table left by the one before would make this run find it caught up
            config = product.pipeline_config(
                root / name,
                name,
                bootstrap,
                TOPIC,
                per_partition,
                f"s3://{BUCKET}/{root.name}/{name}",
            )
            s3_path = functools.partial(
                product.run_cli_path, config=config, expected_records=records
            )
            out["product"][S3_PLAN] = {
                label: _contend(spark, tag, f"exactly {S3_PLAN} {label}", s3_path, log)
            }
            shutil.rmtree(root / name, ignore_errors=True)

        def peer_run(label: str = label, batch_records: int | None = batch_records) -> None:
            peer_root = root / f"peer-{label}"
            streaming = functools.partial(
                peer.run_structured_streaming,
                root=peer_root,
                bootstrap=bootstrap,
                topic=TOPIC,
                max_offsets_per_trigger=batch_records,
                expected_records=records,
                name=f"{spark_profile.DESCRIPTION_PREFIX} {PEER} {label}",
            )
            out["peer"][label] = _contend(spark, tag, f"{PEER} {label}", streaming, log)
            shutil.rmtree(peer_root, ignore_errors=True)

        for contender in contender_order(index):
            if contender == PEER:
                peer_run()
            else:
                product_run(contender)

    label = batch_label(settings.dagster_batch_records)
    name = f"bench_dagster_{label}"
    product.pipeline_config(
        root / name,
        name,
        bootstrap,
        TOPIC,
        _per_partition(settings.dagster_batch_records, records, settings.partitions),
    )
    out["dagster"] = _contend(
        spark,
        tag,
        f"exactly dagster {label}",
        lambda _session: product.run_dagster(root / name, expected_records=records),
        log,
    )
    shutil.rmtree(root / name, ignore_errors=True)

    out["limits"] = {}
    floors = _contend(
        spark,
        tag,
        "spark floors",
        lambda session: limits.spark_floors(
            session,
            bootstrap,
            TOPIC,
            settings.partitions,
            records,
            root / "floors",
            spark.cpu,
            spark.memory,
        ),
        log,
    )
    for floor, figures in floors.items():
        if isinstance(figures, dict):
            log(_line(tag, f"Spark floor: {floor.replace('_', ' ')}", figures))
    out["limits"]["spark_floors"] = floors
    shutil.rmtree(root / "floors", ignore_errors=True)
    out["limits"]["consume_confluent"] = _contend(
        spark,
        tag,
        "limit: consume (confluent-kafka)",
        lambda _s: limits.consume_confluent(bootstrap, TOPIC, settings.partitions, records),
        log,
    )
    out["limits"]["consume_java"] = _contend(
        spark,
        tag,
        "limit: consume (ConsumerPerformance)",
        lambda _s: limits.consume_java(bootstrap, TOPIC, records),
        log,
    )

    out["limits"]["parquet"] = _contend(
        spark,
        tag,
        "limit: Parquet write (pyarrow)",
        lambda _s: parquet_limit(parquet_input, root / "parquet-limit"),
        log,
    )
    shutil.rmtree(parquet_input, ignore_errors=True)
    shutil.rmtree(root / "parquet-limit", ignore_errors=True)
    files = _contend(
        spark,
        tag,
        "delta-rs commit by files",
        lambda _s: commits.commit_vs_files(root / "commits", list(settings.file_counts)),
        log,
    )
    out["commits"] = {"files": files}
    if "failed" not in files:
        shown = ", ".join(f"{n}: {v['median_s'] * 1000:.0f} ms" for n, v in files.items())
        log(f"{tag} delta-rs commit by files: {shown}")
    shutil.rmtree(root, ignore_errors=True)
    return out


def _cli_path(
    session: Any,
    *,
    config: Any,
    records: int,
    routed: bool,
    empty_batches: int,
    parquet_input: Path,
) -> dict[str, Any]:
    """One CLI-path run; the first routed run's data table is moved to `parquet_input`, the
    Parquet limit's input, which only that limit reads (`parquet_limit`). Each contender's
    peak is this process's memory while it runs, so rows read here, or held between
    contenders, would be counted as theirs (1.1 GiB for the full run's 2M records)."""
    figures = product.run_cli_path(
        session,
        config,
        expected_records=records,
        routed=routed,
        empty_batches=empty_batches,
    )
    if routed and not parquet_input.exists():
        shutil.move(config.delta.table_uri, parquet_input)  # its paths are relative
    return figures


def parquet_limit(table: Path, folder: Path) -> dict[str, Any]:
    """The Parquet limit on the rows of `table` (a routed run's, `_cli_path`): read inside
    this limit's window, which times the write only, and let go when it ends."""
    if not table.exists():
        raise product.BenchError("no routed run left its table for the Parquet limit")
    return limits.parquet_write(limits.table_rows(str(table)), folder)


def _line(tag: str, what: str, figures: dict[str, Any]) -> str:
    seconds = figures["seconds"]
    extra = ""
    if "cpu_s" in figures:
        extra += f", {sum(figures['cpu_s'].values()):.1f} CPU s"
    peaks = figures.get("memory", {}).get("peak_mib", {})
    if peaks.get("python") is not None:
        extra += f", peak py {peaks['python']:,.0f} + JVM {peaks.get('jvm') or 0:,.0f} MiB"
    if figures.get("load_1m") is not None:
        extra += f", load {figures['load_1m']:.1f}"
    return (
        f"{tag} {what}: {figures['records']:,} records in {seconds:.1f} s "
        f"({figures['records'] / seconds:,.0f} records/s{extra})"
    )
