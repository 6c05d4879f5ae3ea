"""`format: avro` against the real broker, Spark (its own from_avro, the spark-avro jar from
jvm/pom.xml) and Delta: records land equal, bad ones go to the quarantine with the reason,
a new optional field is a new column in the same commit, a changed type is refused.

The records are written with fastavro, an Avro implementation independent of Spark's.
"""

from __future__ import annotations

import io
import json
import struct
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from deltalake import DeltaTable
from fastavro import parse_schema, schemaless_writer

from jobs.wiring.pipeline import build
from ledger.core.errors import InconsistencyError
from ledger.core.protocol import BatchState
from ledger.store.ledger_store import LedgerStore
from resources.config.loading import load_config
from resources.config.pipeline_config import PipelineConfig
from tests.fixtures.pipeline import assert_exactly_once, config_path
from tests.test_cli import exactly

ORDER_V1: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "order_id", "type": "long"},
        {
            "name": "amount",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
        },
        {"name": "note", "type": ["null", "string"], "default": None},
        {
            "name": "address",
            "type": {
                "type": "record",
                "name": "Address",
                "fields": [{"name": "city", "type": "string"}, {"name": "zip", "type": "int"}],
            },
        },
    ],
}
#: v1 and an optional field: a compatible change
ORDER_V2: dict[str, Any] = {
    **ORDER_V1,
    "fields": [
        *ORDER_V1["fields"],
        {"name": "coupon", "type": ["null", "string"], "default": None},
    ],
}
#: v1 with order_id a string: an incompatible change
ORDER_V3: dict[str, Any] = {
    **ORDER_V1,
    "fields": [{"name": "order_id", "type": "string"}, *ORDER_V1["fields"][1:]],
}


def order(i: int, **extra: Any) -> dict[str, Any]:
    return {
        "order_id": i,
        "amount": Decimal(f"{i}.{i % 100:02d}"),
        "note": None if i % 2 else f"note-{i}",
        "address": {"city": f"city-{i}", "zip": 1000 + i},
        **extra,
    }


def avro(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, parse_schema(schema), record)
    return out.getvalue()


