"""Medians over repetitions, the ratios, and the printed table.

Ratios are taken within each repetition (the two sides ran minutes apart, under the same
load) and then their median is reported, which is steadier on a shared machine than the
ratio of two medians taken from different repetitions.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from bench import freshness
from bench.product import PHASES

MIB = float(1 << 20)
#: The routed plan with both tables on the loopback S3 server (s3proxy): the same
#: pipeline as "routed" on local disk, in the same repetitions.
S3_PLAN = "routed on S3"


def median(values: Iterable[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return statistics.median(found) if found else None


def batch_label(batch_records: int | None) -> str:
    """100000 -> '100k', 1000000 -> '1M', None -> 'all'."""
    if batch_records is None:
        return "all"
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if batch_records >= size and batch_records % size == 0:
            return f"{batch_records // size}{unit}"
    return str(batch_records)


def ok(run: Any) -> bool:
    """Whether a contender's figures are there (a failed one holds only why it failed)."""
    return isinstance(run, dict) and "failed" not in run


def rate(run: Any, mean_bytes: float) -> dict[str, float | None]:
    """records/s and MiB/s (of Kafka record values) of one run; None if it failed."""
    if not ok(run):
        return {"records_per_s": None, "mib_per_s": None}
    per_s = run["records"] / run["seconds"]
    return {"records_per_s": per_s, "mib_per_s": per_s * mean_bytes / MIB}


def _mean_phases(batches: Sequence[dict[str, Any]]) -> dict[str, float]:
    return {p: statistics.fmean(b["phases"][p] for b in batches) for p in PHASES}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def cpu_per_m(run: Any, process: str | None = None) -> float | None:
    """CPU seconds per million records of one run (all processes, or one of them)."""
    if not ok(run) or "cpu_s" not in run:
        return None
    cpu = run["cpu_s"]
    spent = sum(cpu.values()) if process is None else cpu.get(process, 0.0)
    return spent / run["records"] * 1e6


def _rates(runs: Sequence[Any], mean_bytes: float) -> dict[str, Any]:
    """The medians every throughput row has, over the runs that did not fail."""
    good = [r for r in runs if ok(r)]
    processes = sorted({k for r in good for k in r.get("cpu_s", {})})
    return {
        "runs": len(good),
        "failed": [r["failed"] for r in runs if not ok(r)],
        "seconds": median(r["seconds"] for r in good),
        "records_per_s": median(rate(r, mean_bytes)["records_per_s"] for r in good),
        "mib_per_s": median(rate(r, mean_bytes)["mib_per_s"] for r in good),
        "cpu_s_per_m_records": median(cpu_per_m(r) for r in good),
        "cpu_s_per_m_records_by_process": {
            k: median(cpu_per_m(r, k) for r in good) for k in processes
        },
        "load_1m": median(r.get("load_1m") for r in good),
        **memory_medians(good),
    }


