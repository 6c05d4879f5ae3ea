"""resources/delta/window_dates.py and the MERGE of an aggregate partitioned by its window's date,
against real delta-rs (no Spark): the day is the declared zone's, and a config whose
partitioning is not the table's is refused before any row moves."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from ledger.core.errors import ConfigError, RefusedBatchError
from resources.config.derived_spec import AggregateOutput
from resources.delta.merge import merge_aggregate
from resources.delta.table import DeltaTarget
from resources.delta.window_dates import window_date

WINDOW_DATE = {"name": "window_date", "date_of": "window_start", "time_zone": "Europe/Paris"}


def spec(uri: str, partitioned: bool) -> AggregateOutput:
    return AggregateOutput.model_validate(
        {
            "kind": "aggregate",
            "name": "per_hour",
            "table_uri": uri,
            "group_by": ["app"],
            "window": {"column": "ts", "size": "1 hour"},
            "measures": [{"name": "views", "fn": "count"}],
            "partition_by": [WINDOW_DATE] if partitioned else [],
        }
    )


def partial(hour: int) -> pa.Table:
    start = datetime(2026, 3, 1, hour, tzinfo=UTC)
    kind = pa.timestamp("us", tz="UTC")
    return pa.table(
        {
            "app": ["web"],
            "window_start": pa.array([start], kind),
            "window_end": pa.array([start.replace(hour=hour + 1) if hour < 23 else start], kind),
            "views": pa.array([1], pa.int64()),
        }
    )


def test_the_window_date_is_the_declared_zones_day() -> None:
    kind = pa.timestamp("us", tz="UTC")
    starts = pa.array(
        [datetime(2026, 3, 1, 23, tzinfo=UTC), datetime(2026, 3, 1, 22, tzinfo=UTC), None], kind
    )
    assert window_date(starts, "Europe/Paris").to_pylist() == [
        date(2026, 3, 2),
        date(2026, 3, 1),
        None,
    ]
    assert window_date(starts, "UTC").to_pylist() == [date(2026, 3, 1), date(2026, 3, 1), None]


@pytest.mark.parametrize("first_partitioned", [True, False])
def test_a_merge_under_another_partitioning_than_the_tables_is_refused(
    tmp_path: Path, first_partitioned: bool
) -> None:
    uri = str(tmp_path / "per_hour")
    first = spec(uri, first_partitioned)
    target = DeltaTarget(uri, partition_by=first.partition_by, generated=False)
    assert merge_aggregate(target, first, partial(23), app_id="p", batch_id=1).applied
    version = DeltaTable(uri).version()

    other = spec(uri, not first_partitioned)
    # a partitioned config on an unpartitioned table brings a new column, which a derived
    # table refuses (invariant 14); the other way round, a partition column goes missing
    refused = RefusedBatchError if first_partitioned is False else ConfigError
    named = "window_date" if refused is RefusedBatchError else "derived.per_hour.partition_by"
    with pytest.raises(refused, match=named):
        merge_aggregate(
            DeltaTarget(uri, partition_by=other.partition_by, generated=False),
            other,
            partial(10),
            app_id="p",
            batch_id=2,
        )
    assert DeltaTable(uri).version() == version


def day_partial(day: int, apps: int, *, null_window: bool = False) -> pa.Table:
    """`apps` groups, one per app, in a window of 2026-03-(1 + day), UTC noon; with
    `null_window` one more group whose event time was null (Spark's window of null)."""
    start = datetime(2026, 3, 1 + day, 12, tzinfo=UTC)
    kind = pa.timestamp("us", tz="UTC")
    names = [f"app{i}" for i in range(apps)] + (["nowhen"] if null_window else [])
    starts = [start] * apps + ([None] if null_window else [])
    return pa.table(
        {
            "app": names,
            "window_start": pa.array(starts, kind),
            "window_end": pa.array(starts, kind),
            "views": pa.array([1] * len(names), pa.int64()),
        }
    )


def test_a_merge_reads_only_the_partitions_of_its_batch_s_windows(tmp_path: Path) -> None:
    """Issue 31, item 5: a batch's MERGE into a table partitioned by window date reads the
    files of its own windows' days, not the whole table's history (a predicate naming the
    partition column's values: delta-rs then skips every other partition's files). The
    counts are those of a MERGE over the whole table."""
    uri = str(tmp_path / "per_hour")
    partitioned = spec(uri, True)
    target = DeltaTarget(uri, partition_by=partitioned.partition_by, generated=False)
    for day in range(6):
        assert merge_aggregate(
            target, partitioned, day_partial(day, 50), app_id="p", batch_id=day + 1
        ).applied
    last = merge_aggregate(target, partitioned, day_partial(5, 50), app_id="p", batch_id=7)
    assert last.metrics["num_target_files_scanned"] == 1, last.metrics
    assert last.metrics["num_target_files_skipped_during_scan"] == 5, last.metrics
    rows = DeltaTable(uri).to_pyarrow_table().to_pylist()
    assert len(rows) == 6 * 50
    assert sorted({r["views"] for r in rows if r["window_date"] == date(2026, 3, 6)}) == [2]
    assert {r["views"] for r in rows if r["window_date"] != date(2026, 3, 6)} == {1}


def test_a_group_whose_window_is_null_is_still_one_row(tmp_path: Path) -> None:
    """Its partition value is null, which no `IN` list matches: the predicate names the null
    partition too, or every batch would insert the group again."""
    uri = str(tmp_path / "per_hour")
    partitioned = spec(uri, True)
    target = DeltaTarget(uri, partition_by=partitioned.partition_by, generated=False)
    for batch_id in (1, 2):
        partial = day_partial(0, 2, null_window=True)
        assert merge_aggregate(target, partitioned, partial, app_id="p", batch_id=batch_id).applied
    only_null = day_partial(0, 0, null_window=True)
    assert merge_aggregate(target, partitioned, only_null, app_id="p", batch_id=3).applied
    rows = {r["app"]: r["views"] for r in DeltaTable(uri).to_pyarrow_table().to_pylist()}
    assert rows == {"app0": 2, "app1": 2, "nowhen": 3}
