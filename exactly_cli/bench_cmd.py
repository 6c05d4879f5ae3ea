"""`exactly bench`: throughput, commit latency and per-batch cost against the alternatives.

The harness lives in the `bench` package; this module only turns arguments into its
Settings, prints the report and writes the JSON. The full run is a benchmark, not a test:
`--smoke` runs every section on tiny data so CI keeps the harness working.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any

from ledger.core.errors import ConfigError


def _batch_sizes(text: str) -> tuple[int | None, ...]:
    """'100000,1000000,all' -> (100000, 1000000, None)."""
    sizes: list[int | None] = []
    for part in text.split(","):
        part = part.strip().lower()
        if part == "all":
            sizes.append(None)
        elif part.isdigit() and int(part) > 0:
            sizes.append(int(part))
        else:
            raise argparse.ArgumentTypeError(f"{part!r} is neither a positive count nor 'all'")
    return tuple(sizes)


def _counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of counts") from None
    if any(c < 1 for c in counts):
        raise argparse.ArgumentTypeError(f"{text!r}: every count must be at least 1")
    return counts


def _spark_modes(text: str) -> tuple[str, ...]:
    from bench.daemon import spark_modes

    try:
        return spark_modes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(subparsers: Any) -> None:
    """Add `bench` to the top-level sub-command parsers."""
    parser = subparsers.add_parser(
        "bench",
        help="benchmark against Spark Structured Streaming and the machine's limits",
        description=(
            "Produce a page-view data set on an embedded broker, then measure this product "
            "(CLI path and Dagster run), Spark Structured Streaming (availableNow, Delta sink) "
            "and the machine's limits (raw consume, pyarrow Parquet write) in one run; "
            "print medians and ratios. Defaults are the full run of BENCHMARKS.md."
        ),
    )
    _add_run_arguments(parser)
    _add_freshness_arguments(parser)
    _add_section_arguments(parser)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny data (2,000 records), one repetition, 20-commit history: checks the harness",
    )
    parser.set_defaults(func=cmd_bench)


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The data set, the throughput repetitions, and where the run writes."""
    parser.add_argument("--records", type=int, help="records in the data set (default 2,000,000)")
    parser.add_argument("--partitions", type=int, help="topic partitions (default 8)")
    parser.add_argument("--record-bytes", type=int, help="size of a record (default 500)")
    parser.add_argument(
        "--batch-sizes",
        type=_batch_sizes,
        help="records per batch, comma-separated, 'all' = all at once (default 100000,1000000,all)",
    )
    parser.add_argument(
        "--dagster-batch", type=_batch_sizes, help="records per Dagster run (default 100000)"
    )
    parser.add_argument("--repeat", type=int, help="repetitions; medians are reported (default 3)")
    parser.add_argument(
        "--empty-batches", type=int, help="empty batches per variant per repetition (default 3)"
    )
    parser.add_argument(
        "--files", type=_counts, help="files per commit to time (default 10,100,1000)"
    )
    parser.add_argument("--history", type=int, help="commits in the history test (default 1000)")
    parser.add_argument("--spark-master", help="Spark master (default local[2], as pipelines)")
    parser.add_argument("--work-dir", type=Path, help="parent of the temporary folder")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--json-out", type=Path, help="also write every figure as JSON here")
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="write Spark's event log to DIR and print where each contender's Spark time "
        "goes (turns the event log on: use its figures to find costs, not to compare)",
    )


def _add_freshness_arguments(parser: argparse.ArgumentParser) -> None:
    """The freshness section: a steady feed, and how long each contender gets it."""
    parser.add_argument(
        "--freshness-rate", type=int, help="records/s of the freshness section (default 20000)"
    )
    parser.add_argument(
        "--freshness-seconds",
        type=float,
        help="how long each freshness contender is fed (default 180)",
    )
    parser.add_argument(
        "--freshness-interval",
        type=float,
        help="minimum seconds between batches / the processing-time trigger (default 1)",
    )
    parser.add_argument(
        "--freshness-only",
        action="store_true",
        help="run only the freshness section (no data set, no throughput repetitions)",
    )


