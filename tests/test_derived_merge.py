"""resources/delta/merge.py on real delta-rs tables: a batch's partial is applied once, whatever
re-drives or races it, and an upsert never lets an older record win.

No fakes: every table here is a real Delta table on disk, and the race is two real writers
committing the same batch. The tests that break the version check on purpose show the
others can fail.
"""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from jobs.derived.invariants import (
    aggregate_differences,
    latest_records,
    live_rows,
    recompute_aggregate,
    recompute_latest,
    upsert_differences,
)
from ledger.core.errors import RefusedBatchError
from resources.config.derived_spec import AggregateOutput, UpsertOutput, parse_output
from resources.delta.merge import merge_aggregate, merge_upsert
from resources.delta.table import DeltaTarget

APP = "pageviews.derived.views"


def aggregate_spec(uri: str, window: bool = False) -> AggregateOutput:
    spec = parse_output(
        {
            "kind": "aggregate",
            "name": "views",
            "table_uri": uri,
            "group_by": ["app"],
            "measures": [
                {"name": "views", "fn": "count"},
                {"name": "bytes", "fn": "sum", "column": "size"},
                {"name": "smallest", "fn": "min", "column": "size"},
                {"name": "largest", "fn": "max", "column": "size"},
            ],
            **({"window": {"column": "ts", "size": "1 minute"}} if window else {}),
        }
    )
    assert isinstance(spec, AggregateOutput)
    return spec


def upsert_spec(uri: str) -> UpsertOutput:
    spec = parse_output({"kind": "upsert", "name": "users", "table_uri": uri, "key": ["user"]})
    assert isinstance(spec, UpsertOutput)
    return spec


T0 = dt.datetime(2026, 11, 25, 12, 0, tzinfo=dt.UTC)


def raw(rows: list[tuple[str | None, int | None, int]], first_offset: int = 0) -> pa.Table:
    """Raw table rows: (app, size, second after T0), one partition, consecutive offsets."""
    return pa.table(
        {
            "app": pa.array([r[0] for r in rows], pa.string()),
            "size": pa.array([r[1] for r in rows], pa.int64()),
            "ts": pa.array(
                [T0 + dt.timedelta(seconds=r[2]) for r in rows], pa.timestamp("us", "UTC")
            ),
            "_kafka_partition": pa.array([0] * len(rows), pa.int32()),
            "_kafka_offset": pa.array(range(first_offset, first_offset + len(rows)), pa.int64()),
        }
    )


def table_rows(uri: str, keys: list[str]) -> list[dict[str, Any]]:
    rows = DeltaTable(uri).to_pyarrow_table().to_pylist()
    return sorted(rows, key=lambda r: tuple((r[k] is not None, r[k]) for k in keys))


BATCH_1 = raw([("a", 10, 1), ("a", 30, 2), ("b", 5, 70), (None, 7, 80), ("c", None, 90)])
BATCH_2 = raw([("a", 1, 3), ("b", None, 75), (None, 2, 130), ("c", None, 140), ("d", 4, 5)], 5)


