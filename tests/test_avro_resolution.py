"""resources/config/formats.py `unreadable_because`: which writer schemas Avro's schema resolution
can read as the newest (reader) schema. Pure logic: the records of a writer it refuses go
to the quarantine with its reason (tests/test_avro_format.py), not as "not an Avro datum"."""

from __future__ import annotations

from typing import Any

import pytest

from resources.config.formats import unreadable_because


def record(*fields: dict[str, Any], name: str = "Order") -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": list(fields)}


ID = {"name": "id", "type": "long"}
NOTE = {"name": "note", "type": ["null", "string"], "default": None}
PRICE = {
    "name": "price",
    "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
}


@pytest.mark.parametrize(
    ("writer", "reader"),
    [
        (record(ID), record(ID)),
        (record(ID), record(ID, NOTE)),  # a new field with a default
        (record(ID, NOTE), record(ID)),  # a field the reader drops
        (record({"name": "id", "type": "int"}), record(ID)),  # a promotion
        (record({"name": "id", "type": "long"}), record({"name": "id", "type": ["null", "long"]})),
        (record(ID, PRICE), record(ID, PRICE)),
        (
            record({"name": "a", "type": record(ID, name="Inner")}),
            record({"name": "a", "type": record(ID, NOTE, name="Inner")}),
        ),
    ],
)
def test_what_avro_resolves_passes(writer: dict[str, Any], reader: dict[str, Any]) -> None:
    assert unreadable_because(writer, reader) is None


@pytest.mark.parametrize(
    ("writer", "reader", "says"),
    [
        (record(ID), record({"name": "id", "type": "string"}), "id: long cannot be read as string"),
        (
            record(ID),
            record(ID, {"name": "n", "type": "string"}),
            "n: not written and has no default",
        ),
        (record(ID), record(ID, name="Other"), "is not Other"),
        (
            record({"name": "id", "type": ["null", "long"]}),
            record(ID),
            "id: a union cannot be read as long",
        ),
        (
            record(ID, PRICE),
            record(ID, {**PRICE, "type": {**PRICE["type"], "scale": 3}}),
            "price: bytes(decimal) cannot be read as bytes(decimal)",
        ),
        (
            record({"name": "a", "type": record(ID, name="Inner")}),
            record({"name": "a", "type": record({"name": "id", "type": "int"}, name="Inner")}),
            "a.id: long cannot be read as int",
        ),
    ],
)
def test_what_avro_cannot_resolve_is_named(
    writer: dict[str, Any], reader: dict[str, Any], says: str
) -> None:
    why = unreadable_because(writer, reader)
    assert why is not None and says in why, why
