"""delta-rs commit latency: against the number of files in a commit, and against history.

Both go through the product's own commit (resources/delta/table.py DeltaTarget.publish: load the
table, check the app transaction version, commit the add actions with the commit info), so
the figures are the commit phase a batch pays, minus the ledger's part.

A checkpoint is due every `delta.checkpointInterval` commits (10 for a table that sets none:
resources/delta/checkpoints.py `DEFAULT_INTERVAL`), written beside the commit that reaches
it; loading the table then replays at most that many JSON commits after the checkpoint.
DeltaTarget keeps the table open and reads only the commits since its last load, so the load
part of a commit should stay flat as history grows: the history section says whether it
does, from the commit times themselves.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from jobs.stage import parquet_files
from ledger.core.batch import BatchKind
from resources.delta.checkpoints import wait_for_checkpoints
from resources.delta.table import DeltaTarget

APP_ID = "bench"
SCHEMA = pa.schema([("id", pa.int64()), ("app", pa.string()), ("ts", pa.timestamp("us", "UTC"))])


def _small_files(table_root: Path, folder: str, count: int, first_id: int) -> list[Any]:
    """`count` small Parquet files (10 rows each) in a staging folder, described as the vote
    describes them (footer statistics included)."""
    staged = table_root / "staged" / folder
    staged.mkdir(parents=True)
    for i in range(count):
        ids = list(range(first_id + 10 * i, first_id + 10 * i + 10))
        rows = pa.table(
            {
                "id": ids,
                "app": ["web"] * 10,
                "ts": pa.array([j * 1_000_000 for j in ids], pa.timestamp("us", "UTC")),
            },
            schema=SCHEMA,
        )
        pq.write_table(rows, staged / f"part-{i:05d}.parquet", compression="snappy")
    return parquet_files.describe(str(staged), str(table_root), "table")


def _metadata(batch_id: int, partitions: int = 8) -> dict[str, Any]:
    """Commit info of the size a real batch carries (8 partitions' ranges)."""
    return {
        "app_id": APP_ID,
        "pipeline": APP_ID,
        "kind": BatchKind.LIVE,
        "batch_id": batch_id,
        "attempt": 1,
        "ranges": [
            {"topic": "pageviews", "partition": p, "start": batch_id * 100, "end": batch_id * 100}
            for p in range(partitions)
        ],
        "params": {},
    }


def _publish(target: DeltaTarget, batch_id: int, files: list[Any]) -> float:
    started = time.perf_counter()
    outcome = target.publish(
        app_id=APP_ID,
        batch_id=batch_id,
        files=files,
        schema=SCHEMA,
        metadata=_metadata(batch_id),
    )
    seconds = time.perf_counter() - started
    if not outcome.published:
        raise RuntimeError(f"{target.uri}: batch {batch_id} was not published")
    return seconds


def commit_vs_files(root: Path, counts: list[int], commits_each: int = 3) -> dict[str, Any]:
    """Median commit seconds of `commits_each` commits of n files, per n, each on its own
    table (created by a first, unmeasured, 1-file commit)."""
    found: dict[str, Any] = {}
    for n in counts:
        table_root = root / f"files-{n}"
        target = DeltaTarget(str(table_root))
        _publish(target, 1, _small_files(table_root, "create", 1, 0))
        times = []
        for k in range(commits_each):
            files = _small_files(table_root, f"batch-{k}", n, 10_000_000 * (k + 1))
            times.append(_publish(target, k + 2, files))
        found[str(n)] = {"median_s": statistics.median(times), "seconds": times}
    return found


def windows(commits: int) -> list[tuple[int, int]]:
    """Batch windows (1-based, inclusive) to report: 1-10, 100-110, 500-510 and 990-1000 for
    1,000 commits; the same proportions, with narrower windows, for fewer."""
    width = max(1, min(10, commits // 10))
    starts = (1, commits // 10, commits // 2, commits - width)
    ends = (width, commits // 10 + width, commits // 2 + width, commits)
    return [(max(1, lo), min(commits, hi)) for lo, hi in zip(starts, ends, strict=True)]


def commit_vs_history(root: Path, commits: int) -> dict[str, Any]:
    """Commit `commits` batches of one small file each to one table, timing every commit.

    Inside the reported windows, the table is also loaded once just before the commit (and
    timed apart). DeltaTarget keeps its table open, so that load is the incremental update
    a commit starts with (it replayed the log since the last checkpoint before), and it
    leaves the commit right after it nothing new to read: the windows' commit times are a
    little short of the others'. bench/commit_history.py times the commits alone.
    """
    table_root = root / "history"
    target = DeltaTarget(str(table_root))
    files = _small_files(table_root, "all", commits, 0)
    spans = windows(commits)
    in_window = {b for lo, hi in spans for b in range(lo, hi + 1)}
    times: list[float] = []
    loads: dict[int, float] = {}
    for batch, staged in enumerate(files, start=1):
        if batch in in_window and batch > 1:
            started = time.perf_counter()
            target.load()
            loads[batch] = time.perf_counter() - started
        times.append(_publish(target, batch, [staged]))
    log = table_root / "_delta_log"
    wait_for_checkpoints()  # written beside the commits (resources/delta/checkpoints.py)
    checkpoints = sorted(int(p.name.split(".")[0]) for p in log.glob("*.checkpoint.parquet"))
    # table version v holds batch v (version 0 is the table's creation by batch 1's commit)
    at_checkpoint = [times[v - 1] for v in checkpoints if 1 <= v <= commits]
    others = [t for i, t in enumerate(times, start=1) if i not in set(checkpoints)]
    report = []
    for lo, hi in spans:
        window = times[lo - 1 : hi]
        window_loads = [loads[b] for b in range(lo, hi + 1) if b in loads]
        report.append(
            {
                "batches": f"{lo}-{hi}",
                "median_s": statistics.median(window),
                "max_s": max(window),
                "median_load_s": statistics.median(window_loads) if window_loads else None,
            }
        )
    tenth = max(1, commits // 10)
    deciles = [statistics.median(times[i : i + tenth]) for i in range(0, commits, tenth)]
    first, last = report[0]["median_s"], report[-1]["median_s"]
    return {
        "commits": commits,
        "windows": report,
        "last_over_first": last / first if first else None,
        "decile_medians_s": deciles,
        "checkpoint_versions": checkpoints,
        "median_checkpoint_commit_s": statistics.median(at_checkpoint) if at_checkpoint else None,
        "median_other_commit_s": statistics.median(others) if others else None,
        "seconds": times,
    }