def test_batches_add_up_and_a_redriven_batch_adds_nothing(tmp_path: Path) -> None:
    uri = str(tmp_path / "views")
    spec = aggregate_spec(uri)
    target = DeltaTarget(uri)
    first = merge_aggregate(
        target, spec, recompute_aggregate(BATCH_1, spec), app_id=APP, batch_id=1
    )
    second = merge_aggregate(
        target, spec, recompute_aggregate(BATCH_2, spec), app_id=APP, batch_id=2
    )
    assert first.applied and second.applied
    assert second.metrics["num_target_rows_updated"] == 4  # a, b, c and the null app
    assert second.metrics["num_target_rows_inserted"] == 1  # d
    after_two = table_rows(uri, ["app"])
    assert after_two == [
        {"app": None, "views": 2, "bytes": 9, "smallest": 2, "largest": 7},
        {"app": "a", "views": 3, "bytes": 41, "smallest": 1, "largest": 30},
        {"app": "b", "views": 2, "bytes": 5, "smallest": 5, "largest": 5},
        {"app": "c", "views": 2, "bytes": None, "smallest": None, "largest": None},
        {"app": "d", "views": 1, "bytes": 4, "smallest": 4, "largest": 4},
    ]
    again = merge_aggregate(
        target, spec, recompute_aggregate(BATCH_2, spec), app_id=APP, batch_id=2
    )
    older = merge_aggregate(
        target, spec, recompute_aggregate(BATCH_1, spec), app_id=APP, batch_id=1
    )
    assert not again.applied and not older.applied
    assert again.table_version == older.table_version == second.table_version
    assert table_rows(uri, ["app"]) == after_two
    everything = pa.concat_tables([BATCH_1, BATCH_2])
    actual = DeltaTable(uri).to_pyarrow_table()
    assert aggregate_differences(recompute_aggregate(everything, spec), actual, spec) == []
    # each output is idempotent by its own app id: another output's app id applies again
    other = merge_aggregate(
        target, spec, recompute_aggregate(BATCH_2, spec), app_id=APP + "2", batch_id=2
    )
    assert other.applied
    assert (
        aggregate_differences(
            recompute_aggregate(everything, spec), DeltaTable(uri).to_pyarrow_table(), spec
        )
        != []
    )


def test_without_the_version_check_a_redriven_batch_doubles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above can fail: with the table's app version hidden, re-driving batch 2
    adds its counts a second time, and the invariant helper says so."""
    uri = str(tmp_path / "views")
    spec = aggregate_spec(uri)
    target = DeltaTarget(uri)
    merge_aggregate(target, spec, recompute_aggregate(BATCH_1, spec), app_id=APP, batch_id=1)
    merge_aggregate(target, spec, recompute_aggregate(BATCH_2, spec), app_id=APP, batch_id=2)
    monkeypatch.setattr(DeltaTable, "transaction_version", lambda self, app_id: None)
    # a new process's target: this one saw batch 2 and refuses a table that went back
    # (resources/delta/held.py), the version hidden or not
    again = merge_aggregate(
        DeltaTarget(uri), spec, recompute_aggregate(BATCH_2, spec), app_id=APP, batch_id=2
    )
    assert again.applied
    counts = {r["app"]: r["views"] for r in table_rows(uri, ["app"])}
    assert counts["d"] == 2
    differences = aggregate_differences(
        recompute_aggregate(pa.concat_tables([BATCH_1, BATCH_2]), spec),
        DeltaTable(uri).to_pyarrow_table(),
        spec,
    )
    assert "group {'app': 'd'}: views is 2, recomputed 1" in differences


def test_windowed_aggregate_of_partials_equals_the_recomputation(tmp_path: Path) -> None:
    uri = str(tmp_path / "views")
    spec = aggregate_spec(uri, window=True)
    target = DeltaTarget(uri)
    batches = [BATCH_1, BATCH_2, raw([("a", 3, 59), ("a", 4, 60), ("b", 8, 179)], 10)]
    for batch_id, batch in enumerate(batches, start=1):
        merge_aggregate(
            target, spec, recompute_aggregate(batch, spec), app_id=APP, batch_id=batch_id
        )
    actual = DeltaTable(uri).to_pyarrow_table()
    expected = recompute_aggregate(pa.concat_tables(batches), spec)
    assert aggregate_differences(expected, actual, spec) == []
    a_windows = sorted(
        (r["window_start"].minute, r["views"]) for r in actual.to_pylist() if r["app"] == "a"
    )
    assert a_windows == [(0, 4), (1, 1)]  # seconds 1, 2, 3, 59 and then 60


def test_a_partial_of_another_type_is_refused(tmp_path: Path) -> None:
    uri = str(tmp_path / "views")
    spec = aggregate_spec(uri)
    target = DeltaTarget(uri)
    partial = recompute_aggregate(BATCH_1, spec)
    merge_aggregate(target, spec, partial, app_id=APP, batch_id=1)
    narrowed = partial.set_column(1, "views", partial["views"].cast(pa.int32()))
    with pytest.raises(RefusedBatchError, match="column views: the table has long"):
        merge_aggregate(target, spec, narrowed, app_id=APP, batch_id=2)
    widened = partial.append_column("extra", pa.array([1] * partial.num_rows))
    with pytest.raises(RefusedBatchError, match="new column"):
        merge_aggregate(target, spec, widened, app_id=APP, batch_id=2)


def first_tries_meet(wait: Any) -> Any:
    """A `before_commit` hook that holds the first try of each of two writers at `wait` (a
    barrier) and lets every later try (a retry goes on alone) through."""
    lock = threading.Lock()
    calls = 0

    def hook() -> None:
        nonlocal calls
        with lock:
            calls += 1
            first = calls <= 2
        if first:
            wait()

    return hook


def race(uri: str, apply: Any) -> list[Any]:
    """Two writers, each with its own DeltaTarget, apply the same batch: both read the
    table's version before either commits (a barrier), so both MERGE."""
    barrier = threading.Barrier(2, timeout=30)
    results: list[Any] = [None, None]
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        try:
            results[i] = apply(DeltaTarget(uri), barrier.wait)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return results


