"""Commit latency against history, alone: `python -m bench.commit_history [--commits 1000]`.

The history section of `exactly bench` (bench/commits.py `commit_vs_history`) needs the
whole benchmark run around it; this runs only the commits, in a minute, so two versions of
resources/delta/table.py can be compared side by side in one session (run it with each
checkout's directory first on PYTHONPATH). Every commit goes through the product's own path
(DeltaTarget.publish, one small file each, one DeltaTarget for the whole history, as a
pipeline's process keeps), with nothing else between commits: unlike `commit_vs_history`,
no extra load is timed inside any window, since with the table kept open such a load would
bring the table up to date for the commit that follows it.

`--profile` also times, per commit, the delta-rs calls the commit is made of (wrapped
around DeltaTable's methods, so it adds a little to every figure): a fresh load
(DeltaTable()), update_incremental, the fingerprint of the kept version's log entry,
transaction_version, and create_write_transaction (the commit itself, with the checkpoint
it writes every 100th version).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from bench.commits import APP_ID, SCHEMA, _metadata, _small_files
from resources.delta.checkpoints import wait_for_checkpoints
from resources.delta.table import DeltaTarget
from resources.object_storage import storage

#: What --profile times: (owner, attribute) -> label.
_PROFILED = {
    (DeltaTable, "__init__"): "fresh load",
    (DeltaTable, "update_incremental"): "update_incremental",
    (DeltaTable, "transaction_version"): "transaction_version",
    (DeltaTable, "create_write_transaction"): "create_write_transaction",
    (storage, "fingerprint"): "fingerprint",
}


@contextmanager
def _timed_calls(spent: dict[str, float]) -> Iterator[None]:
    """Add the seconds spent in each of _PROFILED's calls to `spent`, by label."""
    originals = {key: getattr(*key) for key in _PROFILED if hasattr(*key)}

    def wrap(label: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                spent[label] += time.perf_counter() - started

        return timed

    for (owner, name), call in originals.items():
        setattr(owner, name, wrap(_PROFILED[owner, name], call))
    try:
        yield
    finally:
        for (owner, name), call in originals.items():
            setattr(owner, name, call)


@contextmanager
def checkpoint_in_commit() -> Iterator[None]:
    """The publish as it was before issue 31: delta-rs writes the checkpoint in the commit of
    every hundredth version (resources/delta/checkpoints.py says why it no longer does)."""
    from deltalake import PostCommitHookProperties

    from resources.delta import commit

    before = commit.NO_CHECKPOINT, commit.due_version
    commit.NO_CHECKPOINT = PostCommitHookProperties(create_checkpoint=True)
    commit.due_version = lambda _table, _before: None
    try:
        yield
    finally:
        commit.NO_CHECKPOINT, commit.due_version = before


#: The file count past which `exactly bench`'s compacted history compacts between commits.
COMPACT_OVER = 100


def compact_limit(commits: int) -> int:
    """COMPACT_OVER, or a tenth of a shorter history (at least 2), so a short run (the
    smoke's) compacts too."""
    return min(COMPACT_OVER, max(2, commits // 10))


def run(
    root: Path,
    commits: int,
    profile: bool,
    compact_over: int | None = None,
    in_commit: bool = False,
) -> dict[str, Any]:
    """Commit `commits` batches of one small file each to one table, timing every commit;
    with `compact_over`, compact the table between two commits once it holds more files
    than that, as a continuous run does (`compact.when_files_over`), timed apart; with
    `in_commit`, checkpoints are written inside the commits, as before issue 31."""
    with checkpoint_in_commit() if in_commit else _nothing():
        return _run(root, commits, profile, compact_over)


def _run(root: Path, commits: int, profile: bool, compact_over: int | None) -> dict[str, Any]:
    table_root = root / "history"
    target = DeltaTarget(str(table_root))
    files = _small_files(table_root, "all", commits, 0)
    times: list[float] = []
    compactions: list[float] = []
    phases: list[dict[str, float]] = []
    live = 0
    for batch, staged in enumerate(files, start=1):
        live += 1
        if compact_over is not None and live > compact_over:
            started = time.perf_counter()
            done = target.compact()
            compactions.append(time.perf_counter() - started)
            live = live - (done.files_removed - done.files_added if done else 0)
        spent: dict[str, float] = defaultdict(float)
        with _timed_calls(spent) if profile else _nothing():
            started = time.perf_counter()
            outcome = target.publish(
                app_id=APP_ID,
                batch_id=batch,
                files=[staged],
                schema=SCHEMA,
                metadata=_metadata(batch),
            )
            times.append(time.perf_counter() - started)
        if not outcome.published:
            raise RuntimeError(f"batch {batch} was not published")
        phases.append(dict(spent))
    wait_for_checkpoints()
    log = table_root / "_delta_log"
    checkpoints = sorted(int(p.name.split(".")[0]) for p in log.glob("*.checkpoint.parquet"))
    # table version v holds batch v (version 0 is the table's creation by batch 1's commit)
    at_checkpoint = {v for v in checkpoints if 1 <= v <= commits}
    tenth = max(1, commits // 10)
    result: dict[str, Any] = {
        "commits": commits,
        "tenth_medians_ms": [
            1000 * statistics.median(times[i : i + tenth]) for i in range(0, commits, tenth)
        ],
        "checkpoint_versions": checkpoints,
        "checkpoint_median_ms": (
            1000 * statistics.median([times[v - 1] for v in at_checkpoint])
            if at_checkpoint
            else None
        ),
        "other_median_ms": 1000
        * statistics.median(t for i, t in enumerate(times, 1) if i not in at_checkpoint),
        "seconds": times,
        "compact_over": compact_over,
        "compactions": len(compactions),
        "compaction_median_ms": 1000 * statistics.median(compactions) if compactions else None,
    }
    if profile:
        labels = sorted({label for p in phases for label in p})
        result["profile_tenth_medians_ms"] = {
            label: [
                1000 * statistics.median(p.get(label, 0.0) for p in phases[i : i + tenth])
                for i in range(0, commits, tenth)
            ]
            for label in labels
        }
        result["profile_checkpoint_medians_ms"] = {
            label: 1000 * statistics.median(phases[v - 1].get(label, 0.0) for v in at_checkpoint)
            for label in labels
            if at_checkpoint
        }
    return result


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--commits", type=int, default=1000)
    parser.add_argument("--profile", action="store_true", help="time delta-rs's calls too")
    parser.add_argument("--label", default="", help="printed before the figures")
    parser.add_argument("--json-out", type=Path, help="also write every figure as JSON here")
    parser.add_argument(
        "--compact-over", type=int, help="compact between commits past this many files"
    )
    parser.add_argument(
        "--checkpoint-in-commit",
        action="store_true",
        help="checkpoints inside the commits, as before issue 31",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="exactly-commit-history-") as tmp:
        result = run(
            Path(tmp), args.commits, args.profile, args.compact_over, args.checkpoint_in_commit
        )
    tenths = " ".join(f"{m:.0f}" for m in result["tenth_medians_ms"])
    checkpoint = result["checkpoint_median_ms"]
    print(
        f"{args.label}median commit per tenth, ms: {tenths}; "
        f"checkpointing commits {checkpoint:.0f} ms (median), others "
        f"{result['other_median_ms']:.0f} ms"
        if checkpoint is not None
        else f"{args.label}median commit per tenth, ms: {tenths}",
        flush=True,
    )
    if result["compactions"]:
        print(
            f"{args.label}{result['compactions']} compactions between commits, "
            f"{result['compaction_median_ms']:.0f} ms each (median)",
            flush=True,
        )
    for label, medians in result.get("profile_tenth_medians_ms", {}).items():
        at = result["profile_checkpoint_medians_ms"].get(label)
        print(
            f"  {label:<24} per tenth, ms: {' '.join(f'{m:.1f}' for m in medians)}"
            + (f"; at checkpoints {at:.1f}" if at is not None else ""),
            flush=True,
        )
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
