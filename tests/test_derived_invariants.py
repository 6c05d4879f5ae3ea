"""derived/invariants.py `recompute_latest`: what an upsert table must hold, from raw rows."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from derived.invariants import recompute_latest
from derived.spec import UpsertOutput

SPEC = UpsertOutput(kind="upsert", name="users", table_uri="t", key=["user"])


def rows(*items: tuple[str | None, str | None, int, int, bool]) -> pa.Table:
    return pa.table(
        {
            "user": [i[0] for i in items],
            "app": [i[1] for i in items],
            "_kafka_partition": pa.array([i[2] for i in items], pa.int32()),
            "_kafka_offset": pa.array([i[3] for i in items], pa.int64()),
            "_deleted": [i[4] for i in items],
        }
    )


def by_user(table: pa.Table) -> list[dict[str, Any]]:
    return sorted(table.to_pylist(), key=lambda r: (r["user"] is not None, r["user"]))


def test_the_latest_record_by_partition_and_offset_wins_whatever_the_row_order() -> None:
    raw = rows(
        ("a", "web", 0, 5, False),
        ("a", "ios", 0, 2, False),  # older, listed later
        ("b", "tv", 1, 1, False),
        ("b", "web", 0, 9, False),  # a lower partition loses, as derived/partials.py orders
        (None, "tv", 0, 1, False),
        (None, "ios", 0, 3, False),  # null keys are one key
    )
    assert by_user(recompute_latest(raw, SPEC)) == [
        {"user": None, "app": "ios", "_kafka_partition": 0, "_kafka_offset": 3},
        {"user": "a", "app": "web", "_kafka_partition": 0, "_kafka_offset": 5},
        {"user": "b", "app": "tv", "_kafka_partition": 1, "_kafka_offset": 1},
    ]


def test_a_later_tombstone_deletes_the_key_and_a_later_record_brings_it_back() -> None:
    raw = rows(
        ("a", "web", 0, 1, False),
        ("a", None, 0, 2, True),
        ("b", "web", 0, 3, False),
        ("b", None, 0, 4, True),
        ("b", "tv", 0, 5, False),
    )
    assert [r["user"] for r in by_user(recompute_latest(raw, SPEC))] == ["b"]
    assert "_deleted" not in recompute_latest(raw, SPEC).column_names


def test_quarantined_rows_and_null_values_on_the_stage_s_rows() -> None:
    raw = pa.table(
        {
            "user": ["a", "a", "b"],
            "_kafka_partition": pa.array([0, 0, 0], pa.int32()),
            "_kafka_offset": pa.array([1, 2, 3], pa.int64()),
            "value": [b"x", None, b"y"],
            "_error": [None, None, "bad"],
        }
    )
    assert recompute_latest(raw, SPEC).num_rows == 0
