"""The publisher's replace path on real delta-rs tables, no Spark (jobs/publish/derived_outputs.py
`merge_replace`): live batches, then a replace batch published to a count+sum aggregate
and an upsert with tombstones; each output must equal its recomputation over the raw table
after it, also when the replace is published again after a crash that left one output
holding it, and when a live batch commits between two of the replace's outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from jobs.derived.invariants import (
    aggregate_differences,
    latest_records,
    recompute_aggregate,
    recompute_latest,
    upsert_differences,
)
from jobs.publish.delta_publisher import DeltaPublisher
from jobs.stage import parquet_files
from jobs.stage.staging import attempt_folder
from ledger.core.batch import Batch, BatchKind
from ledger.core.layout import QUARANTINE, TABLE, derived_target
from ledger.core.protocol import BatchState, OffsetRange
from resources.config.derived_spec import AggregateOutput, UpsertOutput, parse_output
from resources.delta.schema import encode_schema
from resources.delta.table import DeltaTarget
from tests.fixtures.batches import a_batch

TOPIC = "pv"
LIVE, BACKFILL = "pv", "pv.backfill"
RAW = pa.schema(
    [
        ("app", pa.string()),
        ("user", pa.string()),
        ("size", pa.int64()),
        ("_kafka_topic", pa.string()),
        ("_kafka_partition", pa.int32()),
        ("_kafka_offset", pa.int64()),
        ("_deleted", pa.bool_()),
    ]
)


def rows(records: list[tuple[str | None, str, int | None, int, int, bool]]) -> pa.Table:
    """(app, user, size, partition, offset, tombstone) rows."""
    return pa.table(
        {
            "app": [r[0] for r in records],
            "user": [r[1] for r in records],
            "size": [r[2] for r in records],
            "_kafka_topic": [TOPIC] * len(records),
            "_kafka_partition": [r[3] for r in records],
            "_kafka_offset": [r[4] for r in records],
            "_deleted": [r[5] for r in records],
        },
        schema=RAW,
    )


def specs(root: Path) -> tuple[AggregateOutput, UpsertOutput]:
    agg = parse_output(
        {
            "kind": "aggregate",
            "name": "views",
            "table_uri": str(root / "views"),
            "group_by": ["app"],
            "measures": [
                {"name": "views", "fn": "count"},
                {"name": "bytes", "fn": "sum", "column": "size"},
            ],
        }
    )
    ups = parse_output(
        {"kind": "upsert", "name": "users", "table_uri": str(root / "users"), "key": ["user"]}
    )
    assert isinstance(agg, AggregateOutput) and isinstance(ups, UpsertOutput)
    return agg, ups


def write(root: str, target: str, b: Batch, table: pa.Table) -> list[Any]:
    folder = attempt_folder(root, b.app_id, b.batch_id, b.attempt, b.token)
    Path(folder).mkdir(parents=True, exist_ok=True)
    pq.write_table(table, f"{folder}/part-0.parquet")
    return parquet_files.describe(folder, root, target)


def staged(
    publisher: DeltaPublisher, app_id: str, batch_id: int, ranges: list[OffsetRange],
    new: pa.Table, mode: str | None = None,
) -> tuple[Batch, list[Any]]:  # fmt: skip
    """A voted batch: its raw rows and each output's partial (the stand-ins for Spark's:
    the check's own recomputation), as files in their attempt folders."""
    b = a_batch(batch_id, BatchState.PREPARED, app_id=app_id, pipeline=LIVE, ranges=tuple(ranges))
    agg, ups = (spec for spec, _d in publisher.derived)
    partials = {agg.name: recompute_aggregate(new, agg), ups.name: latest_records(new, ups)}
    files = write(publisher.table.uri, TABLE, b, new)
    schemas = {TABLE: encode_schema(RAW), QUARANTINE: encode_schema(RAW)}
    for spec, delta in publisher.derived:
        files += write(delta.uri, derived_target(spec.name), b, partials[spec.name])
        schemas[derived_target(spec.name)] = encode_schema(partials[spec.name].schema)
    params = {"mode": mode} if mode else {}
    kind = BatchKind.BACKFILL if mode else BatchKind.LIVE
    return Batch(**{**b.__dict__, "schemas": schemas, "params": params, "kind": kind}), files


