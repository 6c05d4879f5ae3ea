"""`format: avro` on every kind of session the product stages with: the spark-avro jar
from jvm/pom.xml must reach a Spark Connect server's classpath and a standalone cluster's
executors (`spark.jars`), as the Kafka source's and Delta's do (resources/jars.py).

Real servers, broker and tables; the local session is covered by tests/test_avro_format.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobs.pipeline import build
from resources.kafka import KafkaClient
from tests.fixtures.pipeline import assert_exactly_once, config_path
from tests.test_avro_format import ORDER_V1, avro, by_offset, order, schema_file, with_format
from tests.test_cli import exactly
from tests.test_spark_connect import connect_server, remote  # noqa: F401 (fixtures)

pytestmark = pytest.mark.integration


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