def test_two_writers_racing_one_batch_add_it_once(tmp_path: Path) -> None:
    uri = str(tmp_path / "views")
    spec = aggregate_spec(uri)
    DeltaTarget(uri).ensure_table(recompute_aggregate(BATCH_1, spec).schema)
    merge_aggregate(
        DeltaTarget(uri), spec, recompute_aggregate(BATCH_1, spec), app_id=APP, batch_id=1
    )
    partial = recompute_aggregate(BATCH_2, spec)
    hooks: dict[str, Any] = {}

    def apply(target: DeltaTarget, wait: Any) -> Any:
        hook = hooks.setdefault("hook", first_tries_meet(wait))
        return merge_aggregate(target, spec, partial, app_id=APP, batch_id=2, before_commit=hook)

    outcomes = race(uri, apply)
    assert sorted(o.applied for o in outcomes) == [False, True]
    loser = next(o for o in outcomes if not o.applied)
    assert loser.tries == 2  # it lost the race (CommitFailedError), re-read, and stopped
    expected = recompute_aggregate(pa.concat_tables([BATCH_1, BATCH_2]), spec)
    assert aggregate_differences(expected, DeltaTable(uri).to_pyarrow_table(), spec) == []
    assert DeltaTable(uri).transaction_version(APP) == 2


def users(rows: list[tuple[str | None, str | None, int, int, bool]]) -> pa.Table:
    """An upsert partial: (user, name, partition, offset, deleted)."""
    return pa.table(
        {
            "user": pa.array([r[0] for r in rows], pa.string()),
            "name": pa.array([r[1] for r in rows], pa.string()),
            "_kafka_partition": pa.array([r[2] for r in rows], pa.int32()),
            "_kafka_offset": pa.array([r[3] for r in rows], pa.int64()),
            "_deleted": pa.array([r[4] for r in rows], pa.bool_()),
        }
    )


def names(uri: str) -> dict[str | None, tuple[str | None, int, int]]:
    """The upsert table's live rows, as a reader sees them."""
    return {
        r["user"]: (r["name"], r["_kafka_partition"], r["_kafka_offset"])
        for r in live_rows(DeltaTable(uri).to_pyarrow_table()).to_pylist()
    }


def tombstone_rows(uri: str) -> dict[str | None, tuple[int, int]]:
    """The upsert table's tombstone rows: key -> the tombstone's coordinates."""
    return {
        r["user"]: (r["_kafka_partition"], r["_kafka_offset"])
        for r in DeltaTable(uri).to_pyarrow_table().to_pylist()
        if r["_deleted"]
    }