def assert_match(publisher: DeltaPublisher) -> None:
    raw = DeltaTable(publisher.table.uri).to_pyarrow_table()
    agg, ups = (spec for spec, _d in publisher.derived)
    views = DeltaTable(agg.table_uri).to_pyarrow_table()
    assert aggregate_differences(recompute_aggregate(raw, agg), views, agg) == []
    users = DeltaTable(ups.table_uri).to_pyarrow_table()
    assert upsert_differences(recompute_latest(raw, ups), users, ups) == []


def publisher_with_history(tmp_path: Path) -> DeltaPublisher:
    agg, ups = specs(tmp_path / "derived")
    publisher = DeltaPublisher(
        DeltaTarget(str(tmp_path / "table")),
        DeltaTarget(str(tmp_path / "quarantine")),
        [(agg, DeltaTarget(agg.table_uri)), (ups, DeltaTarget(ups.table_uri))],
    )
    first = rows(
        [
            ("a", "u1", 10, 0, 0, False),
            ("b", "u2", 5, 0, 1, False),
            ("b", "u3", 7, 0, 2, False),
            (None, "u2", None, 0, 3, True),  # u2 deleted
            ("a", "u4", 1, 0, 4, False),
        ]
    )
    second = rows([("c", "u1", 2, 0, 5, False), ("a", "u5", 4, 0, 6, False)])
    for batch_id, (new, rng) in enumerate([(first, (0, 5)), (second, (5, 7))], start=1):
        b, files = staged(publisher, LIVE, batch_id, [OffsetRange(TOPIC, 0, *rng)], new)
        assert publisher.publish(b, files).published
    assert_match(publisher)
    return publisher


#: the replace of offsets [1, 5): b loses both rows (group gone), u3 loses its only record
#: (key gone), u2's tombstone becomes a record, e and u6 appear
REPLACED = [OffsetRange(TOPIC, 0, 1, 5)]
NEW = rows(
    [
        ("E", "u2", 3, 0, 1, False),
        ("E", "u6", 8, 0, 2, False),
        ("a", "u2", 1, 0, 3, False),
        (None, "u4", None, 0, 4, True),
    ]
)


def test_a_replace_batch_corrects_the_aggregate_and_rebuilds_the_upsert_keys(
    tmp_path: Path,
) -> None:
    publisher = publisher_with_history(tmp_path)
    b, files = staged(publisher, BACKFILL, 1, REPLACED, NEW, mode="replace")
    result = publisher.publish(b, files)
    assert result.published
    assert_match(publisher)
    apps = DeltaTable(publisher.derived[0][0].table_uri).to_pyarrow_table()["app"].to_pylist()
    assert "b" not in apps and "E" in apps
    # published again (a re-drive): every output skips by its own app transaction
    again = publisher.publish(b, files)
    assert not again.published
    assert all(not m["applied"] for m in again.metrics["derived"].values())
    assert_match(publisher)


def test_a_replace_redriven_after_a_crash_between_its_outputs_applies_the_same_correction(
    tmp_path: Path,
) -> None:
    """The aggregate took the replace, the process died; a live batch commits to every
    output; the re-drive corrects the upsert and replaces the raw rows: all match."""
    publisher = publisher_with_history(tmp_path)
    b, files = staged(publisher, BACKFILL, 1, REPLACED, NEW, mode="replace")
    agg, ups = (spec for spec, _d in publisher.derived)
    by_target = {
        derived_target(agg.name): [f for f in files if f.target == derived_target(agg.name)]
    }
    outcome = publisher._merge(
        b, agg, publisher.derived[0][1], by_target[derived_target(agg.name)], {},
        [f for f in files if f.target == TABLE],
    )  # fmt: skip
    assert outcome.applied
    live = rows([("b", "u3", 9, 0, 7, False), ("a", "u6", 1, 0, 8, False)])
    l3, lfiles = staged(publisher, LIVE, 3, [OffsetRange(TOPIC, 0, 7, 9)], live)
    assert publisher.publish(l3, lfiles).published
    result = publisher.publish(b, files)
    assert result.published
    assert not result.metrics["derived"][agg.name]["applied"]
    assert result.metrics["derived"][ups.name]["applied"]
    assert_match(publisher)
