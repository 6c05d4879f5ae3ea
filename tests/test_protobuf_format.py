"""`format: protobuf` against the real broker, Spark and Delta: messages land equal, values
that do not parse go to the quarantine with the reason, a new optional field is a new
column in the same commit, a changed type is refused.

The messages are built by the protobuf runtime from protoc's own descriptor set, written
here, not by the product's decoder.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from jobs.formats.protobuf_wire import frame
from ledger.core.errors import InconsistencyError
from ledger.core.protocol import BatchState
from tests.fixtures.pipeline import assert_exactly_once
from tests.test_avro_format import by_offset, run_batch, version, with_format

PROTO_V1 = """
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
enum Status { NEW = 0; PAID = 1; }
message Address { string city = 1; int32 zip = 2; }
message Order {
  int64 order_id = 1;
  optional string note = 2;
  Address address = 3;
  repeated string tags = 4;
  map<string, int32> counts = 5;
  Status status = 6;
  google.protobuf.Timestamp at = 7;
  uint64 big = 8;
}
"""
PROTO_V2 = PROTO_V1.replace("uint64 big = 8;", "uint64 big = 8;\n  optional string coupon = 9;")
PROTO_V3 = PROTO_V1.replace("int64 order_id = 1;", "string order_id = 1;")
COLUMNS = ["order_id", "note", "address", "tags", "counts", "status", "at", "big"]


def proto_file(tmp_path: Path, name: str, text: str) -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "order.proto").write_text(text)
    return str(folder / "order.proto")


def order_class(path: str) -> Any:
    """The Order class from protoc's descriptor set of `path` (grpc_tools' protoc)."""
    import grpc_tools

    out = Path(path).with_suffix(".test.desc")
    include = Path(grpc_tools.__file__).parent / "_proto"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{Path(path).parent}",
            f"-I{include}",
            "--include_imports",
            f"--descriptor_set_out={out}",
            Path(path).name,
        ],
        check=True,
    )
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file:
        pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))


def message(cls: Any, i: int, **extra: Any) -> bytes:
    msg = cls(
        order_id=extra.pop("order_id", i),
        address={"city": f"city-{i}", "zip": 1000 + i},
        tags=[f"t{i}", "x"],
    )
    if i % 2 == 0:
        msg.note = f"note-{i}"
    msg.counts["a"] = i
    msg.status = i % 2
    msg.at.FromDatetime(datetime(2026, 1, 1 + i, tzinfo=UTC))
    msg.big = 2**64 - 1 - i
    for key, value in extra.items():
        setattr(msg, key, value)
    return msg.SerializeToString()


def expected(i: int) -> dict[str, Any]:
    return {
        "order_id": i,
        "note": None if i % 2 else f"note-{i}",
        "address": {"city": f"city-{i}", "zip": 1000 + i},
        "tags": [f"t{i}", "x"],
        "counts": [("a", i)],
        "status": ["NEW", "PAID"][i % 2],
        "at": datetime(2026, 1, 1 + i, tzinfo=UTC),
        "big": Decimal(2**64 - 1 - i),
    }


def fmt(path: str) -> dict[str, Any]:
    return {"kind": "protobuf", "schema_file": path, "message": "shop.Order"}


def test_protobuf_messages_land_equal_and_bad_ones_are_quarantined_with_the_reason(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    v1 = proto_file(tmp_path, "v1", PROTO_V1)
    config = with_format(pipeline_factory(1), tmp_path, fmt(v1))
    cls = order_class(v1)
    kafka_client.produce(config.kafka.topic, [message(cls, i) for i in range(4)], partition=0)
    kafka_client.produce(config.kafka.topic, [b"\x0a\x05ab"], partition=0)  # a cut string
    kafka_client.produce_records(config.kafka.topic, [(0, b"k", None)])
    assert run_batch(config, spark).batch.state is BatchState.ACKED

    assert by_offset(config.delta.table_uri, COLUMNS) == {i: expected(i) for i in range(4)}
    bad = by_offset(config.delta.quarantine_uri, ["_error", "_raw_value"])
    assert bad[4]["_error"].startswith("value is not a protobuf shop.Order: DecodeError"), bad
    assert bad[4]["_raw_value"] == b"\x0a\x05ab"
    assert bad[5] == {"_error": "record has no value", "_raw_value": None}
    seen = spark.read.format("delta").load(config.delta.table_uri).select("big", "status")
    assert sorted(r.big for r in seen.collect()) == sorted(expected(i)["big"] for i in range(4))
    assert_exactly_once(config, kafka_client)


def _log_actions(table_uri: str, at: int) -> list[str]:
    path = Path(table_uri, "_delta_log", f"{at:020d}.json")
    return [next(iter(json.loads(line))) for line in path.read_text().splitlines() if line]


def test_a_new_optional_field_is_a_new_column_in_the_same_commit(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    base = pipeline_factory(1)
    v1, v2 = proto_file(tmp_path, "v1", PROTO_V1), proto_file(tmp_path, "v2", PROTO_V2)
    topic, uri = base.kafka.topic, base.delta.table_uri
    kafka_client.produce(topic, [message(order_class(v1), i) for i in range(2)], partition=0)
    run_batch(with_format(base, tmp_path, fmt(v1)), spark)
    before = DeltaTable(uri).version()

    newer = order_class(v2)
    kafka_client.produce(topic, [message(newer, 2, coupon="C2"), message(newer, 3)], partition=0)
    evolved = with_format(base, tmp_path, fmt(v2))
    assert run_batch(evolved, spark).batch.state is BatchState.ACKED

    assert DeltaTable(uri).version() == before + 1
    actions = _log_actions(uri, before + 1)
    assert "metaData" in actions and "add" in actions and "txn" in actions, actions
    coupons = {o: r["coupon"] for o, r in by_offset(uri, ["coupon"]).items()}
    assert coupons == {0: None, 1: None, 2: "C2", 3: None}
    assert_exactly_once(evolved, kafka_client)


def test_an_incompatible_change_is_refused_before_the_vote(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    base = pipeline_factory(1)
    v1, v3 = proto_file(tmp_path, "v1", PROTO_V1), proto_file(tmp_path, "v3", PROTO_V3)
    topic, uri = base.kafka.topic, base.delta.table_uri
    kafka_client.produce(topic, [message(order_class(v1), 0)], partition=0)
    run_batch(with_format(base, tmp_path, fmt(v1)), spark)
    versions = (version(uri), version(base.delta.quarantine_uri))

    kafka_client.produce(topic, [message(order_class(v3), 1, order_id="x1")], partition=0)
    with pytest.raises(InconsistencyError) as info:
        run_batch(with_format(base, tmp_path, fmt(v3)), spark)
    assert "column order_id" in str(info.value) and "invariant 14" in str(info.value)
    assert (version(uri), version(base.delta.quarantine_uri)) == versions


def confluent_fmt(ids: dict[int, str]) -> dict[str, Any]:
    return {"kind": "protobuf", "wire": "confluent", "schema_ids": ids, "message": "shop.Order"}


#: shop.Order is the second message of order.proto (Address is the first): indexes [1]
ORDER_INDEXES = (1,)


def test_the_confluent_wire_reads_ids_and_message_indexes_and_a_new_id_adds_a_column(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    base = pipeline_factory(1)
    v1, v2 = proto_file(tmp_path, "v1", PROTO_V1), proto_file(tmp_path, "v2", PROTO_V2)
    topic, uri = base.kafka.topic, base.delta.table_uri
    older, newer = order_class(v1), order_class(v2)
    wrong_magic = b"\x01" + frame(1, message(older, 2), ORDER_INDEXES)[1:]
    kafka_client.produce(
        topic,
        [
            frame(1, message(older, 0), ORDER_INDEXES),
            frame(1, message(older, 1), ORDER_INDEXES),
            wrong_magic,
            frame(9, message(older, 3), ORDER_INDEXES),
            frame(1, message(older, 4)),  # indexes [0]: the Address message
        ],
        partition=0,
    )
    config = with_format(base, tmp_path, confluent_fmt({1: v1}))
    assert run_batch(config, spark).batch.state is BatchState.ACKED
    assert by_offset(uri, COLUMNS) == {0: expected(0), 1: expected(1)}
    bad = {o: r["_error"] for o, r in by_offset(base.delta.quarantine_uri, ["_error"]).items()}
    assert bad == {
        2: "magic byte is 1, not 0: not the Confluent wire format",
        3: "schema id 9 is unknown (format.schema_ids has 1)",
        4: "message indexes [0] of schema id 1 name shop.Address, not shop.Order",
    }
    before = DeltaTable(uri).version()

    kafka_client.produce(
        topic,
        [
            frame(1, message(older, 5), ORDER_INDEXES),
            frame(2, message(newer, 6, coupon="C6"), ORDER_INDEXES),
        ],
        partition=0,
    )
    evolved = with_format(base, tmp_path, confluent_fmt({1: v1, 2: v2}))
    assert run_batch(evolved, spark).batch.state is BatchState.ACKED
    assert DeltaTable(uri).version() == before + 1
    assert "metaData" in _log_actions(uri, before + 1)
    coupons = {o: r["coupon"] for o, r in by_offset(uri, ["coupon"]).items()}
    assert coupons == {0: None, 1: None, 5: None, 6: "C6"}
    assert by_offset(uri, COLUMNS)[6] == expected(6)
    assert_exactly_once(evolved, kafka_client)


def test_an_older_id_whose_field_changed_type_is_quarantined_with_why(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    v3, v1 = proto_file(tmp_path, "v3", PROTO_V3), proto_file(tmp_path, "v1", PROTO_V1)
    config = with_format(pipeline_factory(1), tmp_path, confluent_fmt({1: v3, 2: v1}))
    old = frame(1, message(order_class(v3), 0, order_id="x0"), ORDER_INDEXES)
    new = frame(2, message(order_class(v1), 1), ORDER_INDEXES)
    kafka_client.produce(config.kafka.topic, [old, new], partition=0)
    assert run_batch(config, spark).batch.state is BatchState.ACKED
    assert by_offset(config.delta.table_uri, COLUMNS) == {1: expected(1)}
    bad = by_offset(config.delta.quarantine_uri, ["_error", "_raw_value"])
    assert bad == {
        0: {
            "_error": "schema id 1 cannot be read as schema id 2: "
            "order_id: string cannot be read as bigint",
            "_raw_value": old,
        }
    }
    assert_exactly_once(config, kafka_client)
