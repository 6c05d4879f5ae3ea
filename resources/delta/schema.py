"""The schemas a Delta table holds: a staged schema's text form, and the rules by which a
batch's schema may change a table's (invariant 14) or its protocol's features.

Their own module because three writers apply the same rules: the stage's check before the
vote, the commit that widens the table (resources/delta/commit.py), and a derived output's
MERGE (resources/delta/merge.py), which refuses what the raw table would widen.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, TableFeatures
from deltalake import Field as DeltaField
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError
from deltalake.schema import ArrayType, MapType, StructType

from ledger.core.errors import RefusedBatchError


def encode_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def decode_schema(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


# -- schema changes (invariant 14) ---------------------------------------------------------

#: Types a table can hold only once its protocol has the named writer feature. A widening
#: commit does not add features, so a new column of such a type is refused instead.
_FEATURE_OF_TYPE = {"timestamp_ntz": "timestampNtz"}


def delta_type_name(dtype: Any) -> str:
    """A Delta type as an operator reads it: `long`, `array<string>`, `struct<a:int not null>`.

    Complex types spell out every nested name and nullability, so two types are the same
    exactly when their names are, and an error never shows two equal-looking types.
    """
    if isinstance(dtype, ArrayType):
        return f"array<{_nested(dtype.element_type, dtype.contains_null)}>"
    if isinstance(dtype, MapType):
        key, value = delta_type_name(dtype.key_type), dtype.value_type
        return f"map<{key},{_nested(value, dtype.value_contains_null)}>"
    if isinstance(dtype, StructType):
        fields = ",".join(f"{f.name}:{_nested(f.type, f.nullable)}" for f in dtype.fields)
        return f"struct<{fields}>"
    return str(getattr(dtype, "type", dtype))


def _nested(dtype: Any, nullable: bool) -> str:
    return delta_type_name(dtype) + ("" if nullable else " not null")


def _primitive_names(dtype: Any) -> set[str]:
    if isinstance(dtype, ArrayType):
        return _primitive_names(dtype.element_type)
    if isinstance(dtype, MapType):
        return _primitive_names(dtype.key_type) | _primitive_names(dtype.value_type)
    if isinstance(dtype, StructType):
        return set().union(*(_primitive_names(f.type) for f in dtype.fields))
    return {str(getattr(dtype, "type", dtype))}


def widen_schema(
    table_schema: DeltaSchema,
    batch_schema: pa.Schema,
    *,
    where: str,
    table_features: Iterable[str] = (),
) -> DeltaSchema | None:
    """The schema a batch's commit must carry: None if the batch fits the table as it is,
    else the table's columns followed by the batch's new ones, all nullable.

    Invariant 14. Compatible: every column the batch shares with the table has the table's
    type; a table column the batch lacks is nullable (its new rows read as null); a new
    column is added as nullable (the table's older rows read it as null). Anything else is
    refused with RefusedBatchError naming every offending column and both types: a type
    change (nested ones included), a NOT NULL column the batch lacks or may fill with
    nulls, a name that differs from a table column only in case (Delta column names are
    case-insensitive), a new column whose type needs a table feature the table lacks.
    """
    try:
        batch = DeltaSchema.from_arrow(batch_schema)
    except Exception as exc:  # delta-rs raises a bare Exception, e.g. for duplicate names
        raise RefusedBatchError(
            f"{where}: the batch's schema is not a valid Delta schema (invariant 14): {exc}"
        ) from exc
    table_fields = {f.name: f for f in table_schema.fields}
    by_lower = {name.lower(): name for name in table_fields}
    features = set(table_features)
    problems: list[str] = []
    added: list[DeltaField] = []
    for field in batch.fields:
        batch_type = delta_type_name(field.type)
        known = table_fields.get(field.name)
        if known is None:
            twin = by_lower.get(field.name.lower())
            lacking = sorted(
                feature
                for name, feature in _FEATURE_OF_TYPE.items()
                if name in _primitive_names(field.type) and feature not in features
            )
            if twin is not None:
                problems.append(
                    f"column {field.name}: the table has {twin} "
                    "(Delta column names are case-insensitive)"
                )
            elif lacking:
                problems.append(
                    f"column {field.name}: new {batch_type} column needs the table feature(s) "
                    f"{', '.join(lacking)}, which the table does not have"
                )
            else:
                added.append(DeltaField(field.name, field.type, nullable=True))
            continue
        table_type = delta_type_name(known.type)
        if table_type != batch_type:
            problems.append(
                f"column {field.name}: the table has {table_type}, the batch has {batch_type}"
            )
        elif not known.nullable and field.nullable:
            problems.append(
                f"column {field.name}: NOT NULL {table_type} in the table, nullable in the batch"
            )
    batch_names = {f.name.lower() for f in batch.fields}
    for known in table_schema.fields:
        if known.name.lower() not in batch_names and not known.nullable:
            problems.append(
                f"column {known.name}: NOT NULL {delta_type_name(known.type)} in the table, "
                "missing from the batch"
            )
    if problems:
        raise RefusedBatchError(
            f"{where}: the batch's schema is incompatible with the table's "
            f"(invariant 14): {'; '.join(problems)}"
        )
    if not added:
        return None
    return DeltaSchema([*table_schema.fields, *added])


def table_widened(table: DeltaTable, schema: pa.Schema, uri: str) -> DeltaSchema | None:
    """`widen_schema` against `table`'s schema and writer features."""
    features = table.protocol().writer_features or ()
    return widen_schema(table.schema(), schema, where=f"Delta table {uri}", table_features=features)


#: What protocol writer version 2 implies, named once a table has writer version 7.
_LEGACY_WRITER_FEATURES = ("invariants", "appendOnly")


def with_legacy_features(table: DeltaTable) -> None:
    """Name `invariants` and `appendOnly` in the protocol of a table delta-rs created at
    writer version 7 without them.

    delta-rs 1.6 creates a table with a timestamp_ntz column at writer version 7 with the
    single feature timestampNtz, dropping what writer version 2 implied; delta-spark then
    refuses to read the table at all (DELTA_FEATURES_PROTOCOL_METADATA_MISMATCH: every
    NOT NULL column, the coordinates included, is an invariant). delta-spark names both
    when it upgrades a table itself. Called right after the create, by every creator: a
    second creator's concurrent commit only makes this one fail, and then the features are
    there. A table created without them before this fix is left as it is: its repair is a
    commit of its own, delta-rs's `DeltaTable.alter.add_feature` with these two."""
    protocol = table.protocol()
    if protocol.min_writer_version < 7:
        return
    have = set(protocol.writer_features or ())
    if all(f in have for f in _LEGACY_WRITER_FEATURES):
        return
    try:
        table.alter.add_feature(
            [TableFeatures.Invariants, TableFeatures.AppendOnly],
            allow_protocol_versions_increase=True,
        )
    except CommitFailedError:
        table.update_incremental()
        have = set(table.protocol().writer_features or ())
        if not all(f in have for f in _LEGACY_WRITER_FEATURES):
            raise
