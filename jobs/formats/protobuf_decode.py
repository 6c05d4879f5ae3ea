"""The transform of a `format: protobuf` pipeline (resources/config/formats.py): each Kafka value
parsed as the config's message type, each field of the message a column, every value that
does not parse kept for the quarantine with the reason (invariant 9).

Spark's own `from_protobuf` needs the spark-protobuf jar, which the Maven Central this
project reaches does not serve; so the values are parsed in Spark's Python workers
(`mapInArrow`) by the protobuf runtime, from the descriptor set the config compiled. The
transform contract is the same as any transform's (coordinates, `value`, `_error`), so the
quarantine, the coordinate check and the schema rules (invariant 14) are the stage's own.
On the Confluent wire (jobs/formats/protobuf_wire.py) each value's schema id picks its descriptor
set and its message indexes must name the config's message there.

Types: (s)int32/sfixed32 int, uint32/fixed32 and (s)int64/sfixed64 long, uint64/fixed64
decimal(20,0) (a long would overflow), float, double, bool, string, bytes; an enum its
value's name; a message a struct; google.protobuf.Timestamp a timestamp; repeated an array;
a map a map. A field with presence (proto2, proto3 `optional`, a message) that is not set is
null; a proto3 field without presence reads as its default, as protobuf itself does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC
from decimal import Decimal
from typing import Any

import pyarrow as pa
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from pyspark.sql import DataFrame
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from jobs.formats.avro_decode import taken_names
from jobs.formats.protobuf_wire import WireError, unframe
from jobs.stage.pandas_transform import CONTRACT
from ledger.core.errors import ConfigError
from resources.config.formats import FormatSettings
from resources.config.proto_schema import message_names

_TIMESTAMP = "google.protobuf.Timestamp"
_F = FieldDescriptor
_SCALARS: dict[int, T.DataType] = {
    _F.TYPE_INT32: T.IntegerType(),
    _F.TYPE_SINT32: T.IntegerType(),
    _F.TYPE_SFIXED32: T.IntegerType(),
    _F.TYPE_UINT32: T.LongType(),
    _F.TYPE_FIXED32: T.LongType(),
    _F.TYPE_INT64: T.LongType(),
    _F.TYPE_SINT64: T.LongType(),
    _F.TYPE_SFIXED64: T.LongType(),
    _F.TYPE_UINT64: T.DecimalType(20, 0),
    _F.TYPE_FIXED64: T.DecimalType(20, 0),
    _F.TYPE_FLOAT: T.FloatType(),
    _F.TYPE_DOUBLE: T.DoubleType(),
    _F.TYPE_BOOL: T.BooleanType(),
    _F.TYPE_STRING: T.StringType(),
    _F.TYPE_BYTES: T.BinaryType(),
    _F.TYPE_ENUM: T.StringType(),
}


@functools.lru_cache(maxsize=8)
def message_type(descriptor_set: bytes, name: str) -> Any:
    """The generated class of message `name`; cached per Python worker."""
    pool = descriptor_pool.DescriptorPool()
    # protoc --include_imports writes every file after the files it imports
    for file in descriptor_pb2.FileDescriptorSet.FromString(descriptor_set).file:
        pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


def protobuf_decoder(fmt: FormatSettings) -> Callable[[DataFrame], DataFrame]:
    """The transform for `fmt`; the descriptor sets are read and the message's columns are
    worked out now, so a file gone or a recursive message fails before any batch. On the
    Confluent wire the newest id's message is the table's; an older id whose message has a
    field of another type is refused (its records quarantined with the reason)."""
    try:
        sets = fmt.descriptor_sets()
    except ValueError as exc:
        raise ConfigError(f"format: {exc}") from None
    assert fmt.message is not None
    newest = max(sets)
    decoded = struct_of(message_type(sets[newest], fmt.message).DESCRIPTOR, ())
    clash = taken_names([f.name for f in decoded.fields])
    if clash:
        raise ConfigError(
            f"format: the message's field(s) {clash} are named like columns the pipeline adds "
            "itself (the _kafka_* coordinates, _batch_id, key, value, _error): rename them"
        )
    refused = {}
    for sid, descriptor_set in sets.items():
        if fmt.message not in message_names(descriptor_set):
            refused[sid] = f"it has no message {fmt.message}"
            continue
        why = unfit(struct_of(message_type(descriptor_set, fmt.message).DESCRIPTOR, ()), decoded)
        if why is not None:
            refused[sid] = why
    contract = T.StructType.fromDDL(", ".join(f"`{n}` {t}" for n, t in CONTRACT))
    out = T.StructType([*decoded.fields, *contract.fields])
    decode = functools.partial(
        _decode_batches,
        reading=Reading(sets, fmt.message, fmt.wire == "confluent", refused, newest),
        schema=to_arrow_schema(out, timezone="UTC"),
    )

    def transform(records: DataFrame) -> DataFrame:
        return records.mapInArrow(decode, out)

    return transform


def unfit(writer: T.DataType, reader: T.DataType, path: str = "") -> str | None:
    """Why values of Spark type `writer` cannot land in a column of type `reader`, or None:
    a struct may lack fields (they read null) or have more (dropped); anything else must be
    the same type."""
    at = f"{path}: " if path else ""
    if isinstance(writer, T.StructType) and isinstance(reader, T.StructType):
        written = {f.name: f.dataType for f in writer.fields}
        for field in reader.fields:
            if field.name in written:
                why = unfit(written[field.name], field.dataType, f"{path}.{field.name}".strip("."))
                if why:
                    return why
        return None
    if isinstance(writer, T.ArrayType) and isinstance(reader, T.ArrayType):
        return unfit(writer.elementType, reader.elementType, f"{path}[]")
    if isinstance(writer, T.MapType) and isinstance(reader, T.MapType):
        return unfit(writer.keyType, reader.keyType, f"{path}{{}}") or unfit(
            writer.valueType, reader.valueType, f"{path}{{}}"
        )
    if writer != reader:
        return f"{at}{writer.simpleString()} cannot be read as {reader.simpleString()}"
    return None


@dataclass(frozen=True)
class Reading:
    """What a Python worker needs to parse values: every id's descriptor set, the message,
    whether values are framed (Confluent wire), the ids refused and why, the newest id."""

    sets: dict[int, bytes]
    message: str
    confluent: bool
    refused: dict[int, str]
    newest: int

    def parse(self, value: bytes | None) -> tuple[dict[str, Any] | None, str | None]:
        if value is None:
            return None, "record has no value"
        if not self.confluent:
            return _parse(message_type(self.sets[0], self.message), value, self.message)
        try:
            framed = unframe(value)
        except WireError as exc:
            return None, str(exc)
        sid = framed.schema_id
        if sid not in self.sets:
            known = ", ".join(map(str, sorted(self.sets)))
            return None, f"schema id {sid} is unknown (format.schema_ids has {known})"
        if sid in self.refused:
            why = self.refused[sid]
            return None, f"schema id {sid} cannot be read as schema id {self.newest}: {why}"
        named = indexed_message(self.sets[sid], framed.indexes)
        if named != self.message:
            return None, (
                f"message indexes {list(framed.indexes)} of schema id {sid} name "
                f"{named or 'no message'}, not {self.message}"
            )
        cls = message_type(self.sets[sid], self.message)
        return _parse(cls, framed.payload, self.message)


@functools.lru_cache(maxsize=64)
def indexed_message(descriptor_set: bytes, indexes: tuple[int, ...]) -> str | None:
    """The full name of the message `indexes` point at in the schema's own file (the last
    of its descriptor set: protoc writes the files it imports first), or None."""
    file = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set).file[-1]
    messages, name = list(file.message_type), file.package
    for index in indexes:
        if not 0 <= index < len(messages):
            return None
        name = f"{name}.{messages[index].name}" if name else messages[index].name
        messages = list(messages[index].nested_type)
    return name


def struct_of(message: Descriptor, seen: tuple[str, ...]) -> T.StructType:
    """The Spark type of `message`; a message that contains itself has no finite one."""
    if message.full_name in seen:
        raise ConfigError(
            f"format.message: {message.full_name} contains itself "
            f"({' -> '.join([*seen, message.full_name])}): a table needs a finite schema"
        )
    inner = (*seen, message.full_name)
    return T.StructType([T.StructField(f.name, _type_of(f, inner)) for f in message.fields])


def _type_of(field: FieldDescriptor, seen: tuple[str, ...]) -> T.DataType:
    if _is_map(field):
        key, value = (
            field.message_type.fields_by_name["key"],
            field.message_type.fields_by_name["value"],
        )
        return T.MapType(_element_type(key, seen), _element_type(value, seen))
    element = _element_type(field, seen)
    return T.ArrayType(element) if _is_repeated(field) else element


def _element_type(field: FieldDescriptor, seen: tuple[str, ...]) -> T.DataType:
    if field.type == _F.TYPE_MESSAGE:
        if field.message_type.full_name == _TIMESTAMP:
            return T.TimestampType()
        return struct_of(field.message_type, seen)
    return _SCALARS[field.type]


def _is_repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)


def _is_map(field: FieldDescriptor) -> bool:
    return (
        _is_repeated(field)
        and field.type == _F.TYPE_MESSAGE
        and field.message_type.GetOptions().map_entry
    )


def _decode_batches(
    batches: Iterator[pa.RecordBatch], *, reading: Reading, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """In a Python worker: each batch's values parsed, the coordinates passed through."""
    fields = [
        f.name
        for f in message_type(reading.sets[reading.newest], reading.message).DESCRIPTOR.fields
    ]
    for batch in batches:
        rows: list[dict[str, Any] | None] = []
        errors: list[str | None] = []
        for value in batch.column("value").to_pylist():
            row, error = reading.parse(value)
            rows.append(row)
            errors.append(error)
        columns = [
            pa.array([r.get(name) if r else None for r in rows], type=schema.field(name).type)
            for name in fields
        ]
        passed = [
            batch.column(name).cast(schema.field(name).type)
            for name, _ in CONTRACT
            if name != "_error"
        ]
        columns += [*passed, pa.array(errors, type=pa.string())]
        yield pa.RecordBatch.from_arrays(columns, schema=schema)


def _parse(cls: Any, value: bytes | None, message: str) -> tuple[dict[str, Any] | None, str | None]:
    if value is None:
        return None, "record has no value"
    try:
        return _record(cls.FromString(value)), None
    except Exception as exc:  # DecodeError, or a value no column type holds
        return None, f"value is not a protobuf {message}: {type(exc).__name__}: {exc}"


def _record(msg: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in msg.DESCRIPTOR.fields:
        raw = getattr(msg, field.name)
        if _is_map(field):
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = [(k, _value(value_field, raw[k])) for k in sorted(raw)]
        elif _is_repeated(field):
            out[field.name] = [_value(field, item) for item in raw]
        elif field.has_presence and not msg.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _value(field, raw)
    return out


def _value(field: FieldDescriptor, raw: Any) -> Any:
    if field.type == _F.TYPE_MESSAGE:
        if field.message_type.full_name == _TIMESTAMP:
            return raw.ToDatetime(tzinfo=UTC)
        return _record(raw)
    if field.type == _F.TYPE_ENUM:
        known = field.enum_type.values_by_number.get(raw)
        return known.name if known else str(raw)
    if field.type in (_F.TYPE_UINT64, _F.TYPE_FIXED64):
        return Decimal(raw)
    return raw