def confluent(schema_id: int, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + avro(schema, record)


def with_format(config: PipelineConfig, tmp_path: Path, fmt: dict[str, Any]) -> PipelineConfig:
    """`config` (from pipeline_factory) with `format` instead of a transform, as a file."""
    doc = config.model_dump(mode="json")
    doc.pop("transform")
    doc["format"] = fmt
    path = tmp_path / "avro-pipeline.yaml"
    path.write_text(yaml.safe_dump(doc))
    config = load_config(path)
    object.__setattr__(config, "_path", path)  # for config_path(), as pipeline_factory's
    return config


def schema_file(tmp_path: Path, name: str, schema: dict[str, Any]) -> str:
    path = tmp_path / f"{name}.avsc"
    path.write_text(json.dumps(schema))
    return str(path)


def version(uri: str) -> int | None:
    return DeltaTable(uri).version() if DeltaTable.is_deltatable(uri) else None


def run_batch(config: PipelineConfig, spark: Any) -> Any:
    tpc = build(config, spark_factory=lambda: spark)
    tpc.recover_and_commit()
    return tpc.run_batch()


def by_offset(uri: str, columns: list[str]) -> dict[int, dict[str, Any]]:
    rows = DeltaTable(uri).to_pyarrow_table(columns=["_kafka_offset", *columns]).to_pylist()
    return {r.pop("_kafka_offset"): r for r in rows}


def test_avro_records_land_equal_and_bad_ones_are_quarantined_with_the_reason(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    config = with_format(
        pipeline_factory(1),
        tmp_path,
        {"kind": "avro", "schema_file": schema_file(tmp_path, "order", ORDER_V1)},
    )
    topic = config.kafka.topic
    good = [avro(ORDER_V1, order(i)) for i in range(6)]
    corrupt = avro(ORDER_V1, order(6))[:3]  # the decimal's bytes cut short
    kafka_client.produce(topic, [*good, corrupt], partition=0)
    kafka_client.produce_records(topic, [(0, b"k", None)])

    report = run_batch(config, spark)
    assert report.batch.state is BatchState.ACKED

    rows = by_offset(config.delta.table_uri, ["order_id", "amount", "note", "address"])
    assert rows == {i: order(i) for i in range(6)}
    schema = DeltaTable(config.delta.table_uri).schema()
    assert {f.name: str(f.type) for f in schema.fields}["amount"].startswith(
        'PrimitiveType("decimal(9,2)'
    )
    bad = by_offset(config.delta.quarantine_uri, ["_error", "_raw_value"])
    assert bad == {
        6: {"_error": "value is not an Avro datum of the schema", "_raw_value": corrupt},
        7: {"_error": "record has no value", "_raw_value": None},
    }
    # delta-spark reads the same rows back
    seen = spark.read.format("delta").load(config.delta.table_uri)
    assert sorted(r.order_id for r in seen.select("order_id").collect()) == list(range(6))
    assert_exactly_once(config, kafka_client)


def test_the_confluent_wire_format_quarantines_a_wrong_magic_byte_and_an_unknown_id(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    v1 = schema_file(tmp_path, "v1", ORDER_V1)
    config = with_format(
        pipeline_factory(1), tmp_path, {"kind": "avro", "wire": "confluent", "schema_ids": {1: v1}}
    )
    topic = config.kafka.topic
    wrong_magic = b"\x01" + confluent(1, ORDER_V1, order(3))[1:]
    unknown = confluent(9, ORDER_V1, order(4))
    kafka_client.produce(
        topic,
        [
            confluent(1, ORDER_V1, order(0)),
            confluent(1, ORDER_V1, order(1)),
            wrong_magic,
            unknown,
            b"\x00\x00",
        ],
        partition=0,
    )
    assert run_batch(config, spark).batch.state is BatchState.ACKED

    rows = by_offset(config.delta.table_uri, ["order_id", "amount", "note", "address"])
    assert rows == {0: order(0), 1: order(1)}
    bad = by_offset(config.delta.quarantine_uri, ["_error", "_raw_value"])
    assert bad[2]["_error"] == "magic byte is 1, not 0: not the Confluent wire format"
    assert bad[3]["_error"] == "schema id 9 is unknown (format.schema_ids has 1)"
    assert bad[4]["_error"] == "value is shorter than the Confluent header (5 bytes)"
    assert bad[2]["_raw_value"] == wrong_magic and bad[3]["_raw_value"] == unknown
    assert_exactly_once(config, kafka_client)


def _log_actions(table_uri: str, version: int) -> list[str]:
    path = Path(table_uri, "_delta_log", f"{version:020d}.json")
    return [next(iter(json.loads(line))) for line in path.read_text().splitlines() if line]


def test_a_new_optional_field_is_a_new_column_in_the_same_commit(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    v1, v2 = schema_file(tmp_path, "v1", ORDER_V1), schema_file(tmp_path, "v2", ORDER_V2)
    base = pipeline_factory(1)
    config = with_format(
        base, tmp_path, {"kind": "avro", "wire": "confluent", "schema_ids": {1: v1}}
    )
    topic, uri = config.kafka.topic, config.delta.table_uri
    kafka_client.produce(topic, [confluent(1, ORDER_V1, order(i)) for i in range(3)], partition=0)
    run_batch(config, spark)
    before = DeltaTable(uri).version()

    # the writers move to v2; the old ones still write v1
    evolved = with_format(
        base, tmp_path, {"kind": "avro", "wire": "confluent", "schema_ids": {1: v1, 2: v2}}
    )
    kafka_client.produce(
        topic,
        [
            confluent(1, ORDER_V1, order(3)),
            confluent(2, ORDER_V2, order(4, coupon="SAVE4")),
            confluent(2, ORDER_V2, order(5, coupon=None)),
        ],
        partition=0,
    )
    assert run_batch(evolved, spark).batch.state is BatchState.ACKED

    table = DeltaTable(uri)
    assert table.version() == before + 1
    actions = _log_actions(uri, before + 1)
    assert "metaData" in actions and "add" in actions and "txn" in actions, actions
    coupons = {o: r["coupon"] for o, r in by_offset(uri, ["coupon"]).items()}
    assert coupons == {0: None, 1: None, 2: None, 3: None, 4: "SAVE4", 5: None}
    rows = by_offset(uri, ["order_id", "amount", "note", "address"])
    assert rows == {i: order(i) for i in range(6)}
    assert_exactly_once(evolved, kafka_client)


def test_an_incompatible_schema_is_refused_before_the_vote(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    v1, v3 = schema_file(tmp_path, "v1", ORDER_V1), schema_file(tmp_path, "v3", ORDER_V3)
    base = pipeline_factory(1)
    config = with_format(
        base, tmp_path, {"kind": "avro", "wire": "confluent", "schema_ids": {1: v1}}
    )
    topic, uri = config.kafka.topic, config.delta.table_uri
    kafka_client.produce(topic, [confluent(1, ORDER_V1, order(i)) for i in range(3)], partition=0)
    run_batch(config, spark)
    versions = (version(uri), version(config.delta.quarantine_uri))

    changed = with_format(
        base, tmp_path, {"kind": "avro", "wire": "confluent", "schema_ids": {1: v1, 3: v3}}
    )
    kafka_client.produce(
        topic, [confluent(3, ORDER_V3, {**order(3), "order_id": "x3"})], partition=0
    )
    with pytest.raises(InconsistencyError) as info:
        run_batch(changed, spark)
    message = str(info.value)
    assert "column order_id" in message and "invariant 14" in message, message
    assert (version(uri), version(config.delta.quarantine_uri)) == versions
    store = LedgerStore(config.ledger.url)
    refused = max(store.batches(app_id=config.app_id), key=lambda b: b.batch_id)
    assert refused.state is BatchState.ABORTED and not store.files(config.app_id, refused.batch_id)

    # back on v1's schema, the refused record cannot be read as it and is quarantined
    assert run_batch(config, spark).batch.state is BatchState.ACKED
    bad = by_offset(config.delta.quarantine_uri, ["_error"])
    assert bad == {3: {"_error": "schema id 3 is unknown (format.schema_ids has 1)"}}
    assert_exactly_once(config, kafka_client)


def test_an_id_whose_schema_cannot_be_read_as_the_newest_is_quarantined_with_why(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    # id 1 wrote order_id as a string; id 2, the newest, as a long: id 1's records cannot
    # be resolved to the table's schema; the quarantine says why, not only "not a datum"
    v3, v1 = schema_file(tmp_path, "v3", ORDER_V3), schema_file(tmp_path, "v1", ORDER_V1)
    config = with_format(
        pipeline_factory(1),
        tmp_path,
        {"kind": "avro", "wire": "confluent", "schema_ids": {1: v3, 2: v1}},
    )
    old = confluent(1, ORDER_V3, {**order(0), "order_id": "x0"})
    kafka_client.produce(config.kafka.topic, [old, confluent(2, ORDER_V1, order(1))], partition=0)
    assert run_batch(config, spark).batch.state is BatchState.ACKED

    assert by_offset(config.delta.table_uri, ["order_id"]) == {1: {"order_id": 1}}
    bad = by_offset(config.delta.quarantine_uri, ["_error", "_raw_value"])
    assert bad == {
        0: {
            "_error": "schema id 1 cannot be read as schema id 2: "
            "order_id: string cannot be read as long",
            "_raw_value": old,
        }
    }
    assert_exactly_once(config, kafka_client)


def test_a_replace_backfill_decodes_again_once_the_missing_schema_id_is_configured(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    """The operator's way out of `schema id N is unknown`: add the id, then replace the
    offsets; `exactly backfill` takes the format's decoder as the pipeline's transform."""
    v1, v2 = schema_file(tmp_path, "v1", ORDER_V1), schema_file(tmp_path, "v2", ORDER_V2)
    base = pipeline_factory(1)
    config = with_format(
        base, tmp_path, {"kind": "avro", "wire": "confluent", "schema_ids": {1: v1}}
    )
    records = [
        confluent(1, ORDER_V1, order(0)),
        confluent(2, ORDER_V2, order(1, coupon="C1")),
        confluent(1, ORDER_V1, order(2)),
    ]
    kafka_client.produce(config.kafka.topic, records, partition=0)
    run_batch(config, spark)
    assert set(by_offset(config.delta.quarantine_uri, ["_error"])) == {1}

    fixed = with_format(
        base, tmp_path, {"kind": "avro", "wire": "confluent", "schema_ids": {1: v1, 2: v2}}
    )
    args = ["--partition", "0", "--from", "0", "--to", "3", "--mode", "replace"]
    result = exactly("backfill", "-c", str(config_path(fixed)), *args)
    assert result.returncode == 0, result.stdout + result.stderr

    coupons = {o: r["coupon"] for o, r in by_offset(fixed.delta.table_uri, ["coupon"]).items()}
    assert coupons == {0: None, 1: "C1", 2: None}
    quarantine = DeltaTable(fixed.delta.quarantine_uri).to_pyarrow_table()
    assert quarantine.num_rows == 0
    assert_exactly_once(fixed, kafka_client)


NULLABLE_V1: dict[str, Any] = {
    "type": "record",
    "name": "Tag",
    "fields": [
        {"name": "a", "type": ["null", "string"], "default": None},
        {"name": "b", "type": ["null", "long"], "default": None},
    ],
}
NULLABLE_V2: dict[str, Any] = {
    **NULLABLE_V1,
    "fields": [*NULLABLE_V1["fields"], {"name": "c", "type": ["null", "int"], "default": None}],
}


def test_a_record_of_nulls_from_an_older_id_lands_and_a_broken_one_does_not(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    """A schema whose every field may be null: from_avro's row of nulls for a datum it could
    not decode looks like a record of nulls, whatever schema id wrote it."""
    v1, v2 = schema_file(tmp_path, "n1", NULLABLE_V1), schema_file(tmp_path, "n2", NULLABLE_V2)
    config = with_format(
        pipeline_factory(1),
        tmp_path,
        {"kind": "avro", "wire": "confluent", "schema_ids": {1: v1, 2: v2}},
    )
    nulls_v1 = confluent(1, NULLABLE_V1, {"a": None, "b": None})
    nulls_v2 = confluent(2, NULLABLE_V2, {"a": None, "b": None, "c": None})
    full = confluent(1, NULLABLE_V1, {"a": "x", "b": 7})
    broken = confluent(1, NULLABLE_V1, {"a": "xyz", "b": None})[:7]  # the string cut short
    kafka_client.produce(config.kafka.topic, [nulls_v1, nulls_v2, full, broken], partition=0)
    assert run_batch(config, spark).batch.state is BatchState.ACKED

    assert by_offset(config.delta.table_uri, ["a", "b", "c"]) == {
        0: {"a": None, "b": None, "c": None},
        1: {"a": None, "b": None, "c": None},
        2: {"a": "x", "b": 7, "c": None},
    }
    bad = by_offset(config.delta.quarantine_uri, ["_error"])
    assert bad == {3: {"_error": "value is not an Avro datum of the schema"}}
    assert_exactly_once(config, kafka_client)


def test_an_aggregate_derived_output_counts_the_decoded_records(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    aggregate = {
        "kind": "aggregate",
        "name": "orders_per_note",
        "table_uri": str(tmp_path / "per_note"),
        "group_by": ["note"],
        "measures": [{"name": "orders", "fn": "count"}],
    }
    config = with_format(
        pipeline_factory(1, derived=[aggregate]),
        tmp_path,
        {"kind": "avro", "schema_file": schema_file(tmp_path, "order", ORDER_V1)},
    )
    values = [avro(ORDER_V1, order(i)) for i in range(5)] + [b"\x02"]
    kafka_client.produce(config.kafka.topic, values, partition=0)
    assert run_batch(config, spark).batch.state is BatchState.ACKED
    counts = DeltaTable(str(tmp_path / "per_note")).to_pyarrow_table(columns=["note", "orders"])
    got = {r["note"]: r["orders"] for r in counts.to_pylist()}
    assert got == {None: 2, "note-0": 1, "note-2": 1, "note-4": 1}
    assert_exactly_once(config, kafka_client)
