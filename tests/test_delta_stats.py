"""Delta statistics from Parquet footers (resources/delta/stats.py `delta_stats`, `stats_json`),
on files pyarrow writes: the shapes Spark's files take that matter here (decimals stored as
INT32/INT64, struct fields) and the ones Arrow's writer adds (a max that leaves NaN out).
tests/test_types.py checks the same against Spark's files end to end."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.stage import parquet_files
from resources.delta.stats import delta_stats, nan_columns, stats_json


def _written(tmp_path: Path, table: pa.Table, **options: Any) -> pq.FileMetaData:
    path = tmp_path / "part-0.parquet"
    pq.write_table(table, path, **options)
    return pq.read_metadata(path)


def test_decimals_stored_as_integers_get_exact_bounds(tmp_path: Path) -> None:
    """Spark stores decimal(<=9) as INT32 and decimal(<=18) as INT64; pyarrow 22 raised on
    their statistics (issue 28). Bounds are the exact decimals, written with every digit."""
    table = pa.table(
        {
            "d9": pa.array([Decimal("-9999999.99"), None, Decimal("12.50")], pa.decimal128(9, 2)),
            "d18": pa.array(
                [Decimal("99999999999999.9999"), Decimal("0.0001"), None], pa.decimal128(18, 4)
            ),
            "d38": pa.array(
                [Decimal("-9999999999999999999999999999.9999999999"), None, Decimal("1")],
                pa.decimal128(38, 10),
            ),
        }
    )
    meta = _written(tmp_path, table, store_decimal_as_integer=True)
    assert meta.schema.column(0).physical_type == "INT32"
    assert meta.schema.column(1).physical_type == "INT64"
    text = stats_json(delta_stats(meta, nan=set()))
    stats = json.loads(text, parse_float=Decimal)
    assert stats["minValues"] == {
        "d9": Decimal("-9999999.99"),
        "d18": Decimal("0.0001"),
        "d38": Decimal("-9999999999999999999999999999.9999999999"),
    }
    assert stats["maxValues"]["d18"] == Decimal("99999999999999.9999")
    assert '"d38":-9999999999999999999999999999.9999999999' in text
    assert stats["nullCount"] == {"d9": 1, "d18": 1, "d38": 1}


def test_a_float_column_holding_nan_or_infinity_has_no_bounds(tmp_path: Path) -> None:
    """Arrow's writer leaves NaN out of a footer's min/max: the footer says max 2.0 for a
    file holding NaN, which Spark orders above every number. Such a column gets no bounds,
    nor one holding an infinity (not JSON); its null count stays."""
    table = pa.table(
        {
            "with_nan": pa.array([1.0, float("nan"), 2.0, None]),
            "with_inf": pa.array([1.0, float("inf"), 2.0, 3.0]),
            "finite": pa.array([1.5, -2.5, None, 0.0], pa.float32()),
        }
    )
    meta = _written(tmp_path, table)
    assert meta.row_group(0).column(0).statistics.max == 2.0  # NaN left out
    stats = json.loads(stats_json(delta_stats(meta, nan=nan_columns(table))))
    assert stats["minValues"] == {"finite": -2.5}
    assert stats["maxValues"] == {"finite": 1.5}
    assert stats["nullCount"] == {"with_nan": 1, "with_inf": 0, "finite": 1}
    unknown = delta_stats(meta)  # nobody looked for NaN: no float is trusted
    assert unknown["minValues"] == {} and unknown["maxValues"] == {}


def test_struct_fields_are_nested_and_arrays_and_maps_left_out(tmp_path: Path) -> None:
    table = pa.table(
        {
            "point": pa.array(
                [{"x": 1, "label": "é"}, None, {"x": -3, "label": None}],
                pa.struct([("x", pa.int64()), ("label", pa.string())]),
            ),
            "tags": pa.array([["a"], None, []], pa.list_(pa.string())),
            "attrs": pa.array([[("k", 1)], None, []], pa.map_(pa.string(), pa.int64())),
        }
    )
    stats = delta_stats(_written(tmp_path, table), nan=set())
    assert stats["minValues"] == {"point": {"x": -3, "label": "é"}}
    assert stats["maxValues"] == {"point": {"x": 1, "label": "é"}}
    assert stats["nullCount"] == {"point": {"x": 1, "label": 2}}


def test_timestamps_with_and_without_zone_dates_and_limits(tmp_path: Path) -> None:
    """A zoned timestamp in UTC with a Z, a timestamp_ntz with no zone (delta-spark cannot
    parse one with a zone), to the microsecond, from before 1970 to year 9999."""
    table = pa.table(
        {
            "ts": pa.array(
                [
                    datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
                    datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
                ],
                pa.timestamp("us", tz="UTC"),
            ),
            "ntz": pa.array(
                [datetime(1900, 1, 1), datetime(9999, 12, 31, 23, 59, 59, 999999)],
                pa.timestamp("us"),
            ),
            "day": pa.array([date(1900, 1, 1), date(9999, 12, 31)]),
            "text": ["東京 🚀", "x" * 65],
            "blob": [b"\x00", b"\xff"],
        }
    )
    stats = json.loads(stats_json(delta_stats(_written(tmp_path, table), nan=set())))
    assert stats["minValues"] == {
        "ts": "1969-12-31T23:59:59.999999Z",
        "ntz": "1900-01-01T00:00:00.000000",
        "day": "1900-01-01",
    }  # text: a max over 64 characters is left out, and so the min; binary has none
    assert stats["maxValues"]["ts"] == "9999-12-31T23:59:59.999999Z"
    assert stats["maxValues"]["ntz"] == "9999-12-31T23:59:59.999999"
    assert set(stats["nullCount"]) == {"ts", "ntz", "day", "text", "blob"}


def test_a_row_group_without_a_null_count_or_bounds_gives_none(tmp_path: Path) -> None:
    """A footer that cannot vouch for a count or a bound must not claim one: a null count of
    0 read as 'no nulls' lets an IS NULL filter skip the file."""
    table = pa.table({"a": pa.array([1, None, 3]), "b": pa.array([1, 2, 3])})
    meta = _written(tmp_path, table, write_statistics=["b"])
    stats = delta_stats(meta, nan=set())
    assert "a" not in stats["nullCount"] and "a" not in stats["minValues"]
    assert stats["minValues"] == {"b": 1}


def test_describe_reads_the_float_columns_for_nan(tmp_path: Path) -> None:
    """The vote's description (jobs/stage/parquet_files.py) looks into a staged file's float
    columns, and only those of the table's `columns`."""
    table = pa.table({"x": [1.0, float("nan")], "y": [1.0, 2.0], "n": [1, 2]})
    pq.write_table(table, tmp_path / "part-0.parquet")
    (described,) = parquet_files.describe(str(tmp_path), str(tmp_path), "table")
    stats = json.loads(described.stats)
    assert stats["minValues"] == {"y": 1.0, "n": 1}
    (only,) = parquet_files.describe(str(tmp_path), str(tmp_path), "table", ["n"])
    assert json.loads(only.stats)["minValues"] == {"n": 1}


def test_stats_json_refuses_what_json_cannot_hold() -> None:
    with pytest.raises(ValueError):
        stats_json({"minValues": {"x": float("nan")}})
    assert stats_json({"a": Decimal("1E+3"), "b": Decimal("-0.00")}) == '{"a":1000,"b":-0.00}'
