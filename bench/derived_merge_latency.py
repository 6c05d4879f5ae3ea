"""How long a derived output's MERGE commit takes against an append, for a 100k-row partial.

    .venv/bin/python -m bench.derived_merge_latency [--rows 100000] [--repeat 3]

Local disk, no Spark: the partial is a pyarrow table, as the commit would read it from the
staged files. The commits timed, each on a table that already holds `table-rows` groups:
- publish: the raw table's commit (resources/delta/table.py DeltaTarget.publish) of a file
  already written, as the stage leaves it: what an append costs the commit;
- append: delta-rs write_deltalake in mode append with the app transaction (the publish
  plus writing the file);
- merge, half new: resources/delta/merge.py merge_aggregate of `rows` groups, half of them in the
  table (a MERGE rewrites every file holding a matched row: here the whole table);
- merge, tiny: a 100-row partial into the same table (the cost that does not scale with it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, Transaction, write_deltalake

from ledger.core.batch import StagedFile
from resources.config.derived_spec import AggregateOutput, parse_output
from resources.delta.merge import merge_aggregate
from resources.delta.stats import delta_stats
from resources.delta.table import DeltaTarget


def partial(first: int, rows: int) -> pa.Table:
    keys = pa.array([f"k{i:09d}" for i in range(first, first + rows)])
    return pa.table(
        {
            "app": keys,
            "views": pa.array([1] * rows, pa.int64()),
            "bytes": pa.array(range(rows), pa.int64()),
            "largest": pa.array(range(rows), pa.int64()),
        }
    )


def spec(uri: str) -> AggregateOutput:
    out = parse_output(
        {
            "kind": "aggregate",
            "name": "bench",
            "table_uri": uri,
            "group_by": ["app"],
            "measures": [
                {"name": "views", "fn": "count"},
                {"name": "bytes", "fn": "sum", "column": "bytes"},
                {"name": "largest", "fn": "max", "column": "bytes"},
            ],
        }
    )
    assert isinstance(out, AggregateOutput)
    return out


def once(root: Path, rows: int, table_rows: int) -> dict[str, float]:
    times: dict[str, float] = {}
    base = partial(0, table_rows)
    batch = partial(table_rows - rows // 2, rows)
    uri = str(root / "publish")
    write_deltalake(uri, base)
    pq.write_table(batch, f"{uri}/staged.parquet")
    info = Path(f"{uri}/staged.parquet").stat()
    staged = StagedFile(
        "table",
        "staged.parquet",
        info.st_size,
        rows,
        int(info.st_mtime * 1000),
        json.dumps(delta_stats(pq.read_metadata(f"{uri}/staged.parquet"))),
    )
    done = DeltaTarget(uri).publish(
        app_id="bench", batch_id=2, files=[staged], schema=batch.schema, metadata={}
    )
    times["publish"] = done.seconds
    uri = str(root / "append")
    write_deltalake(uri, base)
    started = time.perf_counter()
    write_deltalake(
        uri,
        batch,
        mode="append",
        commit_properties=CommitProperties(
            app_transactions=[Transaction("bench", 2)], max_commit_retries=0
        ),
    )
    times["append"] = time.perf_counter() - started
    uri = str(root / "merge")
    s = spec(uri)
    target = DeltaTarget(uri)
    merge_aggregate(target, s, base, app_id="bench", batch_id=1)
    outcome = merge_aggregate(target, s, batch, app_id="bench", batch_id=2)
    times["merge, half new"] = outcome.seconds
    outcome = merge_aggregate(target, s, partial(0, 100), app_id="bench", batch_id=3)
    times["merge, 100 rows"] = outcome.seconds
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--table-rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    runs = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as root:
            runs.append(once(Path(root), args.rows, args.table_rows))
    for name in runs[0]:
        values = [r[name] for r in runs]
        each = ", ".join(f"{v:.3f}" for v in values)
        print(f"{name:>16}: median {statistics.median(values):.3f} s  ({each})")


if __name__ == "__main__":
    main()
