"""A date-partitioned data table (`delta.partition_by`) against the real broker, Spark and
Delta: the stage writes partition folders, the commit adds each file with its partition
values, and delta-spark reads, filters and optimizes the table delta-rs created."""

from __future__ import annotations

from collections import Counter
from datetime import date
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from resources.config.partitioning import GENERATION_KEY
from resources.object_storage import storage
from tests.fixtures.partitioned import paris_day, produce, run_until_caught_up
from tests.fixtures.pipeline import assert_exactly_once


def test_a_date_partitioned_table_holds_each_row_once_in_its_paris_day(
    spark: Any, kafka_client: Any, partitioned_factory: Any
) -> None:
    config = partitioned_factory(2, max_records=40)
    instants = produce(kafka_client, config, 120)
    # the session's own time zone must not move a row to another day
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "Asia/Tokyo")
    try:
        assert run_until_caught_up(config, spark) >= 2
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)
    table_rows, quarantined = assert_exactly_once(config, kafka_client)
    assert (table_rows, quarantined) == (120, 5)

    uri = config.delta.table_uri
    table = DeltaTable(uri)
    assert table.metadata().partition_columns == ["event_date"]
    assert table.protocol().min_writer_version >= 4
    field = next(f for f in table.schema().fields if f.name == "event_date")
    assert "Europe/Paris" in field.metadata[GENERATION_KEY]
    # every file's partition value is the Paris day of each of its rows, in that folder
    adds = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    days: Counter[date] = Counter()
    for add in adds:
        value = add["partition.event_date"]
        assert f"event_date={value.isoformat()}/" in add["path"]
        rows = storage.read_parquet(storage.join(uri, add["path"]), ["event_id"])
        for event_id in rows.column("event_id").to_pylist():
            assert paris_day(instants[event_id]) == value, (event_id, add["path"])
            days[value] += 1
    expected = Counter(paris_day(t) for t in instants.values())
    assert days == expected and len(expected) >= 4
    assert date(2026, 3, 2) in expected and date(2027, 1, 1) in expected

    # delta-rs reads the partition column back from the log
    via_rs = DeltaTable(uri).to_pyarrow_table(columns=["event_id", "event_date"]).to_pylist()
    assert sorted((r["event_id"], r["event_date"]) for r in via_rs) == sorted(
        (e, paris_day(t)) for e, t in instants.items()
    )
    # delta-spark reads the same rows, and a partition filter prunes to that day's
    frame = spark.read.format("delta").load(uri)
    via_spark = sorted((r["event_id"], r["event_date"]) for r in frame.collect())
    assert via_spark == sorted((r["event_id"], r["event_date"]) for r in via_rs)
    edge = frame.where("event_date = DATE'2026-03-02'").select("event_id").collect()
    assert sorted(r["event_id"] for r in edge) == sorted(
        e for e, t in instants.items() if paris_day(t) == date(2026, 3, 2)
    )
    assert "ev-0" in {r["event_id"] for r in edge}  # 23:30 UTC on March 1st
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{uri}`").collect()[0]
    assert list(detail["partitionColumns"]) == ["event_date"]
    # delta-spark compacts per partition and keeps every row in its day
    files_before = len(adds)
    spark.sql(f"OPTIMIZE delta.`{uri}`").collect()
    after = DeltaTable(uri)
    compacted = pa.table(after.get_add_actions(flatten=True)).to_pylist()
    assert len(compacted) <= len(expected) < files_before
    again = after.to_pyarrow_table(columns=["event_id", "event_date"]).to_pylist()
    assert sorted((r["event_id"], r["event_date"]) for r in again) == sorted(
        (r["event_id"], r["event_date"]) for r in via_rs
    )


def test_a_row_without_an_event_time_lands_in_the_null_partition(
    spark: Any, kafka_client: Any, partitioned_factory: Any, tmp_path: Any
) -> None:
    """A record that parses but has no time: its partition value is null (Spark's
    `__HIVE_DEFAULT_PARTITION__` folder, null in `partitionValues`), and both readers and a
    windowed aggregate partitioned by its window date keep it."""
    import yaml

    from resources.config.loading import load_config
    from tests.fixtures.pipeline import config_path

    config = partitioned_factory(1)
    path = config_path(config)
    doc = yaml.safe_load(path.read_text())
    doc["derived"] = [
        {
            "kind": "aggregate",
            "name": "per_hour",
            "table_uri": f"{tmp_path}/per_hour",
            "group_by": ["app"],
            "window": {"column": "ts", "size": "1 hour"},
            "measures": [{"name": "views", "fn": "count"}],
            "partition_by": [{"name": "window_date", "date_of": "window_start"}],
        }
    ]
    path.write_text(yaml.safe_dump(doc))
    config = load_config(path)
    object.__setattr__(config, "_path", path)
    instants = produce(kafka_client, config, 10)
    kafka_client.produce(config.kafka.topic, [b'{"event_id": "no-time", "app": "web"}'])
    run_until_caught_up(config, spark)

    assert assert_exactly_once(config, kafka_client) == (11, 5)
    table = DeltaTable(config.delta.table_uri)
    adds = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    nulls = [a for a in adds if a["partition.event_date"] is None]
    assert len(nulls) == 1 and "event_date=__HIVE_DEFAULT_PARTITION__/" in nulls[0]["path"]
    rows = table.to_pyarrow_table(columns=["event_id", "event_date"]).to_pylist()
    assert {r["event_id"]: r["event_date"] for r in rows} == {
        "no-time": None,
        **{e: paris_day(t) for e, t in instants.items()},
    }
    frame = spark.read.format("delta").load(config.delta.table_uri)
    assert [r["event_id"] for r in frame.where("event_date IS NULL").collect()] == ["no-time"]
    held = DeltaTable(config.derived[0].table_uri).to_pyarrow_table().to_pylist()
    assert [
        (r["window_start"], r["window_date"], r["views"]) for r in held if r["window_start"] is None
    ] == [(None, None, 1)]


def test_delta_spark_computes_and_checks_the_generated_partition_column(
    spark: Any, kafka_client: Any, partitioned_factory: Any
) -> None:
    """The table carries its generation expression: a delta-spark writer that leaves the
    column out gets the Paris day computed (with the session in another zone), and one that
    gives a wrong day is refused."""
    config = partitioned_factory(1)
    produce(kafka_client, config, 5)
    run_until_caught_up(config, spark)
    uri = config.delta.table_uri
    columns = "event_id, ts, _kafka_topic, _kafka_partition, _kafka_offset, _batch_id"
    values = "'spark-row', TIMESTAMP'2026-03-01 23:30:00 UTC', 'other', 0, 0, 0"
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/Los_Angeles")
    try:
        spark.sql(f"INSERT INTO delta.`{uri}` ({columns}) VALUES ({values})").collect()
        # a Java exception through py4j: DELTA_VIOLATE_CONSTRAINT_WITH_VALUES
        with pytest.raises(Exception, match="Generated Column"):
            spark.sql(
                f"INSERT INTO delta.`{uri}` ({columns}, event_date) "
                f"VALUES ({values}, DATE'2026-03-01')"
            ).collect()
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)
    rows = DeltaTable(uri).to_pyarrow_table(columns=["event_id", "event_date"]).to_pylist()
    assert {"event_id": "spark-row", "event_date": date(2026, 3, 2)} in rows


def test_a_table_partitioned_by_the_kafka_timestamps_day(
    spark: Any, kafka_client: Any, partitioned_factory: Any
) -> None:
    """`date_of: _kafka_timestamp`: each row's partition is the day Kafka stamped its record
    with, in the declared zone, whatever its own event time says."""
    from datetime import datetime
    from zoneinfo import ZoneInfo

    tokyo = ZoneInfo("Asia/Tokyo")
    config = partitioned_factory(
        1,
        partition_by=[
            {"name": "kafka_date", "date_of": "_kafka_timestamp", "time_zone": "Asia/Tokyo"}
        ],
    )
    produce(kafka_client, config, 10)
    run_until_caught_up(config, spark)

    assert_exactly_once(config, kafka_client)
    table = DeltaTable(config.delta.table_uri)
    assert table.metadata().partition_columns == ["kafka_date"]
    rows = table.to_pyarrow_table(columns=["_kafka_timestamp", "kafka_date"]).to_pylist()
    assert len(rows) == 10
    for row in rows:
        stamped: datetime = row["_kafka_timestamp"]
        assert row["kafka_date"] == stamped.astimezone(tokyo).date(), row
    for add in pa.table(table.get_add_actions(flatten=True)).to_pylist():
        assert f"kafka_date={add['partition.kafka_date'].isoformat()}/" in add["path"]
