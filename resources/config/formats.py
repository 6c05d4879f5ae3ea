"""`format:` in a pipeline config: records in Avro, decoded by Spark's own `from_avro`
(jobs/formats/avro_decode.py), or in Protobuf (jobs/formats/protobuf_decode.py; schema: a .proto or
a descriptor set, resources/config/proto_schema.py), so a pipeline needs no hand-written transform.

Two wire formats. `plain`: each Kafka value is one Avro binary datum written with the schema
in `schema_file`. `confluent`: the Confluent wire format, one magic byte 0, a 4-byte
big-endian schema id, then the datum written with that id's schema; the schemas come by
id from files (`schema_ids`), and the newest id's schema is the table's (the reader schema
every older id is resolved to, by Avro's own schema resolution).

A schema is checked when the config loads: a missing file or a schema Avro would refuse is
a config error naming the field, never a failure inside a batch.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from fastavro.schema import parse_schema
from pydantic import Field, ValidationInfo, field_validator

from resources.config.proto_schema import message_names, read_descriptor_set
from resources.config.schema_file import versioned
from resources.config.strict import _Strict

#: The name a format pipeline's transform is recorded under (backfill params, re-stages):
#: `format:<kind>`, the decoder the config's `format` section builds.
FORMAT_TRANSFORM_PREFIX = "format:"

#: Avro's type promotions a reader may apply to a writer's value (Avro 1.11 spec,
#: "Schema Resolution").
_PROMOTIONS = {
    ("int", "long"),
    ("int", "float"),
    ("int", "double"),
    ("long", "float"),
    ("long", "double"),
    ("float", "double"),
    ("string", "bytes"),
    ("bytes", "string"),
}


@lru_cache(maxsize=64)
def _read_avro(path: str, mtime_ns: int) -> str:
    """The schema in `path` as canonical JSON text, or ValueError saying what is wrong.
    Cached by modification time: the stager builds its decoder from the same files."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ValueError(f"no such file: {path}") from None
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    try:
        parse_schema(schema)
    except Exception as exc:  # fastavro's several exception types, all "not a schema"
        raise ValueError(
            f"{path} is not a valid Avro schema: {type(exc).__name__}: {exc}"
        ) from None
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise ValueError(f"{path}: the schema must be a record (its fields become the columns)")
    return json.dumps(schema)


def read_avro_schema(path: str) -> str:
    """The Avro schema in file `path`, as JSON text; ValueError naming what is wrong."""
    return _read_avro(*versioned(path))


class FormatSettings(_Strict):
    """How to decode the records (see the module docstring)."""

    kind: Literal["avro", "protobuf"]
    wire: Literal["plain", "confluent"] = "plain"
    #: plain wire: the schema every value was written with (`.avsc`, JSON)
    schema_file: str | None = Field(default=None, validate_default=True)
    #: confluent wire: schema id -> the file holding that id's schema
    schema_ids: dict[int, str] = Field(default_factory=dict, validate_default=True)
    #: protobuf: the message type every value is, with its package (`shop.Order`); on the
    #: confluent wire, the one each value's message indexes must name
    message: str | None = Field(default=None, validate_default=True)

    @field_validator("schema_file")
    @classmethod
    def _schema_file(cls, value: str | None, info: ValidationInfo) -> str | None:
        wire = info.data.get("wire")
        if wire == "plain" and value is None:
            raise ValueError("required for wire plain: the schema the values were written with")
        if wire == "confluent" and value is not None:
            raise ValueError(
                "not for wire confluent, whose records name their schema id: give schema_ids"
            )
        if value is not None and info.data.get("kind") == "protobuf":
            read_descriptor_set(value)
        elif value is not None:
            read_avro_schema(value)
        return value

    @field_validator("schema_ids")
    @classmethod
    def _schema_ids(cls, value: dict[int, str], info: ValidationInfo) -> dict[int, str]:
        wire = info.data.get("wire")
        if wire == "confluent" and not value:
            raise ValueError("required for wire confluent: schema id -> .avsc file")
        if wire == "plain" and value:
            raise ValueError("only for wire confluent: give schema_file")
        read = read_descriptor_set if info.data.get("kind") == "protobuf" else read_avro_schema
        for schema_id, path in value.items():
            if not 0 <= schema_id < 2**31:
                raise ValueError(f"{schema_id}: a schema id is 4 bytes, 0 to 2147483647")
            try:
                read(path)
            except ValueError as exc:
                raise ValueError(f"schema id {schema_id}: {exc}") from None
        return value

    @field_validator("message")
    @classmethod
    def _message(cls, value: str | None, info: ValidationInfo) -> str | None:
        kind = info.data.get("kind")
        if kind == "avro" and value is not None:
            raise ValueError("only for kind protobuf (an Avro schema names its own record)")
        if kind == "protobuf" and value is None:
            raise ValueError("required for kind protobuf: the message type, e.g. shop.Order")
        ids = info.data.get("schema_ids") or {}
        path = ids[max(ids)] if ids else info.data.get("schema_file")
        if kind == "protobuf" and path is not None:
            names = message_names(read_descriptor_set(path))
            if value not in names:
                raise ValueError(f"{value} is not a message of {path}: it has {', '.join(names)}")
        return value

    def descriptor_set(self) -> bytes:
        """protobuf: the serialized FileDescriptorSet of `schema_file`, or of the newest id's."""
        return self.descriptor_sets()[max(self.descriptor_sets())]

    def descriptor_sets(self) -> dict[int, bytes]:
        """protobuf: schema id -> its serialized FileDescriptorSet (plain wire: id 0)."""
        if self.wire == "plain":
            assert self.schema_file is not None
            return {0: read_descriptor_set(self.schema_file)}
        return {i: read_descriptor_set(p) for i, p in sorted(self.schema_ids.items())}

    def resolved(self, base: Path) -> FormatSettings:
        """A copy whose schema files are absolute paths against `base`, as the config's other
        local paths are: the stager reads them again, maybe from another folder (Dagster)."""
        return self.model_copy(
            update={
                "schema_file": str(base / self.schema_file) if self.schema_file else None,
                "schema_ids": {i: str(base / p) for i, p in self.schema_ids.items()},
            }
        )

    @property
    def transform_name(self) -> str:
        return f"{FORMAT_TRANSFORM_PREFIX}{self.kind}"

    def writer_schemas(self) -> dict[int, str]:
        """Schema id -> the JSON of its schema (plain wire: the one schema, under id 0)."""
        if self.wire == "plain":
            assert self.schema_file is not None
            return {0: read_avro_schema(self.schema_file)}
        return {i: read_avro_schema(p) for i, p in sorted(self.schema_ids.items())}

    def reader_schema(self) -> str:
        """The table's schema: the newest (highest) id's, or the plain wire's only one."""
        schemas = self.writer_schemas()
        return schemas[max(schemas)]


