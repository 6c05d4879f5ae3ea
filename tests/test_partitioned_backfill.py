"""A replace backfill and compaction on a date-partitioned table (real broker, Spark, Delta):
rows are removed by coordinates in every partition and rewritten into their own, and a
compaction merges files per partition, keeping every row in its day."""

from __future__ import annotations

from typing import Any

from deltalake import DeltaTable

from jobs.delta_publisher import DeltaPublisher
from jobs.pipeline import build_backfill
from ledger.backfill import BackfillMode, plan_backfill
from ledger.protocol import OffsetRange
from tests.fixtures.partitioned import check_partitions, paris_day, produce, run_until_caught_up
from tests.fixtures.pipeline import assert_exactly_once

V2 = "tests.transforms:pageviews_v2"


def replace(config: Any, spark: Any, rng: OffsetRange) -> None:
    tpc = build_backfill(config, transform=V2, spark_factory=lambda: spark)
    batch, planned = plan_backfill(
        tpc, live_app_id=config.app_id, mode=BackfillMode.REPLACE, ranges=[rng], transform=V2
    )
    assert planned
    tpc.finish(batch)


def test_a_replace_removes_rows_by_coordinates_in_every_partition(
    spark: Any, kafka_client: Any, partitioned_factory: Any
) -> None:
    config = partitioned_factory(1, max_records=15)
    instants = produce(kafka_client, config, 60, partition=0)
    run_until_caught_up(config, spark)
    # merge the batches' files: a file then holds rows in and out of the replaced range
    spark.sql(f"OPTIMIZE delta.`{config.delta.table_uri}`").collect()
    # offsets 0-1 are quarantined records, 2.. the events ev-0, ev-1, ...
    replaced = {f"ev-{i}" for i in range(3, 43)}
    replace(config, spark, OffsetRange(config.kafka.topic, 0, 5, 45))

    assert_exactly_once(config, kafka_client)
    check_partitions(config.delta.table_uri, instants)
    rows = DeltaTable(config.delta.table_uri).to_pyarrow_table(columns=["event_id", "app"])
    apps = dict(zip(rows["event_id"].to_pylist(), rows["app"].to_pylist(), strict=True))
    assert {e for e, app in apps.items() if app == "WEB"} == replaced
    assert len({paris_day(instants[e]) for e in replaced}) >= 3  # several partitions
    # delta-spark reads the same rows, and prunes by partition
    frame = spark.read.format("delta").load(config.delta.table_uri)
    assert frame.count() == len(instants)
    assert frame.where("event_date = DATE'2026-03-02'").count() == sum(
        1 for t in instants.values() if paris_day(t).isoformat() == "2026-03-02"
    )


def test_compaction_merges_files_per_partition_and_keeps_every_row_in_its_day(
    spark: Any, kafka_client: Any, partitioned_factory: Any
) -> None:
    config = partitioned_factory(2, max_records=10)
    instants = produce(kafka_client, config, 80)
    run_until_caught_up(config, spark)
    before = check_partitions(config.delta.table_uri, instants)
    days = {paris_day(t) for t in instants.values()}
    assert before > len(days)

    done = DeltaPublisher.for_config(config).compact()["table"]

    assert done is not None and done.files_removed > 0
    # one file per partition: delta-rs bins each partition's files on their own
    assert check_partitions(config.delta.table_uri, instants) == len(days)
    assert_exactly_once(config, kafka_client)
    # the pipeline goes on committing into the compacted table, which delta-spark reads
    instants.update(produce(kafka_client, config, 20, first=80))
    run_until_caught_up(config, spark)
    check_partitions(config.delta.table_uri, instants)
    assert_exactly_once(config, kafka_client)
    frame = spark.read.format("delta").load(config.delta.table_uri)
    assert frame.count() == len(instants)
