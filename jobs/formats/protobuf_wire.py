"""The Confluent wire format of a Protobuf value, undone in plain Python (no Spark): magic
byte 0, a 4-byte big-endian schema id, the message indexes, then the message.

The message indexes say which message of the schema's file the value is: a zig-zag varint
count, then that many zig-zag varints, each an index into the message types at that level
(top-level, then nested). The common case, the file's first message, is the single byte 0
(count 0, meaning [0]).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

HEADER_BYTES = 5


class WireError(ValueError):
    """A value that is not in the Confluent wire format; the message says why."""


@dataclass(frozen=True)
class Framed:
    schema_id: int
    indexes: tuple[int, ...]
    payload: bytes


def unframe(value: bytes) -> Framed:
    """The schema id, message indexes and message bytes of `value`; WireError if it is not
    framed as the Confluent wire format says."""
    if len(value) < HEADER_BYTES:
        raise WireError("value is shorter than the Confluent header (5 bytes)")
    if value[0] != 0:
        raise WireError(f"magic byte is {value[0]}, not 0: not the Confluent wire format")
    (schema_id,) = struct.unpack(">I", value[1:HEADER_BYTES])
    count, at = _zigzag_varint(value, HEADER_BYTES)
    if count < 0 or count > len(value):
        raise WireError(f"schema id {schema_id}: {count} message indexes cannot be")
    indexes = []
    for _ in range(count):
        index, at = _zigzag_varint(value, at)
        indexes.append(index)
    return Framed(schema_id, tuple(indexes) if indexes else (0,), value[at:])


def _zigzag_varint(data: bytes, at: int) -> tuple[int, int]:
    """The zig-zag varint at `at` and the offset after it."""
    result = shift = 0
    while True:
        if at >= len(data):
            raise WireError("the message indexes end before the value does")
        byte = data[at]
        at += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), at
        shift += 7
        if shift > 63:
            raise WireError("a message index is not a varint")


def frame(schema_id: int, payload: bytes, indexes: tuple[int, ...] = (0,)) -> bytes:
    """`payload` in the Confluent wire format (what a Confluent serializer writes)."""
    head = b"\x00" + struct.pack(">I", schema_id)
    if indexes == (0,):
        return head + b"\x00" + payload
    return head + b"".join(_varint(_zigzag(n)) for n in (len(indexes), *indexes)) + payload


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
