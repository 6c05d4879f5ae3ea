"""Which statistics delta-rs may write when it writes data files itself (compaction, the
derived outputs' MERGE, a derived output's rebuild): only bounds that hold the file's rows.

delta-rs (1.6.6) turns the Parquet statistics of a decimal stored as a byte array
(precision over 18) into a float: decimal(38,10)'s -9999999999999999999999999999.9999999999
becomes -9.999999999999997e+27, above the rows' minimum, and a sum of decimal(18,4) is
rounded either way. A reader's data skipping would then skip a file that holds matching
rows (tests/test_types.py `test_compaction_writes_sound_statistics`,
`test_the_aggregates_decimal_statistics_hold_its_rows`). Those columns get no statistics:
no bound is sound, a wrong one loses rows. Every other column keeps its statistics. The
stage's files are not concerned: their statistics are computed exactly from the footers
(resources/delta/stats.py).

delta-rs matches a column's writer settings by its top-level name only (a dotted path does
not reach a struct's field), so a wide decimal inside a struct turns statistics off for
every column but the top-level ones that need none turned off: fewer bounds, none wrong.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from deltalake import ColumnProperties, WriterProperties

#: A decimal of this precision or more is stored as a fixed-size byte array in Parquet.
WIDE_DECIMAL = 19

_OFF = ColumnProperties(statistics_enabled="NONE")
_ON = ColumnProperties(statistics_enabled="PAGE")


def sound_writer_properties(schema: Any) -> WriterProperties | None:
    """Writer settings for delta-rs under which every bound it writes holds (module
    docstring); None when the schema holds no wide decimal (delta-rs's defaults then).
    `schema`: pyarrow's, or any Arrow schema (a DeltaTable's `schema().to_arrow()`)."""
    schema = schema if isinstance(schema, pa.Schema) else pa.schema(schema)
    wide = list(wide_decimals(schema))
    if not wide:
        return None
    if all("." not in path for path in wide):
        return WriterProperties(column_properties=dict.fromkeys(wide, _OFF))
    kept = [f.name for f in schema if not pa.types.is_nested(f.type) and f.name not in set(wide)]
    return WriterProperties(
        default_column_properties=_OFF, column_properties=dict.fromkeys(kept, _ON) or None
    )


def wide_decimals(schema: pa.Schema | pa.StructType, prefix: str = "") -> Iterator[str]:
    """The dotted paths of the decimal columns stored as byte arrays, in structs too
    (arrays and maps carry no Delta statistics)."""
    for field in schema:
        path = f"{prefix}{field.name}"
        if pa.types.is_struct(field.type):
            yield from wide_decimals(field.type, f"{path}.")
        elif pa.types.is_decimal(field.type) and field.type.precision >= WIDE_DECIMAL:
            yield path
