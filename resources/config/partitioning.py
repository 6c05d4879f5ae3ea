"""Partitioned data tables: `delta.partition_by`, one concern in one place.

A partition column is generated: the date of a timestamp column (an event time from the
transform, or `_kafka_timestamp`) in a declared time zone. Generated, not computed by a
transform, so the table itself says how each row's value is derived (Delta's
`delta.generationExpression` column metadata, writer version 4): delta-spark checks every
row another writer adds against it, and the Spark stage computes the value with that very
expression, so the two can never disagree.

The expression is independent of the Spark session's time zone on purpose: a
`CAST(ts AS DATE)` takes the session's zone, and a writer whose session is in another zone
would put the same instant in another partition. Ours shifts the instant into the declared
zone (`FROM_UTC_TIMESTAMP`, which depends on that zone only) and takes the day of the
shifted microseconds since the epoch.

Only the data table is partitioned: a quarantined record may have no event time at all.

Where a staged file belongs is said by its folder (`<name>=<value>/`, as Spark's
`partitionBy` writes it): the vote records the path and the commit derives each add
action's `partitionValues` from it (`partition_values`), so the ledger's file rows keep
their shape.
"""

from __future__ import annotations

import datetime as dt
import re
import zoneinfo
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from pydantic import field_validator, model_validator

from ledger.core.errors import ConfigError, InconsistencyError
from ledger.core.layout import ROUTE
from resources.config.strict import _Strict

#: The column metadata key that makes a Delta column generated (protocol: generatedColumns).
GENERATION_KEY = "delta.generationExpression"
#: What Spark writes as the folder of a null partition value; Delta's partition value null.
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
#: A partition column's name: a plain identifier that does not start with `_` (Spark's file
#: listing and ours skip `_`-prefixed folders as hidden, so its rows would never be voted).
_COLUMN = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,127}$")
#: A source column: any identifier, `_kafka_timestamp` included.
_SOURCE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
#: Names the stage gives columns of its own (ledger/core/layout.py ROUTE).
_TAKEN = frozenset({ROUTE})
_MICROS_PER_DAY = 86_400_000_000


class PartitionColumn(_Strict):
    """One partition column: `name`, the date of column `date_of` in `time_zone`."""

    name: str
    #: a timestamp column of the transform's output, or `_kafka_timestamp` (Kafka's own)
    date_of: str
    #: the IANA time zone whose calendar day the date is (default UTC)
    time_zone: str = "UTC"

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _COLUMN.match(value):
            raise ValueError(
                "must be letters, digits and '_', starting with a letter (a folder starting "
                "with '_' is hidden from file listings)"
            )
        if value.lower() in _TAKEN:
            raise ValueError(f"{value} is a column the stage adds itself")
        return value

    @field_validator("date_of")
    @classmethod
    def _source(cls, value: str) -> str:
        if not _SOURCE.match(value):
            raise ValueError("must be a column name (letters, digits and '_')")
        return value

    @field_validator("time_zone")
    @classmethod
    def _zone(cls, value: str) -> str:
        try:
            zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"{value!r} is not an IANA time zone (e.g. Europe/Paris)") from None
        return value

    @model_validator(mode="after")
    def _not_itself(self) -> PartitionColumn:
        if self.name.lower() == self.date_of.lower():
            raise ValueError(f"{self.name} cannot be the date of itself")
        return self


def check_unique(columns: Sequence[PartitionColumn]) -> None:
    """Two partition columns of one name (Delta names are case-insensitive) are refused."""
    seen: set[str] = set()
    for column in columns:
        if column.name.lower() in seen:
            raise ValueError(f"two partition columns are named {column.name!r}")
        seen.add(column.name.lower())


def generation_expression(column: PartitionColumn) -> str:
    """The Spark SQL expression of `column`'s value, stored as its generation expression.

    The day number of the instant's wall-clock time in the declared zone: independent of
    the session's time zone (module docstring). FLOOR keeps instants before 1970 right."""
    zone = column.time_zone.replace("'", "")
    shifted = f"UNIX_MICROS(FROM_UTC_TIMESTAMP(`{column.date_of}`, '{zone}'))"
    return f"DATE_FROM_UNIX_DATE(CAST(FLOOR({shifted} / {_MICROS_PER_DAY}) AS INT))"


