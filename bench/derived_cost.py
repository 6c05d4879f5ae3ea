"""What the demo's derived outputs cost a pipeline (issue 31, item 1): the same records read
by the same pipeline with and without them, side by side in one run.

    .venv/bin/python -m bench.derived_cost [--records 1000000] [--rounds 3]

One embedded broker, one topic of page views on 8 partitions, one warm Spark session, batches
of 100k records through the CLI path (bench/product.py `run_cli_path`). Three contenders,
run in turn in every round, each on fresh tables and ledger:

- `raw`: the table and the quarantine only;
- `derived`: plus two aggregates (per app; per app and minute, partitioned by the window's
  day, as the demo's) and an upsert (latest record per user, 10,000 users), the partials
  computed as the stage computes them (jobs/stage/staged_partials.py: in Arrow where
  Arrow's answer is Spark's);
- `derived-spark`: the same outputs with every partial computed by a Spark job reading the
  staged files back, as the stage did before (`partials_from_files` made to decline).

Printed: each contender's whole-run seconds per round, the medians over the rounds after the
first (a warm-up), the ratios against `raw` (the target is at most 1.15x) and the mean stage
and commit seconds per 100k batch.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from bench import product
from bench.data import produce
from resources.config.loading import load_config

CONTENDERS = ("raw", "derived", "derived-whole-upsert", "derived-spark")
DERIVED: list[dict[str, Any]] = [
    {"kind": "aggregate", "name": "views_per_app", "group_by": ["app"],
     "measures": [{"name": "views", "fn": "count"}]},
    {"kind": "aggregate", "name": "views_per_app_minute", "group_by": ["app"],
     "measures": [{"name": "views", "fn": "count"}],
     "window": {"column": "ts", "size": "1 minute"},
     "partition_by": [{"name": "window_date", "date_of": "window_start", "time_zone": "UTC"}]},
    {"kind": "upsert", "name": "latest_per_user", "key": ["user"]},
]  # fmt: skip


@contextlib.contextmanager
def _replaced(owner: Any, name: str, value: Any) -> Iterator[None]:
    """`owner.name` is `value` inside the block, as it was after."""
    kept = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, kept)


def spark_partials() -> contextlib.AbstractContextManager[None]:
    """Every partial computed by Spark, as before Arrow's (the stage's own fallback)."""
    from jobs.stage import staged_partials

    def declined(files: Any, outputs: Any, *args: Any, **kwargs: Any) -> list[None]:
        return [None] * len(outputs)

    return _replaced(staged_partials, "partials_from_files", declined)


def whole_upsert_partials() -> contextlib.AbstractContextManager[None]:
    """The upsert's MERGE given its whole partial, as before its pruning
    (resources/delta/upsert_pruning.py): the same outputs, side by side."""
    from resources.delta import merge

    def whole(table: Any, uri: str, partial: Any, *args: Any) -> Any:
        return partial

    return _replaced(merge, "pruned_partial", whole)


def run_one(spark: Any, root: Path, name: str, bootstrap: str, topic: str, records: int) -> Any:
    """One contender's run of the whole topic; its figures (bench/product.py)."""
    product.pipeline_config(root, name.replace("-", "_"), bootstrap, topic, 12_500)
    path = product.config_file(root)
    doc = yaml.safe_load(path.read_text())
    doc["transform"] = "jobs.examples.pageviews:transform"
    if name != "raw":
        doc["derived"] = [{**d, "table_uri": str(root / d["name"])} for d in DERIVED]
    path.write_text(yaml.safe_dump(doc))
    config = load_config(path)
    guards = {"derived-spark": spark_partials, "derived-whole-upsert": whole_upsert_partials}
    guard = guards.get(name, contextlib.nullcontext)()
    with guard:
        return product.run_cli_path(spark, config, expected_records=records)


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the rounds after the first, and the ratios against `raw`."""
    kept = rounds[1:] or rounds

    def median(name: str, figure: Callable[[dict[str, Any]], float]) -> float:
        return statistics.median(figure(r[name]) for r in kept)

    def per_batch(phase: str) -> Callable[[dict[str, Any]], float]:
        return lambda run: statistics.mean(b["phases"][phase] for b in run["batches"])

    out: dict[str, Any] = {}
    for name in CONTENDERS:
        out[name] = {
            "seconds": median(name, lambda run: run["seconds"]),
            "stage_per_batch": median(name, per_batch("stage")),
            "commit_per_batch": median(name, per_batch("commit")),
        }
    for name in CONTENDERS[1:]:
        out[f"{name}_over_raw"] = out[name]["seconds"] / out["raw"]["seconds"]
        # the same ratio within each round (its contenders ran one after the other), median
        out[f"{name}_over_raw_per_round"] = statistics.median(
            r[name]["seconds"] / r["raw"]["seconds"] for r in kept
        )
    return out


def compare(
    spark: Any,
    root: Path,
    bootstrap: str,
    topic: str,
    records: int,
    rounds: int,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every contender in turn, `rounds` times, over the `records` records of `topic` (8
    partitions, batches of 100k); the runs' figures and their summary."""
    found: list[dict[str, Any]] = []
    for r in range(rounds):
        this: dict[str, Any] = {}
        for name in CONTENDERS:
            folder = root / f"{name}-{r + 1}"
            this[name] = run_one(spark, folder, name, bootstrap, topic, records)
            log(f"bench: [derived] round {r + 1} {name}: {this[name]['seconds']:.1f} s")
            shutil.rmtree(folder, ignore_errors=True)
        found.append(this)
    summary = summarize(found)
    log(
        f"bench: [derived] with the demo's derived outputs: {summary['derived_over_raw']:.2f}x "
        f"the time without them (target <= 1.15x; {summary['derived_over_raw_per_round']:.2f}x "
        f"by the median of the rounds' own ratios); with the upsert's whole partial "
        f"{summary['derived-whole-upsert_over_raw']:.2f}x; with Spark partials "
        f"{summary['derived-spark_over_raw']:.2f}x"
    )
    return {"rounds": found, "summary": summary}


def main(argv: list[str] | None = None) -> None:
    from resources.jvm.process import free_port
    from resources.kafka.client import KafkaClient
    from resources.kafka.embedded_broker import EmbeddedBroker
    from resources.spark.session import build_session

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="exactly-derived-cost-"))
    broker = EmbeddedBroker(work / "kafka", port=free_port())
    try:
        bootstrap = broker.start(timeout=120)
        with KafkaClient(bootstrap, timeout=60) as client:
            produce(client, "views", records=args.records, partitions=8, record_bytes=500)
        spark = build_session("local[2]")
        result = compare(spark, work, bootstrap, "views", args.records, args.rounds)
        print(json.dumps(result["summary"], indent=1))
        if args.json_out:
            args.json_out.write_text(json.dumps(result, indent=1))
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
