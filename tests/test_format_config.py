"""`format:` in the pipeline config (resources/config/formats.py): Avro records decoded
by Spark's own from_avro, no hand-written transform. A schema file that is
missing or bad is one line naming the field, and exit code 2 from the command line."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from ledger.core.errors import ConfigError
from resources.config.loading import load_config, parse_config
from tests.test_cli import exactly, one_error_line

MINIMAL: dict[str, Any] = {
    "pipeline": "orders",
    "kafka": {"bootstrap_servers": "127.0.0.1:1", "topic": "orders"},
    "delta": {"table_uri": "tables/orders", "quarantine_uri": "tables/orders_quarantine"},
}

ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {
            "name": "amount",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
        },
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}


def _config(fmt: dict[str, Any], **extra: Any) -> dict[str, Any]:
    data = copy.deepcopy(MINIMAL)
    data["format"] = fmt
    data.update(extra)
    return data


def _error(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "p.yaml")
    return str(info.value)


@pytest.fixture
def avsc(tmp_path: Path) -> Path:
    path = tmp_path / "order.avsc"
    path.write_text(json.dumps(ORDER))
    return path


def test_an_avro_format_needs_no_transform(avsc: Path) -> None:
    config = parse_config(_config({"kind": "avro", "schema_file": str(avsc)}))
    assert config.format is not None and config.format.kind == "avro"
    # the decoder is the pipeline's transform: backfills and re-stages name it the same way
    assert config.transform == "format:avro"


def test_a_missing_schema_file_names_the_field(tmp_path: Path) -> None:
    message = _error(_config({"kind": "avro", "schema_file": str(tmp_path / "nope.avsc")}))
    assert "format.schema_file" in message and "nope.avsc" in message, message


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "not JSON"),
        (
            json.dumps({"type": "record", "name": "X", "fields": [{"name": "a", "type": "lng"}]}),
            "lng",
        ),
        (json.dumps("string"), "record"),
    ],
)
def test_a_bad_avro_schema_names_the_field_and_the_problem(
    tmp_path: Path, text: str, says: str
) -> None:
    path = tmp_path / "bad.avsc"
    path.write_text(text)
    message = _error(_config({"kind": "avro", "schema_file": str(path)}))
    assert "format.schema_file" in message and says in message, message


def test_format_and_transform_are_exclusive(avsc: Path) -> None:
    data = _config({"kind": "avro", "schema_file": str(avsc)}, transform="a.b:c")
    assert "format" in _error(data) and "transform" in _error(data)


def test_a_confluent_wire_needs_schemas_by_id(avsc: Path) -> None:
    message = _error(_config({"kind": "avro", "wire": "confluent"}))
    assert "format.schema_ids" in message, message
    config = parse_config(
        _config({"kind": "avro", "wire": "confluent", "schema_ids": {7: str(avsc)}})
    )
    assert config.format is not None and set(config.format.schema_ids) == {7}


def test_the_command_line_says_one_line_and_exits_2(tmp_path: Path) -> None:
    data = _config({"kind": "avro", "schema_file": str(tmp_path / "gone.avsc")})
    data["ledger"] = {"url": f"sqlite:///{tmp_path / 'ledger.db'}"}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    line = one_error_line(exactly("run", "-c", str(path)))
    assert "format.schema_file" in line and "gone.avsc" in line, line


def test_the_shipped_avro_example_loads_with_absolute_schema_paths(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(repo)
    config = load_config(repo / "pipelines" / "avro" / "orders.yaml")
    assert config.format is not None and config.transform == "format:avro"
    assert all(Path(p).is_absolute() for p in config.format.schema_ids.values())
    reader = json.loads(config.format.reader_schema())
    assert [f["name"] for f in reader["fields"]][-1] == "coupon"  # id 2, the newest
    # the shape: several topics by a pattern, a partitioned table, an aggregate
    assert config.kafka.pattern == "orders-.*" and config.kafka.topic is None
    assert [c.name for c in config.delta.partition_by] == ["kafka_date"]
    assert [d.name for d in config.derived] == ["orders_per_coupon"]


def test_schema_paths_resolve_against_the_folder_run_from(
    avsc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(avsc.parent)
    config = parse_config(_config({"kind": "avro", "schema_file": avsc.name}))
    assert config.format is not None and config.format.schema_file == str(avsc)
    monkeypatch.chdir("/")
    assert json.loads(config.format.reader_schema())["name"] == "Order"


PROTO = """
syntax = "proto3";
package shop;
message Address {
  string city = 1;
  int32 zip = 2;
}
message Order {
  int64 order_id = 1;
  optional string note = 2;
  Address address = 3;
  repeated string tags = 4;
}
"""


@pytest.fixture
def proto(tmp_path: Path) -> Path:
    path = tmp_path / "order.proto"
    path.write_text(PROTO)
    return path


def test_a_proto_file_compiles_into_a_descriptor_set(proto: Path) -> None:
    config = parse_config(
        _config({"kind": "protobuf", "schema_file": str(proto), "message": "shop.Order"})
    )
    assert config.format is not None and config.transform == "format:protobuf"
    from google.protobuf import descriptor_pb2

    descriptors = descriptor_pb2.FileDescriptorSet.FromString(config.format.descriptor_set())
    assert [f.name for f in descriptors.file] == ["order.proto"]


def test_a_descriptor_set_file_is_taken_as_it_is(proto: Path, tmp_path: Path) -> None:
    compiled = parse_config(
        _config({"kind": "protobuf", "schema_file": str(proto), "message": "shop.Order"})
    )
    assert compiled.format is not None
    desc = tmp_path / "order.desc"
    desc.write_bytes(compiled.format.descriptor_set())
    config = parse_config(
        _config({"kind": "protobuf", "schema_file": str(desc), "message": "shop.Order"})
    )
    assert config.format is not None
    assert config.format.descriptor_set() == compiled.format.descriptor_set()


def test_a_protobuf_format_must_name_a_message_of_the_file(proto: Path) -> None:
    message = _error(_config({"kind": "protobuf", "schema_file": str(proto)}))
    assert "format.message" in message and "required" in message, message
    message = _error(
        _config({"kind": "protobuf", "schema_file": str(proto), "message": "shop.Nope"})
    )
    assert "format.message" in message and "shop.Order" in message, message
    avro_message = _error(_config({"kind": "avro", "schema_file": "x.avsc", "message": "A"}))
    assert "format.message" in avro_message, avro_message


def test_a_proto_file_that_does_not_compile_is_one_line_quoting_protoc(proto: Path) -> None:
    proto.write_text(PROTO.replace("int64 order_id = 1;", "int64 order_id = ;"))
    message = _error(
        _config({"kind": "protobuf", "schema_file": str(proto), "message": "shop.Order"})
    )
    assert "format.schema_file" in message and "order.proto:" in message, message
    assert "\n" not in message


def test_a_file_that_is_no_descriptor_set_is_named(tmp_path: Path) -> None:
    desc = tmp_path / "junk.desc"
    desc.write_bytes(b"\xff\xff\xff")
    message = _error(
        _config({"kind": "protobuf", "schema_file": str(desc), "message": "shop.Order"})
    )
    assert "format.schema_file" in message and "descriptor set" in message, message


def test_protobuf_on_the_confluent_wire_takes_schemas_by_id(proto: Path) -> None:
    config = parse_config(
        _config(
            {
                "kind": "protobuf",
                "wire": "confluent",
                "schema_ids": {1: str(proto)},
                "message": "shop.Order",
            }
        )
    )
    assert config.format is not None and set(config.format.descriptor_sets()) == {1}
    message = _error(
        _config(
            {"kind": "protobuf", "wire": "confluent", "schema_ids": {1: str(proto)}, "message": "X"}
        )
    )
    assert "format.message" in message and "shop.Order" in message, message


def test_a_message_that_contains_itself_is_refused_before_any_batch(tmp_path: Path) -> None:
    from jobs.formats.protobuf_decode import protobuf_decoder

    proto = tmp_path / "tree.proto"
    proto.write_text('syntax = "proto3"; message Node { string name = 1; Node child = 2; }')
    config = parse_config(
        _config({"kind": "protobuf", "schema_file": str(proto), "message": "Node"})
    )
    assert config.format is not None
    with pytest.raises(ConfigError, match=r"Node contains itself \(Node -> Node\)"):
        protobuf_decoder(config.format)


def test_a_field_named_like_a_pipeline_column_is_refused(tmp_path: Path) -> None:
    from jobs.formats.protobuf_decode import protobuf_decoder

    proto = tmp_path / "clash.proto"
    proto.write_text('syntax = "proto3"; message M { string Value = 1; }')
    config = parse_config(_config({"kind": "protobuf", "schema_file": str(proto), "message": "M"}))
    assert config.format is not None
    with pytest.raises(ConfigError, match=r"\['Value'\] are named like columns"):
        protobuf_decoder(config.format)


def test_the_code_location_serves_the_avro_example(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from orchestration.definitions import build_definitions

    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(repo)
    monkeypatch.setenv("EXACTLY_PIPELINES_DIR", str(repo / "pipelines" / "avro"))
    monkeypatch.setenv("EXACTLY_STATE_DIR", str(tmp_path))
    defs = build_definitions()
    for job in ("orders_micro_batch", "orders_backfill", "orders_continuous"):
        assert defs.resolve_job_def(job) is not None


def test_a_format_cannot_feed_an_upsert_output_yet(avsc: Path) -> None:
    """An upsert output deletes by tombstones (null values), which a format quarantines as
    `record has no value`: the output would never delete. Refused, not half-working."""
    upsert = {"kind": "upsert", "name": "users", "table_uri": "tables/users", "key": ["id"]}
    message = _error(_config({"kind": "avro", "schema_file": str(avsc)}, derived=[upsert]))
    assert "upsert" in message and "format" in message and "users" in message, message
