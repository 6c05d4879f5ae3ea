"""Medians over repetitions, the ratios, and the printed table.

Ratios are taken within each repetition (the two sides ran minutes apart, under the same
load) and then their median is reported, which is steadier on a shared machine than the
ratio of two medians taken from different repetitions.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from bench.product import PHASES

MIB = float(1 << 20)


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


def rate(run: dict[str, Any], mean_bytes: float) -> dict[str, float]:
    """records/s and MiB/s (of Kafka record values) of one run."""
    per_s = run["records"] / run["seconds"]
    return {"records_per_s": per_s, "mib_per_s": per_s * mean_bytes / MIB}


def _mean_phases(batches: Sequence[dict[str, Any]]) -> dict[str, float]:
    return {p: statistics.fmean(b["phases"][p] for b in batches) for p in PHASES}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """The medians and ratios of a whole run, from its raw repetitions."""
    reps: list[dict[str, Any]] = result["repetitions"]
    mean_bytes = result["data_set"]["mean_record_bytes"]
    labels = [batch_label(b) for b in result["settings"]["batch_records"]]

    def product(rep: dict[str, Any], plan: str, label: str) -> dict[str, Any]:
        return rep["product"][plan][label]

    throughput = []
    for label in labels:
        for plan in ("single-pass", "two-pass"):
            runs = [product(r, plan, label) for r in reps]
            throughput.append(
                {
                    "system": "exactly",
                    "path": "cli",
                    "plan": plan,
                    "batch": label,
                    "batches": len(runs[0]["batches"]),
                    "seconds": median(r["seconds"] for r in runs),
                    "records_per_s": median(rate(r, mean_bytes)["records_per_s"] for r in runs),
                    "mib_per_s": median(rate(r, mean_bytes)["mib_per_s"] for r in runs),
                    "phases_per_batch_s": {
                        p: median(_mean_phases(r["batches"])[p] for r in runs) for p in PHASES
                    },
                    "stage_detail_per_batch_s": {
                        key: median(
                            statistics.fmean(b["stage_detail"].get(key, 0.0) for b in r["batches"])
                            for r in runs
                        )
                        for key in sorted(
                            {k for r in runs for b in r["batches"] for k in b["stage_detail"]}
                        )
                    },
                }
            )
        peer_runs = [r["peer"][label] for r in reps]
        throughput.append(
            {
                "system": "structured-streaming",
                "path": "availableNow",
                "plan": "delta sink",
                "batch": label,
                "batches": len(peer_runs[0]["batches"]),
                "seconds": median(r["seconds"] for r in peer_runs),
                "records_per_s": median(rate(r, mean_bytes)["records_per_s"] for r in peer_runs),
                "mib_per_s": median(rate(r, mean_bytes)["mib_per_s"] for r in peer_runs),
                "trigger_execution_per_batch_s": median(
                    statistics.fmean(b["seconds"] for b in r["batches"]) for r in peer_runs
                ),
            }
        )
    dagster_label = batch_label(result["settings"]["dagster_batch_records"])
    dagster_runs = [r["dagster"] for r in reps]
    step_names = sorted({s for d in dagster_runs for run in d["runs"] for s in run["steps"]})
    dagster = {
        "batch": dagster_label,
        "batches": len(dagster_runs[0]["runs"]),
        "seconds": median(d["seconds"] for d in dagster_runs),
        "records_per_s": median(rate(d, mean_bytes)["records_per_s"] for d in dagster_runs),
        "mib_per_s": median(rate(d, mean_bytes)["mib_per_s"] for d in dagster_runs),
        "run_per_batch_s": median(
            statistics.fmean(run["seconds"] for run in d["runs"]) for d in dagster_runs
        ),
        "steps_per_batch_s": {
            s: median(
                statistics.fmean(run["steps"].get(s, 0.0) for run in d["runs"])
                for d in dagster_runs
            )
            for s in step_names
        },
        "idle_run_s": median(t for d in dagster_runs for t in d["idle_runs"]),
        # what a run costs beyond the same batches through the CLI path, per batch
        "overhead_per_batch_s": median(
            (d["seconds"] - product(r, "single-pass", dagster_label)["seconds"]) / len(d["runs"])
            for r, d in zip(reps, dagster_runs, strict=True)
        )
        if dagster_label in labels
        else None,
    }
    empty = {}
    for plan in ("single-pass", "two-pass"):
        batches = [b for r in reps for b in product(r, plan, labels[0])["empty_batches"]]
        empty[plan] = {
            "count": len(batches),
            "seconds": median(b["seconds"] for b in batches),
            "phases_s": {p: median(b["phases"][p] for b in batches) for p in PHASES},
        }
    empty["structured-streaming idle run"] = {
        "count": len(reps) * len(labels),
        "seconds": median(r["peer"][label]["idle_run_seconds"] for r in reps for label in labels),
    }
    empty["dagster idle run"] = {"count": len(reps), "seconds": dagster["idle_run_s"]}

    limits = {
        "consume_confluent": {
            "records_per_s": median(
                rate(r["limits"]["consume_confluent"], mean_bytes)["records_per_s"] for r in reps
            ),
            "mib_per_s": median(
                rate(r["limits"]["consume_confluent"], mean_bytes)["mib_per_s"] for r in reps
            ),
        },
        "consume_java": {
            "records_per_s": median(
                rate(r["limits"]["consume_java"], mean_bytes)["records_per_s"] for r in reps
            ),
            "mib_per_s": median(
                rate(r["limits"]["consume_java"], mean_bytes)["mib_per_s"] for r in reps
            ),
        },
        "parquet_pyarrow": {
            "records_per_s": median(
                rate(r["limits"]["parquet"], mean_bytes)["records_per_s"] for r in reps
            ),
            "mib_per_s": median(
                rate(r["limits"]["parquet"], mean_bytes)["mib_per_s"] for r in reps
            ),
            "threads": reps[0]["limits"]["parquet"]["threads"],
        },
    }

    def per_rep_ratio(label: str, num: Any, den: Any) -> float | None:
        return median(_ratio(num(r), den(r)) for r in reps)

    def product_rate(plan: str, label: str) -> Any:
        return lambda r: rate(product(r, plan, label), mean_bytes)["records_per_s"]

    def peer_rate(label: str) -> Any:
        return lambda r: rate(r["peer"][label], mean_bytes)["records_per_s"]

    def consume_limit(r: dict[str, Any]) -> float:
        return max(
            rate(r["limits"]["consume_confluent"], mean_bytes)["records_per_s"],
            rate(r["limits"]["consume_java"], mean_bytes)["records_per_s"],
        )

    def parquet_limit(r: dict[str, Any]) -> float:
        return rate(r["limits"]["parquet"], mean_bytes)["records_per_s"]

    ratios = []
    for label in labels:
        ratios.append(
            {
                "batch": label,
                "product_over_structured_streaming": per_rep_ratio(
                    label, product_rate("single-pass", label), peer_rate(label)
                ),
                "product_over_consume_limit": per_rep_ratio(
                    label, product_rate("single-pass", label), consume_limit
                ),
                "product_over_parquet_limit": per_rep_ratio(
                    label, product_rate("single-pass", label), parquet_limit
                ),
                "structured_streaming_over_consume_limit": per_rep_ratio(
                    label, peer_rate(label), consume_limit
                ),
                "single_pass_over_two_pass": per_rep_ratio(
                    label, product_rate("single-pass", label), product_rate("two-pass", label)
                ),
                "two_pass_over_structured_streaming": per_rep_ratio(
                    label, product_rate("two-pass", label), peer_rate(label)
                ),
            }
        )
    files = {
        n: {"median_s": median(r["commits"]["files"][n]["median_s"] for r in reps)}
        for n in reps[0]["commits"]["files"]
    }
    history = {k: v for k, v in result["history"].items() if k != "seconds"}
    return {
        "throughput": throughput,
        "dagster": dagster,
        "empty_batch": empty,
        "limits": limits,
        "ratios": ratios,
        "delta_commit": {"files": files, "history": history},
        "startup": {
            "broker_start_s": result["broker_start_s"],
            "spark_session_start_s": result["spark_session_start_s"],
        },
    }


def _n(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.0f} ms"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


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
        f"Spark session {s['startup']['spark_session_start_s']:.1f} s; "
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
                str(t["batches"]),
                _n(t["seconds"], 1),
                _n(t["records_per_s"]),
                _n(t["mib_per_s"], 1),
            ]
        )
    d = s["dagster"]
    rows.append(
        [
            "exactly (Dagster run)",
            "single-pass",
            d["batch"],
            str(d["batches"]),
            _n(d["seconds"], 1),
            _n(d["records_per_s"]),
            _n(d["mib_per_s"], 1),
        ]
    )
    out += _table(["system", "plan", "batch", "batches", "seconds", "records/s", "MiB/s"], rows)

    out += ["", "Time per phase, mean seconds per batch (exactly, CLI path)"]
    rows = []
    for t in s["throughput"]:
        if t["system"] != "exactly":
            continue
        phases = t["phases_per_batch_s"]
        detail = " ".join(f"{k}={v:.2f}" for k, v in t["stage_detail_per_batch_s"].items())
        rows.append([t["plan"], t["batch"], *(f"{phases[p]:.3f}" for p in PHASES), detail])
    out += _table(["plan", "batch", *PHASES, "inside stage"], rows)
    steps = " ".join(f"{k}={v:.2f}" for k, v in d["steps_per_batch_s"].items())
    out += [
        f"Dagster run per batch ({d['batch']}): {d['run_per_batch_s']:.2f} s, ops: {steps}; "
        f"overhead over the CLI path: {_n(d['overhead_per_batch_s'], 2)} s per batch",
        "",
        "Fixed cost of a batch with nothing new (median)",
    ]
    rows = []
    for name, e in s["empty_batch"].items():
        phases = e.get("phases_s")
        detail = " ".join(f"{p}={phases[p]:.3f}" for p in PHASES) if phases else ""
        rows.append([name, str(e["count"]), _n(e["seconds"], 2), detail])
    out += _table(["what", "n", "seconds", "phases"], rows)

    out += ["", "Limits of this machine for this data"]
    lim = s["limits"]
    rows = [
        [
            "consume, confluent-kafka (one Python consumer)",
            _n(lim["consume_confluent"]["records_per_s"]),
            _n(lim["consume_confluent"]["mib_per_s"], 1),
        ],
        [
            "consume, Kafka ConsumerPerformance (Java, fetch time)",
            _n(lim["consume_java"]["records_per_s"]),
            _n(lim["consume_java"]["mib_per_s"], 1),
        ],
        [
            f"Parquet write, pyarrow ({lim['parquet_pyarrow']['threads']} threads, snappy)",
            _n(lim["parquet_pyarrow"]["records_per_s"]),
            _n(lim["parquet_pyarrow"]["mib_per_s"], 1),
        ],
    ]
    out += _table(["limit", "records/s", "MiB/s"], rows)

    out += ["", "Ratios of records/s (median of the per-repetition ratios)"]
    rows = [
        [
            r["batch"],
            _x(r["product_over_structured_streaming"]),
            _x(r["product_over_consume_limit"]),
            _x(r["product_over_parquet_limit"]),
            _x(r["structured_streaming_over_consume_limit"]),
            _x(r["single_pass_over_two_pass"]),
            _x(r["two_pass_over_structured_streaming"]),
        ]
        for r in s["ratios"]
    ]
    out += _table(
        [
            "batch",
            "exactly/SSS",
            "exactly/consume",
            "exactly/parquet",
            "SSS/consume",
            "improvement (after/before)",
            "before/SSS",
        ],
        rows,
    )

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
        f"checkpoints at versions {h['checkpoint_versions'] or 'none'}: those commits "
        f"{_ms(h['median_checkpoint_commit_s'])} (median), "
        f"the others {_ms(h['median_other_commit_s'])}",
        "",
        f"total run time {result['total_seconds'] / 60:.1f} min",
    ]
    return "\n".join(out)
