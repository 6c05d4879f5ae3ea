"""The scale section: the same data over more partitions, and several pipelines at once.

Issue 13 asks two things of the product as it grows. First, that a batch's fixed cost (what
it pays whatever its size: planning, the ledger's rows, the Delta commit, the ack) does not
grow faster than the topic's partition count, since every one of those touches each
partition. So the same records are produced into topics of 8, 64 and 256 partitions, and
the same pipeline (the CLI path of the throughput section, the same records per batch) reads
each: records/s, the mean time of each phase per batch, and the cost of a batch with nothing
new (`allow_empty`, as the "Fixed cost" table measures it) at each count, with their ratios
against the smallest count. Beside each count, in the same session, Structured Streaming
reads the same topic in batches of the same size (issue 31: the task count of a read
follows the records and the cores, jobs/stage/kafka_read.py `read_tasks`; Spark's source
runs a task per partition).

Second, that pipelines served by one code location (one process: threads, one Spark session,
as the Dagster code location opens one `Pipeline` per config in one process) together move
at least as many records/s as one of them alone. The data set is split in four slices, one
topic each (together exactly the events of the one pipeline's topic), and four pipelines,
each with its own name, tables and ledger, read them at once; one pipeline alone reads the
whole data set from one topic just before.

Everything runs on the harness's broker and Spark session, side by side in one run, so the
ratios compare figures taken under the same load.
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import peer, product
from bench.data import split
from bench.product import PHASES
from bench.report import batch_label, ok

#: How long a pipeline thread waits for the others to be built before it gives up.
BARRIER_TIMEOUT_S = 300.0

Contend = Callable[[str, Callable[[Any], dict[str, Any]]], dict[str, Any]]


@dataclass(frozen=True)
class ScaleSettings:
    """What the section measures: the data set, the partition counts, the pipelines."""

    records: int
    record_bytes: int
    partition_counts: tuple[int, ...] = (8, 64, 256)
    batch_records: int = 100_000
    empty_batches: int = 3
    pipelines: int = 4
    #: partitions of each pipeline's topic in the pipelines part (and of the one alone)
    pipeline_partitions: int = 8
    #: beside each count, Structured Streaming and the stage as it read before issue 31 (a
    #: task per partition); off in `--smoke`, whose scale section checks the harness only
    beside: bool = True


def partitions_topic(partitions: int) -> str:
    return f"bench-scale-{partitions}p"


def slice_topic(index: int) -> str:
    return f"bench-scale-slice-{index + 1}"


def produce_topics(bootstrap: str, settings: ScaleSettings) -> dict[str, Any]:
    """The same records in one topic per partition count, and the data set cut in
    `pipelines` slices (one topic each); what was produced, as DataSet dicts."""
    from bench.data import produce
    from resources.kafka.client import KafkaClient

    counts = sorted({*settings.partition_counts, settings.pipeline_partitions})
    out: dict[str, Any] = {"partitions": {}, "slices": []}
    with KafkaClient(bootstrap, timeout=60) as client:
        for partitions in counts:
            data = produce(
                client,
                partitions_topic(partitions),
                records=settings.records,
                partitions=partitions,
                record_bytes=settings.record_bytes,
            )
            out["partitions"][str(partitions)] = data.as_dict()
        first = 0
        for index, records in enumerate(split(settings.records, settings.pipelines)):
            data = produce(
                client,
                slice_topic(index),
                records=records,
                partitions=settings.pipeline_partitions,
                record_bytes=settings.record_bytes,
                first=first,
            )
            out["slices"].append(data.as_dict())
            first += records
    return out


@contextlib.contextmanager
def per_partition_tasks() -> Iterator[None]:
    """The stage as it read before issue 31, a Spark task per partition: what a session that
    cannot say its cores still does (jobs/stage/kafka_read.py `read_tasks`). Kept here only,
    to be measured beside the stage as it is."""
    from jobs.stage import staging

    before = staging.parallelism_of
    staging.parallelism_of = lambda _spark: None
    try:
        yield
    finally:
        staging.parallelism_of = before


def _per_partition(batch_records: int, partitions: int) -> int:
    return -(-batch_records // partitions)


def run(
    contend: Contend,
    root: Path,
    bootstrap: str,
    settings: ScaleSettings,
    data: dict[str, Any],
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Every contender of the section once, through the harness's `contend` (which records
    a failure instead of raising, and adds the CPU each process spent)."""
    out: dict[str, Any] = {"settings": asdict(settings), "data": data, "partitions": {}}
    for partitions in settings.partition_counts:
        name = f"bench_scale_{partitions}p"
        config = product.pipeline_config(
            root / name,
            name,
            bootstrap,
            partitions_topic(partitions),
            _per_partition(settings.batch_records, partitions),
        )

        def one_count(session: Any, config: Any = config) -> dict[str, Any]:
            return product.run_cli_path(
                session,
                config,
                expected_records=settings.records,
                empty_batches=settings.empty_batches,
            )

        out["partitions"][str(partitions)] = contend(f"scale: {partitions} partitions", one_count)
        shutil.rmtree(root / name, ignore_errors=True)
        if not settings.beside:
            continue
        with per_partition_tasks():
            out.setdefault("per_partition_tasks", {})[str(partitions)] = contend(
                f"scale: {partitions} partitions, a task per partition", one_count
            )
        shutil.rmtree(root / name, ignore_errors=True)

        # beside it, in the same session: Structured Streaming on the same topic, batches of
        # the same size (maxOffsetsPerTrigger spans all partitions)
        def streaming(
            session: Any, partitions: int = partitions, name: str = name
        ) -> dict[str, Any]:
            return peer.run_structured_streaming(
                session,
                root / f"{name}_ss",
                bootstrap=bootstrap,
                topic=partitions_topic(partitions),
                max_offsets_per_trigger=settings.batch_records,
                expected_records=settings.records,
                name=f"structured-streaming-{partitions}p",
            )

        out.setdefault("structured_streaming", {})[str(partitions)] = contend(
            f"scale: Structured Streaming, {partitions} partitions", streaming
        )
        shutil.rmtree(root / f"{name}_ss", ignore_errors=True)

    per_partition = _per_partition(settings.batch_records, settings.pipeline_partitions)
    name = "bench_scale_alone"
    alone = product.pipeline_config(
        root / name, name, bootstrap, partitions_topic(settings.pipeline_partitions), per_partition
    )
    out["alone"] = contend(
        "scale: one pipeline alone",
        lambda session: product.run_cli_path(session, alone, expected_records=settings.records),
    )
    shutil.rmtree(root / name, ignore_errors=True)

    names = [f"bench_scale_together_{i + 1}" for i in range(settings.pipelines)]
    configs = [
        product.pipeline_config(root / n, n, bootstrap, slice_topic(i), per_partition)
        for i, n in enumerate(names)
    ]
    expected = split(settings.records, settings.pipelines)
    out["together"] = contend(
        f"scale: {settings.pipelines} pipelines at once",
        lambda session: together(session, configs, expected),
    )
    for n in names:
        shutil.rmtree(root / n, ignore_errors=True)
    return out


