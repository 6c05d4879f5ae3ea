"""A replace backfill and compaction on a date-partitioned table (real broker, Spark, Delta):
rows are removed by coordinates in every partition and rewritten into their own, and a
compaction merges files per partition, keeping every row in its day."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from deltalake import DeltaTable

from jobs.derived.invariants import aggregate_differences, recompute_aggregate
from jobs.publish.delta_publisher import DeltaPublisher
from jobs.wiring.pipeline import build_backfill
from ledger.coordinator.backfill import plan_backfill
from ledger.core.backfill import BackfillMode
from ledger.core.protocol import OffsetRange
from resources.config.loading import load_config
from tests.fixtures.partitioned import check_partitions, paris_day, produce, run_until_caught_up
from tests.fixtures.pipeline import assert_exactly_once, config_path

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


def test_a_replace_corrects_an_aggregate_partitioned_by_its_window_date(
    spark: Any, kafka_client: Any, partitioned_factory: Any, tmp_path: Path
) -> None:
    """The replace's correction (new rows minus old) moves groups between apps: its MERGE
    must file every group it inserts under its window's day, and empty groups go."""
    config = partitioned_factory(1, max_records=20)
    path = config_path(config)
    doc = yaml.safe_load(path.read_text())
    doc["derived"] = [
        {
            "kind": "aggregate",
            "name": "views_per_hour",
            "table_uri": str(tmp_path / "views_per_hour"),
            "group_by": ["app"],
            "window": {"column": "ts", "size": "1 hour"},
            "measures": [{"name": "views", "fn": "count"}],
            "partition_by": [
                {"name": "window_date", "date_of": "window_start", "time_zone": "Europe/Paris"}
            ],
        }
    ]
    path.write_text(yaml.safe_dump(doc))
    config = load_config(path)
    object.__setattr__(config, "_path", path)
    instants = produce(kafka_client, config, 60, partition=0)
    run_until_caught_up(config, spark)

    replace(config, spark, OffsetRange(config.kafka.topic, 0, 2, 40))

    assert_exactly_once(config, kafka_client)
    check_partitions(config.delta.table_uri, instants)
    spec = config.derived[0]
    held = DeltaTable(spec.table_uri).to_pyarrow_table()
    raw = DeltaTable(config.delta.table_uri).to_pyarrow_table()
    assert aggregate_differences(recompute_aggregate(raw, spec), held, spec) == []
    assert {"WEB", "web"} <= set(held.column("app").to_pylist())
    for row in held.to_pylist():
        assert row["window_date"] == paris_day(row["window_start"]), row
