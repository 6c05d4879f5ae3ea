"""`format: avro` on every kind of session the product stages with: the spark-avro jar from
jvm/pom.xml must reach a Spark Connect server's classpath and a standalone cluster's
executors (`spark.jars`), as the Kafka source's and Delta's do (resources/jvm/jars.py). And
`format: protobuf` on Spark Connect, whose server's Python workers parse the values.

Real servers, broker and tables; the local session is covered by tests/test_avro_format.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobs.wiring.pipeline import build
from resources.kafka.client import KafkaClient
from tests.fixtures.pipeline import assert_exactly_once, config_path
from tests.test_avro_format import ORDER_V1, avro, by_offset, order, schema_file, with_format
from tests.test_cli import exactly
from tests.test_spark_connect import connect_server, remote  # noqa: F401 (fixtures)

pytestmark = pytest.mark.integration


@pytest.mark.wide  # a decoder through Connect: the Protobuf case below, in `make test`
def test_an_avro_batch_stages_and_commits_through_spark_connect(
    remote: Any,  # noqa: F811 (the fixture)
    kafka_client: KafkaClient,
    pipeline_factory: Any,
    tmp_path: Path,
) -> None:
    config = with_format(
        pipeline_factory(2),
        tmp_path,
        {"kind": "avro", "schema_file": schema_file(tmp_path, "order", ORDER_V1)},
    )
    kafka_client.produce(config.kafka.topic, [avro(ORDER_V1, order(i)) for i in range(5)], 0)
    kafka_client.produce(config.kafka.topic, [b"\x02"], 1)  # a long cut short
    report = build(config, spark_factory=lambda: remote).run_batch()
    assert report is not None and report.output.records_read == 6
    rows = by_offset(config.delta.table_uri, ["order_id", "amount", "note", "address"])
    assert rows == {i: order(i) for i in range(5)}
    assert assert_exactly_once(config, kafka_client) == (5, 1)


@pytest.mark.wide  # the cluster's executors decoding: test_spark_cluster.py's transform module
def test_exactly_run_decodes_avro_on_a_standalone_cluster(
    spark_cluster: Any, kafka_client: KafkaClient, pipeline_factory: Any, tmp_path: Path
) -> None:
    config = with_format(
        pipeline_factory(2, master=spark_cluster.url),
        tmp_path,
        {"kind": "avro", "schema_file": schema_file(tmp_path, "order", ORDER_V1)},
    )
    kafka_client.produce(config.kafka.topic, [avro(ORDER_V1, order(i)) for i in range(5)], 0)
    kafka_client.produce(config.kafka.topic, [b"\x02"], 1)

    result = exactly("run", "-c", str(config_path(config)), "--until-caught-up")

    assert result.returncode == 0, result.stdout + result.stderr
    rows = by_offset(config.delta.table_uri, ["order_id", "amount", "note", "address"])
    assert rows == {i: order(i) for i in range(5)}
    assert assert_exactly_once(config, kafka_client) == (5, 1)


def test_a_protobuf_batch_stages_and_commits_through_spark_connect(
    remote: Any,  # noqa: F811 (the fixture)
    kafka_client: KafkaClient,
    pipeline_factory: Any,
    tmp_path: Path,
) -> None:
    """The values are parsed in the server's Python workers (mapInArrow): they must import
    the decoder and build the message class from the descriptor set the driver sent."""
    from tests.test_protobuf_format import (
        COLUMNS,
        PROTO_V1,
        expected,
        fmt,
        message,
        order_class,
        proto_file,
    )

    v1 = proto_file(tmp_path, "v1", PROTO_V1)
    config = with_format(pipeline_factory(2), tmp_path, fmt(v1))
    cls = order_class(v1)
    kafka_client.produce(config.kafka.topic, [message(cls, i) for i in range(3)], 0)
    kafka_client.produce(config.kafka.topic, [b"\x0a\x05ab"], 1)
    report = build(config, spark_factory=lambda: remote).run_batch()
    assert report is not None and report.output.records_read == 4
    assert by_offset(config.delta.table_uri, COLUMNS) == {i: expected(i) for i in range(3)}
    assert assert_exactly_once(config, kafka_client) == (3, 1)
