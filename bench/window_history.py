"""What a batch's MERGE into a windowed aggregate costs as the table's history grows (issue
31, item 5), with and without the predicate naming its partitions, side by side.

    .venv/bin/python -m bench.window_history [--days 30,180,365] [--groups 2000] [--repeat 3]

Local disk, no Spark, real delta-rs: an aggregate per app and one-minute window, partitioned
by the window's day (`partition_by` of a windowed aggregate), holding `days` days of
`groups` groups each, one file per day as a day's compaction leaves it. Then the batch: a
partial of `groups` groups of the last day, half of them in the table, merged by
resources/delta/merge.py `merge_aggregate` as the publish does, first as it is (the MERGE
names the batch's partitions: resources/delta/window_dates.py `held_partitions`), then with
the keys only, as before (each on a copy of the same table). Printed: the MERGE's seconds
and delta-rs's scan milliseconds (medians of `repeat`). Not its file counts: with the keys
only, delta-rs 1.x reports every file "skipped during scan" and none scanned, although it
reads them (its scan time grows with the days).
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import statistics
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import write_deltalake

from resources.config.derived_spec import AggregateOutput
from resources.delta import merge
from resources.delta.merge import merge_aggregate
from resources.delta.table import DeltaTarget
from resources.delta.window_dates import with_window_dates

FIRST_DAY = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
KIND = pa.timestamp("us", tz="UTC")


def spec(uri: str) -> AggregateOutput:
    return AggregateOutput.model_validate(
        {
            "kind": "aggregate",
            "name": "per_minute",
            "table_uri": uri,
            "group_by": ["app"],
            "window": {"column": "ts", "size": "1 minute"},
            "measures": [{"name": "views", "fn": "count"}],
            "partition_by": [
                {"name": "window_date", "date_of": "window_start", "time_zone": "UTC"}
            ],
        }
    )


def day_partial(day: int, groups: int, first_group: int = 0) -> pa.Table:
    """`groups` groups of day `day`: app `a<n>` in minute n % 1440 of the day."""
    base = FIRST_DAY + dt.timedelta(days=day)
    numbers = range(first_group, first_group + groups)
    starts = [base + dt.timedelta(minutes=n % 1440) for n in numbers]
    return pa.table(
        {
            "app": [f"a{n}" for n in numbers],
            "window_start": pa.array(starts, KIND),
            "window_end": pa.array([s + dt.timedelta(minutes=1) for s in starts], KIND),
            "views": pa.array([1] * groups, pa.int64()),
        }
    )


def history(uri: str, days: int, groups: int) -> AggregateOutput:
    """The table with `days` days of `groups` groups, a file per day."""
    out = spec(uri)
    for day in range(days):
        rows = with_window_dates(day_partial(day, groups), out.partition_by)
        write_deltalake(uri, rows, mode="append", partition_by=["window_date"])
    return out


@contextmanager
def keys_only() -> Iterator[None]:
    """The MERGE as it was before issue 31: its predicate names the keys only."""
    before = merge.held_partitions
    merge.held_partitions = lambda *_args: None  # type: ignore[assignment]
    try:
        yield
    finally:
        merge.held_partitions = before


def one_merge(
    uri: str, out: AggregateOutput, days: int, groups: int, batch_id: int
) -> dict[str, Any]:
    batch = day_partial(days - 1, groups, first_group=groups // 2)
    done = merge_aggregate(DeltaTarget(uri), out, batch, app_id="bench", batch_id=batch_id)
    return {"seconds": done.seconds, "scan_ms": done.metrics.get("scan_time_ms")}


def measure(root: Path, days: int, groups: int, repeat: int) -> dict[str, Any]:
    built = str(root / f"history-{days}")
    out = history(built, days, groups)
    figures: dict[str, list[dict[str, Any]]] = {"partitions named": [], "keys only": []}
    for rep in range(repeat):
        for label in figures:
            uri = str(root / f"copy-{days}-{rep}-{label.replace(' ', '-')}")
            shutil.copytree(built, uri)
            if label == "keys only":
                with keys_only():
                    figures[label].append(one_merge(uri, out, days, groups, 1))
            else:
                figures[label].append(one_merge(uri, out, days, groups, 1))
            shutil.rmtree(uri)
    return {
        label: {
            "seconds": statistics.median(r["seconds"] for r in runs),
            "scan_ms": statistics.median(r["scan_ms"] for r in runs),
        }
        for label, runs in figures.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--days", default="30,180,365")
    parser.add_argument("--groups", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"days  table rows  {'partitions named':>20}  {'keys only':>20}  keys only / named")
    with tempfile.TemporaryDirectory() as root:
        for days in (int(d) for d in args.days.split(",")):
            found = measure(Path(root), days, args.groups, args.repeat)
            named, keys = found["partitions named"], found["keys only"]
            cells = [f"{f['seconds']:.3f} s, scan {f['scan_ms']:>4} ms" for f in (named, keys)]
            ratio = keys["seconds"] / named["seconds"]
            rows = f"{days * args.groups:>10,}"
            print(f"{days:>4}  {rows}  {cells[0]:>20}  {cells[1]:>20}  {ratio:.2f}x")


if __name__ == "__main__":
    main()