def _add_section_arguments(parser: argparse.ArgumentParser) -> None:
    """One section alone (`--only`), and the scale and daemon sections' sizes."""
    parser.add_argument(
        "--scale-partitions",
        type=_counts,
        help="partition counts of the scale section's topics (default 8,64,256)",
    )
    parser.add_argument(
        "--scale-batch",
        type=int,
        help="records per batch in the scale section (default 100000)",
    )
    parser.add_argument(
        "--scale-pipelines",
        type=int,
        help="pipelines run at once in the scale section (default 4)",
    )
    parser.add_argument(
        "--only",
        choices=("scale", "daemon"),
        help="run only this section (scale: partitions and pipelines, on --records records; "
        "daemon: runs launched by the Dagster daemon, against the CLI path and an in-process run)",
    )
    parser.add_argument(
        "--daemon-runs", type=int, default=5, help="measured runs per daemon contender (default 5)"
    )
    parser.add_argument(
        "--daemon-batch",
        type=int,
        default=5000,
        help="records per daemon-section run (default 5000)",
    )
    parser.add_argument(
        "--daemon-spark",
        type=_spark_modes,
        default=("local", "shared"),
        help="Spark session modes of the daemon-launched runs, comma-separated: local (a JVM "
        "per run process), shared (the host's Spark Connect server) (default local,shared)",
    )