def memory_medians(good: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median peak resident memory per process (MiB) over the runs, and how it was taken:
    see bench/memory.py."""
    measured = [r["memory"] for r in good if "memory" in r]
    processes = sorted({k for m in measured for k in m["peak_mib"]})
    return {
        "peak_mib": {k: median(m["peak_mib"].get(k) for m in measured) for k in processes},
        "start_mib": {
            k: median(m["start_mib"].get(k) for m in measured)
            for k in sorted({k for m in measured for k in m["start_mib"]})
        },
        "rise_mib": {k: median(_rise(m, k) for m in measured) for k in processes},
        "driver_sum_of_peaks_mib": median(m["driver_sum_of_peaks_mib"] for m in measured),
        "driver_sampled_peak_mib": median(m["driver_sampled_peak_mib"] for m in measured),
        "memory_method": next((m["method"] for m in measured if m["method"]), None),
    }


def _rise(memory: dict[str, Any], process: str) -> float | None:
    """How much a process grew during a contender: its peak minus its size at the start.
    Zero means the contender fitted in what the process already held."""
    peak, start = memory["peak_mib"].get(process), memory["start_mib"].get(process)
    return None if peak is None or start is None else peak - start


def memory_method(summary: dict[str, Any]) -> str | None:
    """How the driver's peaks of a run were taken (the first contender that says)."""
    rows = [*summary["throughput"], summary["dagster"], *summary["limits"].values()]
    return next((r["memory_method"] for r in rows if r.get("memory_method")), None)


def _product_row(runs: Sequence[Any], plan: str, label: str, mean_bytes: float) -> dict[str, Any]:
    good = [r for r in runs if ok(r)]
    details = sorted({k for r in good for b in r["batches"] for k in b["stage_detail"]})
    return {
        "system": "exactly",
        "path": "cli",
        "plan": plan,
        "batch": label,
        "batches": len(good[0]["batches"]) if good else None,
        **_rates(runs, mean_bytes),
        "phases_per_batch_s": {
            p: median(_mean_phases(r["batches"])[p] for r in good) for p in PHASES
        },
        "stage_detail_per_batch_s": {
            key: median(
                statistics.fmean(b["stage_detail"].get(key, 0.0) for b in r["batches"])
                for r in good
            )
            for key in details
        },
    }


def _peer_row(runs: Sequence[Any], label: str, mean_bytes: float) -> dict[str, Any]:
    good = [r for r in runs if ok(r)]
    return {
        "system": "structured-streaming",
        "path": "availableNow",
        "plan": "delta sink",
        "batch": label,
        "batches": len(good[0]["batches"]) if good else None,
        **_rates(runs, mean_bytes),
        "trigger_execution_per_batch_s": median(
            statistics.fmean(b["seconds"] for b in r["batches"]) for r in good
        ),
    }


def _dagster(reps: Sequence[dict[str, Any]], labels: list[str], label: str, mean_bytes: float):
    runs = [r["dagster"] for r in reps]
    good = [d for d in runs if ok(d)]
    steps = sorted({s for d in good for run in d["runs"] for s in run["steps"]})

    def overhead(rep: dict[str, Any]) -> float | None:
        """What a run costs beyond the same batches through the CLI path, per batch."""
        cli = rep["product"]["routed"].get(label)
        if label not in labels or not ok(rep["dagster"]) or not ok(cli):
            return None
        return (rep["dagster"]["seconds"] - cli["seconds"]) / len(rep["dagster"]["runs"])

    return {
        "batch": label,
        "batches": len(good[0]["runs"]) if good else None,
        **_rates(runs, mean_bytes),
        "run_per_batch_s": median(
            statistics.fmean(run["seconds"] for run in d["runs"]) for d in good
        ),
        "steps_per_batch_s": {
            s: median(statistics.fmean(run["steps"].get(s, 0.0) for run in d["runs"]) for d in good)
            for s in steps
        },
        "idle_run_s": median(t for d in good for t in d["idle_runs"]),
        "overhead_per_batch_s": median(overhead(r) for r in reps),
    }


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """The medians and ratios of a whole run, from its raw repetitions."""
    reps: list[dict[str, Any]] = result["repetitions"]
    mean_bytes = result["data_set"]["mean_record_bytes"]
    labels = [batch_label(b) for b in result["settings"]["batch_records"]]

    def product(rep: dict[str, Any], plan: str, label: str) -> Any:
        return rep["product"][plan][label]

    throughput = []
    for label in labels:
        for plan in ("routed", "cached"):
            runs = [product(r, plan, label) for r in reps]
            throughput.append(_product_row(runs, plan, label, mean_bytes))
        on_s3 = [
            r["product"][S3_PLAN][label] for r in reps if label in r["product"].get(S3_PLAN, {})
        ]
        if on_s3:
            throughput.append(_product_row(on_s3, S3_PLAN, label, mean_bytes))
        throughput.append(_peer_row([r["peer"][label] for r in reps], label, mean_bytes))
    dagster_label = batch_label(result["settings"]["dagster_batch_records"])
    dagster = _dagster(reps, labels, dagster_label, mean_bytes)

    empty: dict[str, Any] = {}
    for plan in ("routed", "cached"):
        runs = [product(r, plan, labels[0]) for r in reps]
        batches = [b for run in runs if ok(run) for b in run["empty_batches"]]
        empty[plan] = {
            "count": len(batches),
            "seconds": median(b["seconds"] for b in batches),
            "phases_s": {p: median(b["phases"][p] for b in batches) for p in PHASES},
        }
    idle = [r["peer"][label] for r in reps for label in labels if ok(r["peer"][label])]
    empty["structured-streaming idle run"] = {
        "count": len(idle),
        "seconds": median(run["idle_run_seconds"] for run in idle),
    }
    empty["dagster idle run"] = {"count": dagster["runs"], "seconds": dagster["idle_run_s"]}

    def limit(r: dict[str, Any], name: str) -> Any:
        if name.startswith("spark_"):
            floors = r["limits"]["spark_floors"]
            return floors.get(name.removeprefix("spark_"), floors) if ok(floors) else floors
        return r["limits"][name]

    floor_names = next(
        (list(r["limits"]["spark_floors"]) for r in reps if ok(r["limits"]["spark_floors"])), []
    )
    limit_names = [
        "consume_confluent",
        "consume_java",
        *(f"spark_{n}" for n in floor_names),
        "parquet",
    ]
    limits = {name: _rates([limit(r, name) for r in reps], mean_bytes) for name in limit_names}
    limits["parquet"]["threads"] = next(
        (r["limits"]["parquet"]["threads"] for r in reps if ok(r["limits"]["parquet"])), None
    )

    def product_rate(plan: str, label: str) -> Any:
        return lambda r: rate(product(r, plan, label), mean_bytes)["records_per_s"]

    def peer_rate(label: str) -> Any:
        return lambda r: rate(r["peer"][label], mean_bytes)["records_per_s"]

    def consume_limit(r: dict[str, Any]) -> float | None:
        rates = [
            rate(limit(r, n), mean_bytes)["records_per_s"]
            for n in ("consume_confluent", "consume_java")
        ]
        found = [x for x in rates if x is not None]
        return max(found) if found else None

    def named_limit(name: str) -> Any:
        return lambda r: rate(limit(r, name), mean_bytes)["records_per_s"]

    def per_rep_ratio(num: Any, den: Any) -> float | None:
        return median(_ratio(num(r), den(r)) for r in reps)

    def s3_rate(label: str) -> Any:
        def of(r: dict[str, Any]) -> float | None:
            run = r["product"].get(S3_PLAN, {}).get(label)
            return rate(run, mean_bytes)["records_per_s"] if run is not None else None

        return of

    def product_cpu(plan: str, label: str) -> Any:
        return lambda r: cpu_per_m(product(r, plan, label))

    def peer_cpu(label: str) -> Any:
        return lambda r: cpu_per_m(r["peer"][label])

    ratios = []
    for label in labels:
        after, before = product_rate("routed", label), product_rate("cached", label)
        ratios.append(
            {
                "batch": label,
                "product_over_structured_streaming": per_rep_ratio(after, peer_rate(label)),
                "product_over_consume_limit": per_rep_ratio(after, consume_limit),
                "product_over_parquet_limit": per_rep_ratio(after, named_limit("parquet")),
                "product_over_spark_floor": per_rep_ratio(
                    after, named_limit("spark_kafka_read_parse_parquet")
                ),
                "structured_streaming_over_consume_limit": per_rep_ratio(
                    peer_rate(label), consume_limit
                ),
                "routed_over_cached": per_rep_ratio(after, before),
                "s3_over_local_disk": per_rep_ratio(s3_rate(label), after),
                "cached_over_structured_streaming": per_rep_ratio(before, peer_rate(label)),
                # CPU spent per record, the other way round (above 1: exactly spends less)
                "cpu_cached_over_routed": per_rep_ratio(
                    product_cpu("cached", label), product_cpu("routed", label)
                ),
                "cpu_structured_streaming_over_product": per_rep_ratio(
                    peer_cpu(label), product_cpu("routed", label)
                ),
            }
        )
    file_runs = [r["commits"]["files"] for r in reps if ok(r["commits"]["files"])]
    files = {
        n: {"median_s": median(f[n]["median_s"] for f in file_runs)}
        for n in (file_runs[0] if file_runs else {})
    }
    history = {k: v for k, v in result["history"].items() if k != "seconds"}
    from bench import scale  # bench.scale imports this module's helpers

    return {
        "scale": scale.summarize(result["scale"]) if "scale" in result else None,
        "throughput": throughput,
        "dagster": dagster,
        "empty_batch": empty,
        "limits": limits,
        "ratios": ratios,
        "delta_commit": {
            "files": files,
            "history": history,
            "history_compacted": {
                k: v for k, v in (result.get("history_compacted") or {}).items() if k != "seconds"
            },
        },
        "startup": {
            "broker_start_s": result["broker_start_s"],
            "spark_session_start_s": result["spark_session_start_s"],
            "warm_up_s": result.get("warm_up_s", []),
            "spark_restarts": result.get("spark_restarts", 0),
        },
        "failures": result.get("failures", []),
    }


def _n(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.0f} ms"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _runs(row: dict[str, Any]) -> str:
    failed = len(row.get("failed") or [])
    return f"{row['runs']}/{row['runs'] + failed}"


#: The driver's peak resident memory columns: this process, Spark's JVM, their sum.
PEAK_HEADER = ("py MiB", "JVM MiB", "(JVM grew)", "py+JVM MiB*")


def _peaks(row: dict[str, Any]) -> list[str]:
    """A row's median peaks of the driver, as PEAK_HEADER names them."""
    peaks = row.get("peak_mib", {})
    return [
        _n(peaks.get("python")),
        _n(peaks.get("jvm")),
        _grew(row.get("rise_mib", {}).get("jvm")),
        _n(row.get("driver_sum_of_peaks_mib")),
    ]


def _grew(value: float | None) -> str:
    return "-" if value is None else f"+{max(value, 0.0):,.0f}"


def _memory_note(method: str | None) -> list[str]:
    return [
        f"py MiB, JVM MiB: peak resident memory of the driver while the contender ran "
        f"(this Python process; Spark's JVM, its child), by {method or 'no method'}, after a "
        f"full GC in both; a peak includes what was still held then (JSON: start_mib)",
        "(JVM grew): the JVM's peak minus its size at the start; +0: the contender fitted in "
        "the heap the JVM kept from the contenders before it (G1 gives little back), so its "
        "own need is at most the JVM figure, not that figure",
        "* the sum of the two peaks: an upper bound of their combined peak "
        "(the JSON's driver_sampled_peak_mib, their sum sampled, is a lower bound)",
    ]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(header, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += [
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    return lines


def render(result: dict[str, Any]) -> str:
    """The human-readable report: every figure of the JSON's summary, as tables."""
    s = result["summary"]
    data = result["data_set"]
    machine = result["machine"]
    settings = result["settings"]
    out = [
        f"exactly bench: {data['records']:,} records ({data['mean_record_bytes']:.0f} B mean, "
        f"{data['malformed']} malformed) over {data['partitions']} partitions; "
        f"medians of {settings['repeat']} repetition(s); MiB = 2^20 bytes of Kafka values",
        f"machine: {machine['nproc']} cores ({machine['cpu_model']}), "
        f"{machine['memory_gib']:.1f} GiB, {machine['java']}, Python {machine['python']}; "
        f"load average {result['load_before']} before, {result['load_after']} after",
        f"startup (not in any figure below): broker {s['startup']['broker_start_s']:.1f} s, "
        f"Spark session {s['startup']['spark_session_start_s']:.1f} s, "
        f"JIT warm-up {', '.join(f'{w:.1f}' for w in s['startup']['warm_up_s'])} s "
        f"({s['startup']['spark_restarts']} restart(s)); "
        f"producing the data set took {data['produce_seconds']:.1f} s",
        "",
        "Throughput, Kafka -> committed Delta",
    ]
    rows = []
    for t in s["throughput"]:
        name = "exactly (CLI path)" if t["system"] == "exactly" else "Structured Streaming"
        rows.append(
            [
                name,
                t["plan"],
                t["batch"],
                _n(t["batches"]),
                _runs(t),
                _n(t["seconds"], 1),
                _n(t["records_per_s"]),
                _n(t["mib_per_s"], 1),
                _n(t["cpu_s_per_m_records"], 1),
                _n(t["cpu_s_per_m_records_by_process"].get("broker"), 1),
                _n(t["load_1m"], 1),
                *_peaks(t),
            ]
        )
    d = s["dagster"]
    rows.append(
        [
            "exactly (Dagster run)",
            "routed",
            d["batch"],
            _n(d["batches"]),
            _runs(d),
            _n(d["seconds"], 1),
            _n(d["records_per_s"]),
            _n(d["mib_per_s"], 1),
            _n(d["cpu_s_per_m_records"], 1),
            _n(d["cpu_s_per_m_records_by_process"].get("broker"), 1),
            _n(d["load_1m"], 1),
            *_peaks(d),
        ]
    )
    header = ["system", "plan", "batch", "batches", "runs ok", "seconds", "records/s", "MiB/s"]
    header += ["CPU s/M rec", "(broker)", "load", *PEAK_HEADER]
    out += _table(header, rows)
    out += _memory_note(memory_method(s))

    out += ["", "Time per phase, mean seconds per batch (exactly, CLI path)"]
    rows = []
    for t in s["throughput"]:
        if t["system"] != "exactly":
            continue
        phases = t["phases_per_batch_s"]
        detail = " ".join(f"{k}={_n(v, 2)}" for k, v in t["stage_detail_per_batch_s"].items())
        rows.append([t["plan"], t["batch"], *(_n(phases[p], 3) for p in PHASES), detail])
    out += _table(["plan", "batch", *PHASES, "inside stage"], rows)
    steps = " ".join(f"{k}={_n(v, 2)}" for k, v in d["steps_per_batch_s"].items())
    out += [
        f"Dagster run per batch ({d['batch']}): {_n(d['run_per_batch_s'], 2)} s, ops: {steps}; "
        f"overhead over the CLI path: {_n(d['overhead_per_batch_s'], 2)} s per batch",
        "",
        "Fixed cost of a batch with nothing new (median)",
    ]
    rows = []
    for name, e in s["empty_batch"].items():
        phases = e.get("phases_s")
        detail = " ".join(f"{p}={_n(phases[p], 3)}" for p in PHASES) if phases else ""
        rows.append([name, str(e["count"]), _n(e["seconds"], 2), detail])
    out += _table(["what", "n", "seconds", "phases"], rows)

    out += ["", "Limits of this machine for this data"]
    lim = s["limits"]
    names = {
        "consume_confluent": "consume, confluent-kafka (one Python consumer)",
        "consume_java": "consume, Kafka ConsumerPerformance (Java, fetch time)",
        "spark_kafka_read": "Spark: Kafka source, records discarded (noop sink)",
        "spark_kafka_read_parse": "Spark: Kafka source + transform, discarded",
        "spark_kafka_read_parse_parquet": "Spark: Kafka + transform + Parquet (1 output, no cache)",
        "parquet": f"Parquet write, pyarrow ({lim['parquet'].get('threads')} threads, snappy)",
    }
    rows = [
        [
            names.get(key, key),
            _runs(figures),
            _n(figures["records_per_s"]),
            _n(figures["mib_per_s"], 1),
            _n(figures["cpu_s_per_m_records"], 1),
            *_peaks(figures),
            _n(figures["peak_mib"].get("child")),
        ]
        for key, figures in lim.items()
    ]
    header = ["limit", "runs ok", "records/s", "MiB/s", "CPU s/M rec", *PEAK_HEADER]
    out += _table([*header, "own JVM MiB"], rows)
    out += [
        "peaks as above; a Python-only limit still shows the Spark JVM's resident size, "
        "which it holds idle; ConsumerPerformance's own JVM is apart (own JVM)"
    ]

    out += ["", "Ratios of records/s (median of the per-repetition ratios)"]
    rows = [
        [
            r["batch"],
            _x(r["product_over_structured_streaming"]),
            _x(r["product_over_consume_limit"]),
            _x(r["product_over_parquet_limit"]),
            _x(r["product_over_spark_floor"]),
            _x(r["structured_streaming_over_consume_limit"]),
            _x(r["routed_over_cached"]),
            _x(r["cached_over_structured_streaming"]),
        ]
        for r in s["ratios"]
    ]
    cpu_rows = [
        [
            r["batch"],
            _x(r["cpu_structured_streaming_over_product"]),
            _x(r["cpu_cached_over_routed"]),
        ]
        for r in s["ratios"]
    ]
    out += _table(
        [
            "batch",
            "exactly/SSS",
            "exactly/consume",
            "exactly/parquet",
            "exactly/Spark floor",
            "SSS/consume",
            "routed/cached",
            "cached/SSS",
        ],
        rows,
    )
    on_s3 = [r for r in s["ratios"] if r.get("s3_over_local_disk") is not None]
    if on_s3:
        shown = ", ".join(f"{r['batch']}: {_x(r['s3_over_local_disk'])}" for r in on_s3)
        out += [f"tables on the loopback S3 server (s3proxy) over local disk, records/s: {shown}"]
    out += ["", "CPU seconds per record, the other way round (above 1: exactly spends less)"]
    out += _table(["batch", "SSS/exactly", "cached/routed"], cpu_rows)

    commit = s["delta_commit"]
    files = "  ".join(f"{n} files: {_ms(v['median_s'])}" for n, v in commit["files"].items())
    h = commit["history"]
    out += [
        "",
        "delta-rs commit (DeltaTarget.publish: load, version check, commit)",
        f"by files in the commit: {files}",
    ]
    rows = [
        [w["batches"], _ms(w["median_s"]), _ms(w["median_load_s"]), _ms(w["max_s"])]
        for w in h["windows"]
    ]
    out += [f"by history ({h['commits']} commits of one file each, one table):"]
    out += _table(["batches", "median commit", "of which load", "max"], rows)
    deciles = " ".join(f"{v * 1000:.0f}" for v in h["decile_medians_s"])
    out += [
        f"median commit per tenth of the history, ms: {deciles}",
        f"checkpoints {_versions(h['checkpoint_versions'])}: those commits "
        f"{_ms(h['median_checkpoint_commit_s'])} (median), "
        f"the others {_ms(h['median_other_commit_s'])}",
        *_compacted_history(result.get("history_compacted")),
        *freshness.render(result.get("freshness")),
    ]
    if s.get("scale"):
        from bench import scale

        out += scale.render(result["scale"], s["scale"])
    out += [
        "",
        f"total run time {result['total_seconds'] / 60:.1f} min",
    ]
    if s["failures"]:
        out += ["", f"FAILED ({len(s['failures'])}), left out of the medians above:"]
        out += [f"  {line}" for line in s["failures"]]
    return "\n".join(out)


def _versions(versions: list[int]) -> str:
    """Checkpoint versions, listed when few (a table every 10 versions has 100 of them)."""
    if not versions:
        return "none"
    if len(versions) <= 12:
        return f"at versions {versions}"
    return f"at {len(versions)} versions, {versions[0]} to {versions[-1]}"


def _compacted_history(found: dict[str, Any] | None) -> list[str]:
    """The history's lines with compaction past a limit between commits, if it ran."""
    if not found:
        return []
    tenths = " ".join(f"{v:.0f}" for v in found["tenth_medians_ms"])
    checkpoint = found["checkpoint_median_ms"]
    return [
        f"the same history compacted between commits past {found['compact_over']} files "
        f"(continuous mode's compact.when_files_over): median commit per tenth, ms: {tenths}",
        f"  checkpointing commits {checkpoint or 0:.0f} ms (median), the others "
        f"{found['other_median_ms']:.0f} ms; {found['compactions']} compactions, "
        f"{found['compaction_median_ms'] or 0:.0f} ms each (median, not in any commit)",
    ]
