"""jobs/formats/protobuf_wire.py: the Confluent wire format of Protobuf values; and which older
message types fit the newest one's columns (jobs/formats/protobuf_decode.py `unfit`). Pure logic."""

from __future__ import annotations

import pytest
from pyspark.sql import types as T

from jobs.formats.protobuf_decode import unfit
from jobs.formats.protobuf_wire import Framed, WireError, frame, unframe


def test_the_first_message_is_one_zero_byte_after_the_schema_id() -> None:
    value = frame(7, b"\x08\x01")
    assert value == b"\x00\x00\x00\x00\x07\x00\x08\x01"
    assert unframe(value) == Framed(7, (0,), b"\x08\x01")


def test_a_nested_message_path_reads_back() -> None:
    # count 2, indexes 1 and 0, each zig-zag: 2 -> 4, 1 -> 2, 0 -> 0
    value = frame(300, b"xy", (1, 0))
    assert value[5:8] == b"\x04\x02\x00"
    assert unframe(value) == Framed(300, (1, 0), b"xy")
    assert unframe(frame(1, b"", (200,))).indexes == (200,)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (b"\x00\x00\x00", "shorter than the Confluent header"),
        (b"\x05\x00\x00\x00\x01\x00", "magic byte is 5, not 0"),
        (b"\x00\x00\x00\x00\x01\x04\x02", "end before the value does"),
        (b"\x00\x00\x00\x00\x01", "end before the value does"),
    ],
)
def test_what_is_not_framed_says_why(value: bytes, says: str) -> None:
    with pytest.raises(WireError, match=says):
        unframe(value)


def struct(**fields: T.DataType) -> T.StructType:
    return T.StructType([T.StructField(name, kind) for name, kind in fields.items()])


def test_which_older_message_types_fit_the_newest_columns() -> None:
    long, text = T.LongType(), T.StringType()
    newest = struct(id=long, a=struct(x=T.IntegerType(), y=text), t=T.ArrayType(text))
    fewer = struct(id=long, a=struct(x=T.IntegerType()))
    more = struct(id=long, gone=text, t=T.ArrayType(text))
    assert unfit(fewer, newest) is None and unfit(more, newest) is None
    assert unfit(struct(a=struct(x=long)), newest) == "a.x: bigint cannot be read as int"
    listed = struct(t=T.ArrayType(T.IntegerType()))
    assert unfit(listed, newest) == "t[]: int cannot be read as string"
