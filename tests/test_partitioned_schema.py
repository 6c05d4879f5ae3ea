"""A partitioned table's schema and its config, against the real broker, Spark and Delta:
a batch that adds a column widens the partitioned table in its commit (invariant 14), and a
partition column whose source is not an instant is one line naming the field, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import yaml
from deltalake import DeltaTable

from tests.fixtures.partitioned import check_partitions, produce, run_until_caught_up
from tests.fixtures.pipeline import assert_exactly_once, config_path, shared_spark_env

ADDS_A_COLUMN = "tests.transforms:pageviews_with_referrer"
TS_AS_STRING = "tests.transforms:pageviews_ts_as_string"


def test_a_batch_that_adds_a_column_widens_the_partitioned_table(
    spark: Any, kafka_client: Any, partitioned_factory: Any
) -> None:
    config = partitioned_factory(2)
    instants = produce(kafka_client, config, 30)
    run_until_caught_up(config, spark)
    wider = partitioned_factory(topic=config.kafka.topic, transform=ADDS_A_COLUMN)
    instants.update(produce(kafka_client, wider, 30, first=30))

    run_until_caught_up(wider, spark)

    assert_exactly_once(wider, kafka_client)
    check_partitions(wider.delta.table_uri, instants)
    table = DeltaTable(wider.delta.table_uri)
    assert "referrer" in [f.name for f in table.schema().fields]
    assert table.metadata().partition_columns == ["event_date"]
    frame = spark.read.format("delta").load(wider.delta.table_uri)
    assert frame.count() == len(instants) and "referrer" in frame.columns


def exactly_run(config: Any) -> subprocess.CompletedProcess[str]:
    """`exactly run` in a child staging on this worker's shared Spark server: these tests
    are about the config's refusals and the runs after them, not the local session."""
    return subprocess.run(
        [sys.executable, "-m", "exactly_cli", "run", "-c", str(config_path(config))],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **shared_spark_env()},
    )


def test_a_partition_source_that_is_not_a_timestamp_is_one_line_naming_the_field(
    kafka_client: Any, partitioned_factory: Any
) -> None:
    config = partitioned_factory(1, transform=TS_AS_STRING)
    produce(kafka_client, config, 5)
    result = exactly_run(config)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "delta.partition_by.0.date_of" in lines[0] and "not a timestamp" in lines[0]
    assert not DeltaTable.is_deltatable(config.delta.table_uri)
    # a source column the transform does not return
    path = config_path(config)
    doc = yaml.safe_load(path.read_text())
    doc["transform"] = "jobs.examples.pageviews:transform"
    doc["delta"]["partition_by"] = [{"name": "day", "date_of": "event_time"}]
    path.write_text(yaml.safe_dump(doc))
    result = exactly_run(config)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "delta.partition_by.0.date_of" in result.stderr and "event_time" in result.stderr


def test_a_config_that_changes_an_existing_tables_partitioning_is_one_line_exit_2(
    spark: Any, kafka_client: Any, partitioned_factory: Any
) -> None:
    """Delta cannot re-partition a table in place: a config that says another layout than
    the table's is refused before the vote, naming the field; with the table's own layout
    given back, the next run takes the same records once."""
    config = partitioned_factory(1)
    produce(kafka_client, config, 10)
    run_until_caught_up(config, spark)
    path = config_path(config)
    partitioned = path.read_text()
    doc = yaml.safe_load(partitioned)
    doc["delta"]["partition_by"] = [{"name": "kafka_date", "date_of": "_kafka_timestamp"}]
    path.write_text(yaml.safe_dump(doc))
    produce(kafka_client, config, 10, first=10)

    result = exactly_run(config)

    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "delta.partition_by" in lines[0] and "['event_date']" in lines[0], lines[0]
    path.write_text(partitioned)
    assert exactly_run(config).returncode == 0
    assert_exactly_once(config, kafka_client)
