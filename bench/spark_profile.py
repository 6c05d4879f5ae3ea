"""Where a Spark contender's time goes, from Spark's own event log.

The stage phase is JVM work behind py4j, so a Python profiler only sees the driver waiting
on a socket. Spark's event log instead records, per job and per task, the wall time, the
executor run time, the CPU time, GC, input bytes (Kafka or a cached block) and spills; that
is what `exactly bench --profile DIR` summarises per contender. Profiling changes the Spark
settings (it turns the event log on), so its figures are for finding where time goes, not
for the comparison tables.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: Job description prefix that names the contender a Spark job belongs to.
DESCRIPTION_PREFIX = "exactly-bench:"


def event_log_conf(folder: Path) -> dict[str, str]:
    """Settings that make a session write an uncompressed event log into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": folder.resolve().as_uri(),
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
    }


def _events(folder: Path) -> Iterator[dict[str, Any]]:
    files = [p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")]
    for path in sorted(files):
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("{"):
                    yield json.loads(line)


def summarize(folder: Path) -> dict[str, dict[str, float]]:
    """Totals per contender: jobs, job wall seconds, task run/CPU/GC seconds, task input
    bytes, bytes written, bytes spilled.

    Spark's Kafka source reports no input metrics, so `input_mib` here is, in practice, what
    tasks read back from cached blocks: the cost of `persist()`.
    """
    job_owner: dict[int, str] = {}
    job_start: dict[int, int] = {}
    stage_job: dict[int, int] = {}
    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for event in _events(folder):
        kind = event.get("Event")
        if kind == "SparkListenerJobStart":
            job = event["Job ID"]
            description = (event.get("Properties") or {}).get("spark.job.description") or ""
            owner = "other"
            if description.startswith(DESCRIPTION_PREFIX):
                # a streaming query's jobs are described "<query name> id = ... batch = n"
                owner = re.split(r"\s+id = ", description[len(DESCRIPTION_PREFIX) :])[0].strip()
            job_owner[job] = owner
            job_start[job] = event["Submission Time"]
            for stage in event.get("Stage IDs", []):
                stage_job[stage] = job
            totals[owner]["jobs"] += 1
        elif kind == "SparkListenerJobEnd":
            job = event["Job ID"]
            owner = job_owner.get(job, "other")
            totals[owner]["job_wall_s"] += (event["Completion Time"] - job_start[job]) / 1000
        elif kind == "SparkListenerTaskEnd":
            owner = job_owner.get(stage_job.get(event["Stage ID"], -1), "other")
            metrics = event.get("Task Metrics") or {}
            t = totals[owner]
            t["tasks"] += 1
            t["task_run_s"] += metrics.get("Executor Run Time", 0) / 1000
            t["task_cpu_s"] += metrics.get("Executor CPU Time", 0) / 1e9
            t["gc_s"] += metrics.get("JVM GC Time", 0) / 1000
            t["input_mib"] += (metrics.get("Input Metrics") or {}).get("Bytes Read", 0) / 2**20
            t["written_mib"] += (metrics.get("Output Metrics") or {}).get(
                "Bytes Written", 0
            ) / 2**20
            spilled = metrics.get("Memory Bytes Spilled", 0) + metrics.get("Disk Bytes Spilled", 0)
            t["spilled_mib"] += spilled / 2**20
    return {owner: dict(figures) for owner, figures in sorted(totals.items())}


def render(profile: dict[str, dict[str, float]]) -> str:
    """One line per contender, in the order of the printed report."""
    columns = ("jobs", "tasks", "job_wall_s", "task_run_s", "task_cpu_s", "gc_s", "input_mib")
    columns += ("written_mib", "spilled_mib")
    lines = ["Spark profile per contender (sums over the run, from the event log)"]
    width = max([len(k) for k in profile] + [10])
    lines.append("contender".ljust(width) + "  " + "  ".join(c.rjust(11) for c in columns))
    for owner, figures in profile.items():
        cells = "  ".join(
            f"{figures.get(c, 0.0):11,.{0 if c in ('jobs', 'tasks') else 1}f}" for c in columns
        )
        lines.append(owner.ljust(width) + "  " + cells)
    return "\n".join(lines)