def together(spark: Any, configs: Sequence[Any], expected: Sequence[int]) -> dict[str, Any]:
    """Run every pipeline until caught up, each in a thread of this process, on the one
    Spark session; timed from the moment all of them are built to the last one's end.

    Each pipeline checks its own counts (every record of its topic read once, staged or
    quarantined once), as the one alone does; a pipeline that fails fails the contender.
    """
    barrier = threading.Barrier(len(configs) + 1)
    results: list[Any] = [None] * len(configs)

    def one(index: int) -> None:
        try:
            results[index] = product.run_cli_path(
                spark,
                configs[index],
                expected_records=expected[index],
                ready=lambda: barrier.wait(timeout=BARRIER_TIMEOUT_S),
            )
        except BaseException as exc:  # reported by the main thread
            results[index] = exc
            barrier.abort()

    threads = [
        threading.Thread(target=one, args=(i,), name=f"scale-pipeline-{i + 1}", daemon=True)
        for i in range(len(configs))
    ]
    for thread in threads:
        thread.start()
    # a pipeline that fails while being built breaks the barrier: its error is raised below
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait(timeout=BARRIER_TIMEOUT_S)
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
        raise (real or errors)[0]
    return {"records": sum(expected), "seconds": seconds, "pipelines": results}


def _mean_phases(batches: Sequence[dict[str, Any]]) -> dict[str, float] | None:
    if not batches:
        return None
    return {p: statistics.fmean(b["phases"][p] for b in batches) for p in PHASES}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _rate(run: dict[str, Any]) -> float:
    return run["records"] / run["seconds"]


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    """Rates, mean phases and the fixed cost per partition count with their ratios to the
    smallest count; the pipelines' aggregate rate against one alone."""
    rows: list[dict[str, Any]] = []
    for count, run in raw["partitions"].items():
        if not ok(run):
            rows.append({"partitions": int(count), "failed": run["failed"]})
            continue
        empty = run["empty_batches"]
        rows.append(
            {
                "partitions": int(count),
                "records": run["records"],
                "batches": len(run["batches"]),
                "seconds": run["seconds"],
                "records_per_s": _rate(run),
                "phases_per_batch_s": _mean_phases(run["batches"]),
                "fixed_cost_s": statistics.median(e["seconds"] for e in empty) if empty else None,
                "fixed_cost_phases_s": {
                    p: statistics.median(e["phases"][p] for e in empty) for p in PHASES
                }
                if empty
                else None,
                "cpu_s_per_m_records": sum(run.get("cpu_s", {}).values()) / run["records"] * 1e6,
            }
        )
    # beside each count: Structured Streaming, and the stage's former task per partition
    for key in ("structured_streaming", "per_partition_tasks"):
        for row in rows:
            other = raw.get(key, {}).get(str(row["partitions"]))
            if "failed" in row or not ok(other):
                continue
            row[f"{key}_records_per_s"] = _rate(other)
            row[f"product_over_{key}"] = row["records_per_s"] / _rate(other)
    base = next((r for r in rows if "failed" not in r), None)
    for row in rows:
        if "failed" in row or base is None:
            continue
        phases, base_phases = row["phases_per_batch_s"], base["phases_per_batch_s"]
        fixed = _ratio(row["fixed_cost_s"], base["fixed_cost_s"])
        grown = row["partitions"] / base["partitions"]
        row["vs_first"] = {
            "partitions": grown,
            "records_per_s": _ratio(row["records_per_s"], base["records_per_s"]),
            **{p: _ratio(phases[p], base_phases[p]) for p in PHASES},
            "fixed_cost": fixed,
        }
        # the target: the fixed cost grows no faster than the partition count
        row["fixed_cost_within_partitions"] = fixed is not None and fixed <= grown

    pipelines: dict[str, Any] = {"count": raw["settings"]["pipelines"]}
    for what in ("alone", "together"):
        run = raw.get(what)
        if not ok(run):
            pipelines[what] = {"failed": run["failed"] if isinstance(run, dict) else "not run"}
            continue
        runs = run["pipelines"] if what == "together" else [run]
        batches = [b for r in runs for b in r["batches"]]
        pipelines[what] = {
            "records": run["records"],
            "seconds": run["seconds"],
            "records_per_s": _rate(run),
            "batches": len(batches),
            "phases_per_batch_s": _mean_phases(batches),
            "each_records_per_s": [_rate(r) for r in runs],
            "cpu_s_per_m_records": sum(run.get("cpu_s", {}).values()) / run["records"] * 1e6,
        }
    if ok(raw.get("alone")) and ok(raw.get("together")):
        ratio = pipelines["together"]["records_per_s"] / pipelines["alone"]["records_per_s"]
        pipelines["together_over_alone"] = ratio
        pipelines["target_met"] = ratio >= 1.0
    return {"partitions": rows, "pipelines": pipelines}


