"""Which columns delta-rs writes no statistics for when it writes files itself
(resources/delta/writer_stats.py): the decimals stored as byte arrays, whose bounds it
would write as floats, wherever they sit in the schema. On real tables: tests/test_types.py
`test_compaction_writes_sound_statistics` and
`test_the_aggregates_decimal_statistics_hold_its_rows`."""

from __future__ import annotations

import decimal
import json
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from resources.delta.writer_stats import sound_writer_properties, wide_decimals

SCHEMA = pa.schema(
    [
        ("dec9", pa.decimal128(9, 2)),
        ("dec18", pa.decimal128(18, 4)),
        ("dec19", pa.decimal128(19, 0)),
        ("dec38", pa.decimal128(38, 10)),
        ("amount", pa.float64()),
        ("order", pa.struct([("total", pa.decimal128(30, 2)), ("n", pa.int64())])),
        ("lines", pa.list_(pa.decimal128(38, 2))),
    ]
)


def test_only_decimals_wider_than_a_long_lose_their_statistics_nested_ones_too() -> None:
    assert list(wide_decimals(SCHEMA)) == ["dec19", "dec38", "order.total"]
    assert sound_writer_properties(pa.schema([("n", pa.int64()), ("d", pa.decimal128(20, 2))]))
    assert sound_writer_properties(pa.schema([("d", pa.decimal128(18, 2))])) is None


def _last_stats(uri: Path) -> dict:
    commit = sorted((uri / "_delta_log").glob("*.json"))[-1]
    adds = [json.loads(line)["add"] for line in commit.read_text().splitlines() if '"add"' in line]
    (add,) = adds
    return json.loads(add["stats"])


def test_a_compaction_with_a_wide_decimal_in_a_struct_keeps_only_sound_bounds(
    tmp_path: Path,
) -> None:
    """delta-rs reaches a column's settings by its top-level name only: a struct's wide
    decimal turns statistics off but for the plain top-level columns."""
    uri = tmp_path / "t"
    low = decimal.Decimal("-9999999999999999999999999999.9999999999")
    for i in range(2):
        row = {"s": [{"d": low, "k": 3}], "x": [decimal.Decimal("1.5")], "n": [i]}
        schema = pa.schema(
            [
                ("s", pa.struct([("d", pa.decimal128(38, 10)), ("k", pa.int64())])),
                ("x", pa.decimal128(38, 10)),
                ("n", pa.int64()),
            ]
        )
        write_deltalake(uri, pa.table(row, schema=schema), mode="append")
    table = DeltaTable(uri)
    table.optimize.compact(writer_properties=sound_writer_properties(table.schema().to_arrow()))
    stats = _last_stats(uri)
    assert stats["minValues"] == {"n": 0} and stats["maxValues"] == {"n": 1}
