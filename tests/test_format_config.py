"""`format:` in the pipeline config (resources/formats.py): Avro records decoded
by Spark's own from_avro, no hand-written transform. A schema file that is
missing or bad is one line naming the field, and exit code 2 from the command line."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from ledger.errors import ConfigError
from resources.config import load_config, parse_config
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


def test_schema_paths_resolve_against_the_folder_run_from(
    avsc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(avsc.parent)
    config = parse_config(_config({"kind": "avro", "schema_file": avsc.name}))
    assert config.format is not None and config.format.schema_file == str(avsc)
    monkeypatch.chdir("/")
    assert json.loads(config.format.reader_schema())["name"] == "Order"