def settings_from(args: argparse.Namespace) -> Any:
    """The harness settings: the smoke or full defaults, overridden by what was given."""
    from bench.harness import SMOKE, Settings

    base = SMOKE if args.smoke else Settings()
    given = {
        "records": args.records,
        "partitions": args.partitions,
        "record_bytes": args.record_bytes,
        "batch_records": args.batch_sizes,
        "repeat": args.repeat,
        "empty_batches": args.empty_batches,
        "file_counts": args.files,
        "history": args.history,
        "spark_master": args.spark_master,
        "work_dir": args.work_dir,
        "profile_dir": args.profile,
        "freshness_rate": args.freshness_rate,
        "freshness_seconds": args.freshness_seconds,
        "freshness_interval": args.freshness_interval,
        "scale_partitions": args.scale_partitions,
        "scale_batch_records": args.scale_batch,
        "scale_pipelines": args.scale_pipelines,
    }
    changes = {k: v for k, v in given.items() if v is not None}
    if args.dagster_batch is not None:
        changes["dagster_batch_records"] = args.dagster_batch[0]  # None = all at once
    if args.keep:
        changes["keep"] = True
    settings = dataclasses.replace(base, **changes)
    for name in (
        "records",
        "partitions",
        "repeat",
        "history",
        "scale_batch_records",
        "scale_pipelines",
    ):
        if getattr(settings, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
    if settings.freshness_rate < 1 or settings.freshness_seconds <= 0:
        raise ConfigError("--freshness-rate and --freshness-seconds must be positive")
    if settings.freshness_interval < 0:
        raise ConfigError("--freshness-interval must be at least 0")
    if settings.empty_batches < 0:
        raise ConfigError("--empty-batches must be at least 0")
    if settings.work_dir is not None and not settings.work_dir.is_dir():
        # the run's temporary folder is made below it: say so before a broker starts
        raise ConfigError(f"--work-dir {settings.work_dir}: not a folder (create it first)")
    return settings


def refuse_unwritable(args: argparse.Namespace, settings: Any) -> None:
    """Every folder the run writes into must take files now, not after the hour a full run
    takes: the temporary folder's parent (--work-dir, else the system's), the figures'
    file (--json-out) and the event logs (--profile). Read-only, not writable by this
    user, or full: one line naming the flag and the folder, before a broker starts."""
    from resources.failures.causes import local_folder_problem

    if args.json_out is not None and args.json_out.is_dir():
        raise ConfigError(f"--json-out {args.json_out}: a folder; name the file to write")
    folders = {
        "--work-dir": settings.work_dir or Path(tempfile.gettempdir()),
        "--json-out": args.json_out.parent if args.json_out is not None else None,
        "--profile": settings.profile_dir,
    }
    for flag, folder in folders.items():
        problem = None if folder is None else local_folder_problem(str(folder))
        if problem is not None:
            raise ConfigError(
                f"{flag} {folder}: {problem}, and the run writes there: choose another "
                "folder, or make room or write access there first"
            )


def cmd_bench(args: argparse.Namespace) -> int:
    """Exit 1 if any contender failed: its figures are missing from the medians."""
    from bench.harness import run
    from bench.report import render

    settings = settings_from(args)
    refuse_unwritable(args, settings)
    if args.only == "scale":
        return _scale_only(settings, args.json_out)
    if args.only == "daemon":
        return _daemon_only(args, settings)
    if args.freshness_only:
        from bench.freshness import render as render_freshness
        from bench.harness import run_freshness_only

        result = run_freshness_only(settings, log=lambda line: print(line, flush=True))
        print("\n".join(render_freshness(result["freshness"])), flush=True)
        if args.json_out:
            _write_json(args.json_out, result)
        return 1 if result["failures"] else 0
    result = run(settings, log=lambda line: print(line, flush=True))
    print()
    print(render(result), flush=True)
    if "spark_profile" in result:
        from bench.spark_profile import render as render_profile

        print()
        print(render_profile(result["spark_profile"]), flush=True)
    if args.json_out:
        _write_json(args.json_out, result)
        print(f"\nbench: figures written to {args.json_out}")
    if result["failures"]:
        print(f"bench: {len(result['failures'])} contender run(s) failed; see FAILED above")
        return 1
    return 0


def _scale_only(settings: Any, json_out: Path | None) -> int:
    """`--only scale`: the scale section alone (its own broker and Spark session)."""
    from bench.harness import run_scale_only
    from bench.scale import render

    result = run_scale_only(settings, log=lambda line: print(line, flush=True))
    print("\n".join(render(result["scale"], result["scale_summary"])), flush=True)
    print(f"\ntotal run time {result['total_seconds'] / 60:.1f} min", flush=True)
    if json_out:
        _write_json(json_out, result)
    if result["failures"]:
        print(f"bench: {len(result['failures'])} contender run(s) failed: {result['failures']}")
        return 1
    return 0


def _daemon_only(args: argparse.Namespace, settings: Any) -> int:
    """`--only daemon`: runs launched by the Dagster daemon against the CLI path and an
    in-process run (bench/daemon.py), on a broker of its own."""
    from bench.daemon import DaemonSettings, render, run_daemon_only

    if args.daemon_runs < 1 or args.daemon_batch < 1:
        raise ConfigError("--daemon-runs and --daemon-batch must be at least 1")
    wanted = DaemonSettings(
        runs=args.daemon_runs,
        batch_records=args.daemon_batch,
        partitions=settings.partitions,
        record_bytes=settings.record_bytes,
        spark_modes=args.daemon_spark,
        spark_master=settings.spark_master,
    )
    result = run_daemon_only(
        wanted, settings.work_dir, settings.keep, log=lambda line: print(line, flush=True)
    )
    print("\n".join(render(result["daemon"], result["daemon_summary"])), flush=True)
    print(f"\ntotal run time {result['total_seconds'] / 60:.1f} min", flush=True)
    if args.json_out:
        _write_json(args.json_out, result)
        print(f"bench: figures written to {args.json_out}")
    if result["failures"]:
        print(f"bench: {len(result['failures'])} contender(s) failed: {result['failures']}")
        return 1
    return 0


def _write_json(path: Path, result: Any) -> None:
    """Every figure of a run, as JSON, in a folder created if missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