def _f(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def render(raw: dict[str, Any], summary: dict[str, Any]) -> list[str]:
    """The section's tables, for the report."""
    from bench.report import _table

    settings = raw["settings"]
    data = raw["data"]["partitions"]
    mean_bytes = next(iter(data.values()))["mean_record_bytes"] if data else 0
    counts = ", ".join(str(c) for c in settings["partition_counts"])
    out = [
        "",
        f"Scale with partitions: the same {settings['records']:,} records ({mean_bytes:.0f} B "
        f"mean) in topics of {counts} partitions, batches of "
        f"{batch_label(settings['batch_records'])}; phases in mean seconds per batch, "
        f"fixed cost = median batch with nothing new (n={settings['empty_batches']})",
    ]
    rows = []
    for r in summary["partitions"]:
        if "failed" in r:
            rows.append([str(r["partitions"]), "FAILED", *["-"] * 14])
            continue
        ph = r["phases_per_batch_s"]
        rows.append(
            [
                str(r["partitions"]),
                str(r["batches"]),
                _f(r["seconds"], 1),
                _f(r["records_per_s"], 0),
                _f(r.get("structured_streaming_records_per_s"), 0),
                _x(r.get("product_over_structured_streaming")),
                _f(r.get("per_partition_tasks_records_per_s"), 0),
                _x(r.get("product_over_per_partition_tasks")),
                _f(r["cpu_s_per_m_records"], 1),
                *(_f(ph[p], 3) for p in PHASES),
                _f(r["fixed_cost_s"], 3),
                " ".join(f"{p}={_f(v, 3)}" for p, v in (r["fixed_cost_phases_s"] or {}).items()),
            ]
        )
    out += _table(
        [
            "partitions",
            "batches",
            "seconds",
            "records/s",
            "SS records/s",
            "product/SS",
            "task/partition records/s",
            "product/that",
            "CPU s/M rec",
            *PHASES,
            "fixed cost",
            "fixed cost phases",
        ],
        rows,
    )
    out += ["", "Ratios against the first count (fixed cost must grow no faster than partitions)"]
    rows = []
    for r in summary["partitions"]:
        if "vs_first" not in r:
            continue
        v = r["vs_first"]
        rows.append(
            [
                str(r["partitions"]),
                _x(v["partitions"]),
                _x(v["records_per_s"]),
                *(_x(v[p]) for p in PHASES),
                _x(v["fixed_cost"]),
                "yes" if r["fixed_cost_within_partitions"] else "NO",
            ]
        )
    out += _table(
        ["partitions", "partitions x", "records/s", *PHASES, "fixed cost", "within"], rows
    )
    p = summary["pipelines"]
    slices = raw["data"]["slices"]
    out += [
        "",
        f"Scale with pipelines: {p['count']} pipelines at once in one process (threads, one "
        f"Spark session, a ledger each) on the data set cut in {len(slices)} topics of "
        f"{settings['pipeline_partitions']} partitions, against one pipeline alone on the "
        f"whole data set ({settings['records']:,} records, {settings['pipeline_partitions']} "
        "partitions)",
    ]
    rows = []
    for what, label in (("alone", "one alone"), ("together", f"{p['count']} at once")):
        row = p[what]
        if "failed" in row:
            rows.append([label, "FAILED", *["-"] * 9])
            continue
        ph = row["phases_per_batch_s"] or {}
        each = " ".join(_f(x, 0) for x in row["each_records_per_s"])
        rows.append(
            [
                label,
                str(row["batches"]),
                _f(row["seconds"], 1),
                _f(row["records_per_s"], 0),
                _f(row["cpu_s_per_m_records"], 1),
                *(_f(ph.get(k), 3) for k in PHASES),
                each,
            ]
        )
    out += _table(
        [
            "what",
            "batches",
            "seconds",
            "records/s",
            "CPU s/M rec",
            *PHASES,
            "records/s of each",
        ],
        rows,
    )
    if "together_over_alone" in p:
        met = "met" if p["target_met"] else "NOT met"
        out.append(
            f"{p['count']} at once / one alone: {_x(p['together_over_alone'])} of records/s "
            f"(target >= 1.00x: {met})"
        )
    return out


def failures(raw: dict[str, Any] | None) -> list[str]:
    """The section's failed contenders, as 'scale/what: why'."""
    if not raw:
        return []
    found = [
        f"scale/{count} partitions: {run['failed']}"
        for count, run in raw.get("partitions", {}).items()
        if not ok(run)
    ]
    for key, label in (
        ("structured_streaming", "Structured Streaming, "),
        ("per_partition_tasks", "a task per partition, "),
    ):
        found += [
            f"scale/{label}{count} partitions: {run['failed']}"
            for count, run in raw.get(key, {}).items()
            if not ok(run)
        ]
    for what in ("alone", "together"):
        run = raw.get(what)
        if isinstance(run, dict) and "failed" in run:
            found.append(f"scale/{what}: {run['failed']}")
    return found