def names(columns: Sequence[PartitionColumn]) -> list[str]:
    return [c.name for c in columns]


def generation_expressions(columns: Sequence[PartitionColumn]) -> dict[str, str]:
    """Each partition column's generation expression, by name."""
    return {c.name: generation_expression(c) for c in columns}


def with_generation(schema: pa.Schema, columns: Sequence[PartitionColumn]) -> pa.Schema:
    """`schema` with each partition column's generation expression in its field metadata,
    the schema a partitioned table is created with."""
    expressions = generation_expressions(columns)
    fields = []
    for field in schema:
        if field.name in expressions:
            meta = {**(field.metadata or {}), GENERATION_KEY.encode(): expressions[field.name]}
            field = field.with_metadata(meta)
        fields.append(field)
    return pa.schema(fields, metadata=schema.metadata)


def partition_values(path: str, columns: Sequence[str]) -> dict[str, str | None]:
    """The Delta `partitionValues` of a staged file, from its `<name>=<value>` folders.

    A file whose path lacks a folder for one of the table's partition columns is refused:
    it was staged for another layout (the config changed between the vote and the commit),
    and adding it with a guessed value would put its rows in the wrong partition.
    """
    folders = path.split("/")[:-1]
    # every `name=value` folder but the stage's routing one is a partition folder; they must
    # be the table's columns, in order: a file staged partitioned and added to a table that
    # is not would read its rows' partition values as null (the file does not hold them)
    named = [f.partition("=")[0] for f in folders if "=" in f and not f.startswith(f"{ROUTE}=")]
    if named != list(columns):
        raise InconsistencyError(
            f"staged file {path} has partition folders {named or 'none'}, but the table is "
            f"partitioned by {list(columns) or 'nothing'}: it was staged for another layout"
        )
    found: dict[str, str | None] = {}
    for column in columns:
        prefix = f"{column}="
        values = [f.removeprefix(prefix) for f in folders if f.startswith(prefix)]
        if len(values) != 1:
            raise InconsistencyError(
                f"staged file {path} has no single {column}=<value> folder, but the table is "
                f"partitioned by {', '.join(columns)}: it was staged for another layout"
            )
        found[column] = None if values[0] == HIVE_NULL else values[0]
    return found


def check_layout(
    uri: str,
    table_columns: Sequence[str],
    configured: Sequence[PartitionColumn] | None,
    field: str = "delta.partition_by",
    remedy: str = "give its own, or a new table_uri",
) -> None:
    """Refuse a table whose partition columns are not the config's (None: not said).

    Delta cannot re-partition a table in place, and files staged for one layout added to a
    table of another would file rows under the wrong (or no) partition: the operator must
    either give the table's layout or write a new table (`remedy` says which they can).
    """
    if configured is None:
        return
    wanted = names(configured)
    if list(table_columns) != wanted:
        raise ConfigError(
            f"{field}: the table at {uri} is partitioned by "
            f"{list(table_columns) or 'nothing'}, the config says {wanted or 'nothing'}; "
            f"an existing table keeps its partitioning: {remedy}"
        )


def delta_value(value: Any) -> str | None:
    """A partition value as Delta's `partitionValues` holds it: a date as `YYYY-MM-DD`,
    null as null (delta-rs hands typed values back)."""
    if value is None:
        return None
    if isinstance(value, dt.date):
        return value.isoformat()
    return str(value)


def entry_values(entry: Mapping[str, Any], columns: Sequence[str]) -> dict[str, str | None]:
    """The partition values of a flattened add action (`partition.<name>` keys)."""
    return {c: delta_value(entry.get(f"partition.{c}")) for c in columns}


def folders(values: Mapping[str, str | None]) -> str:
    """The `<name>=<value>/` folders a file of these partition values is written under, as
    Spark names them ('' for an unpartitioned table)."""
    return "".join(f"{k}={HIVE_NULL if v is None else v}/" for k, v in values.items())