def test_an_older_record_never_overwrites_a_newer_one(tmp_path: Path) -> None:
    uri = str(tmp_path / "users")
    spec = upsert_spec(uri)
    target = DeltaTarget(uri)
    app = "pageviews.derived.users"
    merge_upsert(
        target,
        spec,
        users([("u1", "Ann", 0, 10, False), ("u2", "Bob", 1, 4, False), (None, "?", 0, 11, False)]),
        app_id=app,
        batch_id=1,
    )
    # batch 2 carries older records of u1 and u2 (a fill backfill of earlier offsets, say),
    # a newer one for the null key, and a new key
    second = merge_upsert(
        target,
        spec,
        users(
            [
                ("u1", "Old Ann", 0, 3, False),
                ("u2", "Old Bob", 0, 900, False),  # lower partition: older by the order
                (None, "!", 0, 12, False),
                ("u3", "Cy", 2, 1, False),
            ]
        ),
        app_id=app,
        batch_id=2,
    )
    assert second.metrics["num_target_rows_updated"] == 1
    assert second.metrics["num_target_rows_inserted"] == 1
    assert names(uri) == {
        "u1": ("Ann", 0, 10),
        "u2": ("Bob", 1, 4),
        None: ("!", 0, 12),
        "u3": ("Cy", 2, 1),
    }
    merge_upsert(target, spec, users([("u1", "Ann B.", 0, 20, False)]), app_id=app, batch_id=3)
    assert names(uri)["u1"] == ("Ann B.", 0, 20)
    # the same record applied again under a new batch id changes nothing either
    merge_upsert(target, spec, users([("u1", "Ann C.", 0, 20, False)]), app_id=app, batch_id=4)
    assert names(uri)["u1"] == ("Ann B.", 0, 20)


def test_a_tombstone_deletes_its_key_only_when_newer(tmp_path: Path) -> None:
    """A newer tombstone takes its key out of the live rows and stays as a row with its
    coordinates (so older records cannot come back, next test), an older one changes
    nothing, and one for a key never seen is kept too."""
    uri = str(tmp_path / "users")
    spec = upsert_spec(uri)
    target = DeltaTarget(uri)
    app = "pageviews.derived.users"
    merge_upsert(
        target,
        spec,
        users([("u1", "Ann", 0, 10, False), ("u2", "Bob", 0, 11, False)]),
        app_id=app,
        batch_id=1,
    )
    assert set(DeltaTable(uri).schema().to_arrow().names) == {
        "user", "name", "_kafka_partition", "_kafka_offset", "_deleted"
    }  # fmt: skip
    outcome = merge_upsert(
        target,
        spec,
        users(
            [
                ("u1", None, 0, 12, True),  # deletes u1
                ("u2", None, 0, 5, True),  # older than Bob: ignored
                ("u9", None, 0, 13, True),  # a key never seen: kept as a tombstone row
            ]
        ),
        app_id=app,
        batch_id=2,
    )
    assert outcome.metrics["num_target_rows_updated"] == 1  # u1 becomes a tombstone row
    assert outcome.metrics["num_target_rows_inserted"] == 1  # u9's tombstone
    assert outcome.metrics["num_target_rows_deleted"] == 0
    assert names(uri) == {"u2": ("Bob", 0, 11)}
    assert tombstone_rows(uri) == {"u1": (0, 12), "u9": (0, 13)}
    again = merge_upsert(target, spec, users([("u1", "Ann", 0, 10, False)]), app_id=app, batch_id=2)
    assert not again.applied
    assert names(uri) == {"u2": ("Bob", 0, 11)}