def unreadable_because(writer: Any, reader: Any, where: str = "") -> str | None:
    """Why Avro's schema resolution cannot read data written with `writer` as `reader`
    (schemas as parsed JSON), or None if it can.

    Conservative: what it accepts Avro resolves (same types, the spec's promotions, a
    reader field the writer lacks that has a default, unions branch by branch, records
    field by field). Spark's from_avro, in PERMISSIVE mode, would turn such a record into
    a row of nulls, which the quarantine would keep as "not an Avro datum": the records of
    a writer refused here go there with this reason instead, and from_avro never sees them.
    """
    at = f"{where}: " if where else ""
    w_kind, r_kind = _kind(writer), _kind(reader)
    if r_kind == "union":
        branches = reader if isinstance(reader, list) else []
        w_branches = writer if w_kind == "union" else [writer]
        for branch in w_branches:
            if all(unreadable_because(branch, r, where) for r in branches):
                return f"{at}{_name(branch)} is in none of {[_name(r) for r in branches]}"
        return None
    if w_kind == "union":
        return f"{at}a union cannot be read as {_name(reader)}"
    if w_kind != r_kind and (w_kind, r_kind) not in _PROMOTIONS:
        return f"{at}{_name(writer)} cannot be read as {_name(reader)}"
    if w_kind == "record":
        return _record_unreadable(writer, reader, where)
    if w_kind in ("array", "map"):
        key = "items" if w_kind == "array" else "values"
        return unreadable_because(writer[key], reader[key], f"{where}[]")
    exact = w_kind in ("fixed", "enum") or _logical(writer) or _logical(reader)
    if exact and json.dumps(writer, sort_keys=True) != json.dumps(reader, sort_keys=True):
        return f"{at}{_name(writer)} cannot be read as {_name(reader)}"
    return None


def _record_unreadable(writer: dict[str, Any], reader: dict[str, Any], where: str) -> str | None:
    if writer.get("name", "").split(".")[-1] != reader.get("name", "").split(".")[-1]:
        return f"{where or 'record'}: record {writer.get('name')} is not {reader.get('name')}"
    written = {f["name"]: f for f in writer["fields"]}
    for field in reader["fields"]:
        path = f"{where}.{field['name']}" if where else field["name"]
        if field["name"] not in written:
            if "default" not in field:
                return f"{path}: not written and has no default"
            continue
        why = unreadable_because(written[field["name"]]["type"], field["type"], path)
        if why:
            return why
    return None


def _kind(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        return _kind(schema["type"]) if isinstance(schema["type"], list | dict) else schema["type"]
    return str(schema)


def _logical(schema: Any) -> Any:
    return schema.get("logicalType") if isinstance(schema, dict) else None


def _name(schema: Any) -> str:
    if isinstance(schema, dict):
        logical = schema.get("logicalType")
        return schema.get("name") or (
            f"{schema['type']}({logical})" if logical else _name(schema["type"])
        )
    if isinstance(schema, list):
        return "union"
    return str(schema)
