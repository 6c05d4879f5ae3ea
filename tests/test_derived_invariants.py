"""jobs/derived/invariants.py for upsert outputs: the latest record per key recomputed from raw
rows (pyarrow only), and the comparison that names every key where a table differs.

Pure pyarrow: the raw rows are built explicitly, so what "latest" means is written out here
row by row rather than recomputed the same way the code does it.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from jobs.derived.invariants import latest_records, live_rows, recompute_latest, upsert_differences
from ledger.core.errors import ConfigError
from resources.config.derived_spec import UpsertOutput, parse_output


def upsert_spec() -> UpsertOutput:
    spec = parse_output({"kind": "upsert", "name": "users", "table_uri": "/x", "key": ["user"]})
    assert isinstance(spec, UpsertOutput)
    return spec


Row = tuple[str | None, str | None, int, int, bool]


def raw_rows(rows: list[Row]) -> pa.Table:
    """Raw table rows (user, name, partition, offset, deleted), with their topic."""
    return pa.table(
        {
            "user": pa.array([r[0] for r in rows], pa.string()),
            "name": pa.array([r[1] for r in rows], pa.string()),
            "_kafka_topic": pa.array(["users"] * len(rows), pa.string()),
            "_kafka_partition": pa.array([r[2] for r in rows], pa.int32()),
            "_kafka_offset": pa.array([r[3] for r in rows], pa.int64()),
            "_deleted": pa.array([r[4] for r in rows], pa.bool_()),
        }
    )


def by_user(table: pa.Table) -> dict[str | None, tuple[str | None, int, int]]:
    return {
        r["user"]: (r["name"], r["_kafka_partition"], r["_kafka_offset"]) for r in table.to_pylist()
    }


RAW = raw_rows(
    [
        ("u1", "Ann", 0, 9, False),  # the latest of u1, though not the last row
        ("u1", "Old Ann", 0, 3, False),
        ("u2", "Bob", 1, 2, False),  # a higher partition wins over any offset of partition 0
        ("u2", "Bob in p0", 0, 50, False),
        ("u3", "Cy", 0, 4, False),
        ("u3", None, 0, 5, True),  # tombstone: u3 is gone
        ("u4", None, 0, 6, True),  # tombstone, then a new record
        ("u4", "Di", 0, 7, False),
        (None, "nobody", 0, 1, False),  # a null key is one key
        (None, "nobody yet", 0, 8, False),
        ("u5", None, 1, 1, True),  # a tombstone for a key never seen
    ]
)


def test_latest_record_per_key_by_partition_then_offset_tombstones_applied() -> None:
    latest = recompute_latest(RAW, upsert_spec())
    assert "_deleted" not in latest.column_names
    assert by_user(latest) == {
        "u1": ("Ann", 0, 9),
        "u2": ("Bob", 1, 2),
        "u4": ("Di", 0, 7),
        None: ("nobody yet", 0, 8),
    }
    assert latest.num_rows == 4
    # with tombstones: every key's latest, flagged
    flagged = {r["user"]: r["_deleted"] for r in latest_records(RAW, upsert_spec()).to_pylist()}
    assert flagged == {"u1": False, "u2": False, "u3": True, "u4": False, None: False, "u5": True}


def test_stage_rows_use_the_kafka_value_and_leave_quarantined_rows_out() -> None:
    rows = pa.table(
        {
            "user": ["u1", "u1", "u2", "u2"],
            "name": ["Ann", "Bad", "Bob", None],
            "_kafka_partition": pa.array([0, 0, 0, 0], pa.int32()),
            "_kafka_offset": pa.array([1, 2, 3, 4], pa.int64()),
            "value": pa.array([b"{}", b"!", b"{}", None], pa.binary()),
            "_error": [None, "value is not valid JSON", None, None],
        }
    )
    latest = recompute_latest(rows, upsert_spec())
    assert by_user(latest) == {"u1": ("Ann", 0, 1)}  # u2's latest is a tombstone
    assert set(latest.column_names) == {"user", "name", "_kafka_partition", "_kafka_offset"}
    with pytest.raises(ConfigError, match="neither `value` nor `_deleted`"):
        recompute_latest(rows.drop_columns(["value"]), upsert_spec())


def test_differences_name_every_key_that_differs() -> None:
    spec = upsert_spec()
    expected = recompute_latest(RAW, spec)
    table = latest_records(RAW, spec)  # a table keeping its tombstone rows
    assert upsert_differences(expected, table, spec) == []
    assert upsert_differences(expected, live_rows(table), spec) == []
    wrong = raw_rows(
        [
            ("u1", "Ann", 0, 3, False),  # right value, wrong record
            ("u2", "Robert", 1, 2, False),
            ("u3", "Cy", 0, 4, False),  # deleted in the raw rows
            ("u5", None, 1, 1, True),  # a tombstone row: not live, not compared
            (None, "nobody yet", 0, 8, False),
        ]
    )
    assert upsert_differences(expected, wrong, spec) == [
        "key {'user': 'u1'}: _kafka_offset is 3, recomputed 9",
        "key {'user': 'u2'}: name is 'Robert', recomputed 'Bob'",
        "key {'user': 'u3'}: in the derived table, absent or deleted in the raw rows",
        "key {'user': 'u4'}: missing from the derived table",
    ]
    doubled = pa.concat_tables([table, table.filter(pc.field("user") == "u1")])
    assert upsert_differences(expected, doubled, spec) == [
        "key {'user': 'u1'}: twice in the derived table"
    ]