def test_two_writers_racing_one_upsert_batch_apply_it_once(tmp_path: Path) -> None:
    uri = str(tmp_path / "users")
    spec = upsert_spec(uri)
    app = "pageviews.derived.users"
    merge_upsert(
        DeltaTarget(uri), spec, users([("u1", "Ann", 0, 1, False)]), app_id=app, batch_id=1
    )
    partial = users([("u1", None, 0, 2, True), ("u2", "Bob", 0, 3, False)])
    hooks: dict[str, Any] = {}

    def apply(target: DeltaTarget, wait: Any) -> Any:
        hook = hooks.setdefault("hook", first_tries_meet(wait))
        return merge_upsert(target, spec, partial, app_id=app, batch_id=2, before_commit=hook)

    outcomes = race(uri, apply)
    assert sorted(o.applied for o in outcomes) == [False, True]
    assert names(uri) == {"u2": ("Bob", 0, 3)}
    assert tombstone_rows(uri) == {"u1": (0, 2)}
    history = DeltaTable(uri).history()
    merges = [h for h in history if h.get("operation") == "MERGE"]
    assert len(merges) == 2  # batch 1 and one of the two writers of batch 2


def test_a_batch_that_changes_no_row_is_recorded_all_the_same(tmp_path: Path) -> None:
    """delta-rs commits nothing for a MERGE that changes no row; the batch's app transaction
    must land all the same, or the output would never show it holds the batch."""
    uri = str(tmp_path / "views")
    spec = aggregate_spec(uri)
    target = DeltaTarget(uri)
    partial = recompute_aggregate(BATCH_1, spec)
    merge_aggregate(target, spec, partial, app_id=APP, batch_id=1)
    empty = merge_aggregate(target, spec, partial.slice(0, 0), app_id=APP, batch_id=2)
    assert empty.applied and empty.table_version == 2
    assert DeltaTable(uri).transaction_version(APP) == 2
    assert not merge_aggregate(target, spec, partial, app_id=APP, batch_id=2).applied

    uri = str(tmp_path / "users")
    users_spec = upsert_spec(uri)
    target = DeltaTarget(uri)
    app = "pageviews.derived.users"
    record = users([("u1", "Ann", 0, 10, False)])
    merge_upsert(target, users_spec, record, app_id=app, batch_id=1)
    stale = merge_upsert(target, users_spec, record, app_id=app, batch_id=2)
    assert stale.applied
    assert DeltaTable(uri).transaction_version(app) == 2
    assert DeltaTable(uri).history(1)[0]["operation"] == "WRITE"


def test_a_fill_of_older_offsets_never_brings_a_deleted_key_back(tmp_path: Path) -> None:
    """A fill backfill commits offsets older than what the table holds, after it: its
    records must lose against a newer tombstone exactly as against a newer record, also for
    a key whose only record before the fill was the tombstone."""
    uri = str(tmp_path / "users")
    spec = upsert_spec(uri)
    target = DeltaTarget(uri)
    app = "pageviews.derived.users"
    batches = [
        users([("u1", "Ann", 0, 10, False), ("u2", "Bob", 0, 11, False)]),
        users([("u1", None, 0, 12, True), ("u9", None, 0, 13, True)]),  # u9 never seen
        # the fill, of offsets [0, 6): older records of u1 and u9, and a new key
        users(
            [
                ("u1", "Old Ann", 0, 3, False),
                ("u9", "Nine", 0, 4, False),
                ("u7", "Gil", 0, 5, False),
            ]
        ),
    ]
    for batch_id, raw_rows in enumerate(batches, start=1):
        merge_upsert(target, spec, latest_records(raw_rows, spec), app_id=app, batch_id=batch_id)
    expected = recompute_latest(pa.concat_tables(batches), spec)
    assert sorted(expected["user"].to_pylist()) == ["u2", "u7"]
    actual = DeltaTable(uri).to_pyarrow_table()
    assert upsert_differences(expected, actual, spec) == []
    # and the whole table, tombstone rows included, is every key's latest raw row
    whole = latest_records(pa.concat_tables(batches), spec)
    assert sorted(actual.to_pylist(), key=str) == sorted(whole.to_pylist(), key=str)
    assert tombstone_rows(uri) == {"u1": (0, 12), "u9": (0, 13)}
