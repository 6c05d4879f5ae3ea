"""Backfills against the real broker, Spark and Delta: fill, replace, compaction, retention.
A crash at every crash point of a backfill, with the ledger kept and lost, is in the crash
matrix (tests/test_crash.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable

from jobs.examples.sample_data import pageviews
from jobs.wiring.pipeline import build, build_backfill
from ledger.coordinator.backfill import plan_backfill
from ledger.core.backfill import BackfillError, BackfillMode
from ledger.core.errors import DataLossError
from ledger.core.protocol import BatchState, OffsetRange
from ledger.store.ledger_store import LedgerStore
from tests.fixtures.pipeline import assert_exactly_once, config_path, crash_run, shared_spark_env

V2 = "tests.transforms:pageviews_v2"
COLUMNS = ["_kafka_partition", "_kafka_offset", "event_id", "app", "user", "url", "ts"]


def live_until_caught_up(config: Any, spark: Any) -> None:
    tpc = build(config, spark_factory=lambda: spark)
    tpc.recover_and_commit()
    while tpc.run_batch() is not None:
        pass


def backfill(config: Any, spark: Any, mode: str, rng: OffsetRange, **kw: Any) -> Any:
    transform = kw.pop("transform", V2)
    tpc = build_backfill(config, transform=transform, spark_factory=lambda: spark)
    batch, planned = plan_backfill(
        tpc,
        live_app_id=config.app_id,
        mode=BackfillMode(mode),
        ranges=[rng],
        transform=transform,
        **kw,
    )
    return tpc.finish(batch).batch if planned else None


def rows(config: Any) -> list[tuple[Any, ...]]:
    table = DeltaTable(config.delta.table_uri).to_pyarrow_table(columns=COLUMNS)
    return sorted(tuple(r[c] for c in COLUMNS) for r in table.to_pylist())


def apps_by_coordinate(config: Any) -> dict[tuple[int, int], str]:
    return {(r[0], r[1]): r[3] for r in rows(config)}


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`exactly` in a child, staging on this worker's shared Spark server: these tests are
    about backfills, not the local session (no JVM start per child)."""
    return subprocess.run(
        [sys.executable, "-m", "exactly_cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **shared_spark_env(), **(env or {})},
    )


def test_fill_ingests_what_came_before_the_live_start_and_rejects_overlaps(
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    config = pipeline_factory(2, starting_offsets="latest")
    topic = config.kafka.topic
    kafka_client.produce_to_partitions(topic, {0: list(pageviews(100)), 1: list(pageviews(60))})
    live_until_caught_up(config, spark)  # pins the start at offsets 100 and 60
    kafka_client.produce_to_partitions(topic, {0: list(pageviews(40, start=100)), 1: []})
    live_until_caught_up(config, spark)
    assert sum(1 for r in rows(config) if r[0] == 0) == 40

    def fill_cli(start: int, end: int) -> subprocess.CompletedProcess[str]:
        args = ["--partition", "0", "--from", str(start), "--to", str(end), "--mode", "fill"]
        return cli("backfill", "-c", str(config_path(config)), *args)

    version = DeltaTable(config.delta.table_uri).version()
    with pytest.raises(BackfillError, match=r"overlaps committed data: batch pageviews/\d+"):
        backfill(config, spark, "fill", OffsetRange(topic, 0, 90, 110))
    with pytest.raises(BackfillError, match="belong to the live pipeline"):
        backfill(config, spark, "fill", OffsetRange(topic, 0, 150, 160))
    assert DeltaTable(config.delta.table_uri).version() == version

    result = fill_cli(0, 100)
    assert result.returncode == 0, result.stderr
    assert "fill batch 1 ACKED" in result.stdout and "records=100" in result.stdout
    again = fill_cli(0, 100)
    assert again.returncode == 0 and "already done" in again.stdout
    overlap = fill_cli(50, 60)
    assert overlap.returncode == 2
    assert "overlaps committed data: batch pageviews.backfill/1" in overlap.stderr
    backfill(config, spark, "fill", OffsetRange(topic, 1, 0, 60))

    table, quarantined = assert_exactly_once(config, kafka_client)
    assert (table, quarantined) == (200, 0)


def test_replace_while_the_live_pipeline_keeps_committing(
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    config = pipeline_factory(3, max_records=150)
    topic = config.kafka.topic
    kafka_client.produce_to_partitions(
        topic, {p: list(pageviews(400, start=400 * p, malformed_every=40)) for p in range(3)}
    )
    live_until_caught_up(config, spark)
    before = apps_by_coordinate(config)
    kafka_client.produce(topic, pageviews(1500, start=1200, malformed_every=40))
    live = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "exactly_cli",
            "run",
            "-c",
            str(config_path(config)),
            "--until-caught-up",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **shared_spark_env()},
    )
    try:
        replaced = backfill(config, spark, "replace", OffsetRange(topic, 1, 50, 250))
    finally:
        out = live.communicate(timeout=600)[0]
    assert live.returncode == 0, out
    assert replaced is not None and replaced.state is BatchState.ACKED
    live_until_caught_up(config, spark)

    table, quarantined = assert_exactly_once(config, kafka_client)
    assert table + quarantined == 2700
    after = apps_by_coordinate(config)
    for coord, app in after.items():
        in_range = coord[0] == 1 and 50 <= coord[1] < 250
        if in_range:
            assert app == before[coord].upper(), coord
        else:
            assert app == app.lower(), coord
    assert sum(1 for c in after if c[0] == 1 and 50 <= c[1] < 250) > 150


def test_replace_over_a_live_batch_that_crashed_after_its_vote_finishes_it_first(
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    """A live batch that voted and died has rows that are not in the table yet: a replace
    over its range would remove nothing there, and the batch, once recovered, would add its
    rows beside the replace's (check_request refuses such a replace, tests/test_backfill_plan.py).
    The backfill's own start finishes the live batch first, as every start finishes every
    voted batch of the pipeline; then the replace runs and the table holds every coordinate
    once (invariant 1), the replaced ones through the new transform."""
    config = pipeline_factory(2, max_records=150)
    kafka_client.produce_to_partitions(
        config.kafka.topic,
        {p: list(pageviews(300, start=300 * p, malformed_every=30)) for p in (0, 1)},
    )
    tpc = build(config, spark_factory=lambda: spark)
    tpc.recover_and_commit()
    assert tpc.run_batch() is not None  # batch 1: [0, 150) of both partitions
    crash_run(config, "after_prepare")  # batch 2: [150, 300), PREPARED, nothing published
    store = LedgerStore(config.ledger.url)
    crashed = store.get(config.app_id, 2)
    assert crashed is not None and crashed.state is BatchState.PREPARED

    args = ["--partition", "1", "--from", "100", "--to", "200", "--mode", "replace"]
    replaced = cli("backfill", "-c", str(config_path(config)), *args, "--transform", V2)
    assert replaced.returncode == 0, replaced.stdout + replaced.stderr
    out = replaced.stdout
    assert out.index("recovered batch pageviews/2: ACKED") < out.index("replace batch 1 ACKED")

    table, quarantined = assert_exactly_once(config, kafka_client)
    assert table + quarantined == 600
    for coord, app in apps_by_coordinate(config).items():
        in_range = coord[0] == 1 and 100 <= coord[1] < 200
        assert app == (app.upper() if in_range else app.lower()), coord


def test_replace_twice_gives_the_same_table(
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    config = pipeline_factory(2, max_records=200)
    kafka_client.produce_to_partitions(
        config.kafka.topic,
        {p: list(pageviews(300, start=300 * p, malformed_every=25)) for p in (0, 1)},
    )
    live_until_caught_up(config, spark)
    rng = OffsetRange(config.kafka.topic, 0, 10, 180)
    assert backfill(config, spark, "replace", rng) is not None
    once = rows(config)
    version = DeltaTable(config.delta.table_uri).version()
    assert backfill(config, spark, "replace", rng) is None  # identical request: nothing to do
    assert DeltaTable(config.delta.table_uri).version() == version
    assert backfill(config, spark, "replace", rng, again=True) is not None
    assert DeltaTable(config.delta.table_uri).version() > version
    assert rows(config) == once
    assert_exactly_once(config, kafka_client)


def test_replace_removes_rows_by_predicate_after_compaction(
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    config = pipeline_factory(1, max_records=100)
    kafka_client.produce(config.kafka.topic, pageviews(400), partition=0)
    live_until_caught_up(config, spark)
    spark.sql(f"OPTIMIZE delta.`{config.delta.table_uri}`").collect()
    actions = pa.table(DeltaTable(config.delta.table_uri).get_add_actions(flatten=True)).to_pylist()
    assert len(actions) == 1
    assert (actions[0]["min._batch_id"], actions[0]["max._batch_id"]) == (1, 4)

    backfill(config, spark, "replace", OffsetRange(config.kafka.topic, 0, 150, 170))
    apps = apps_by_coordinate(config)
    changed = sorted(c[1] for c, app in apps.items() if app != app.lower())
    assert changed == list(range(150, 170))
    assert_exactly_once(config, kafka_client)
    # the compacted file was swapped for a rewrite without those rows, plus the new rows
    files = pa.table(DeltaTable(config.delta.table_uri).get_add_actions(flatten=True)).to_pylist()
    assert sorted(f["num_records"] for f in files) == [20, 380]


def test_a_range_deleted_by_retention_fails_loudly_and_commits_nothing(
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    config = pipeline_factory(1)
    kafka_client.produce(config.kafka.topic, pageviews(300), partition=0)
    live_until_caught_up(config, spark)
    admin = AdminClient({"bootstrap.servers": config.kafka.bootstrap_servers})
    for future in admin.delete_records([TopicPartition(config.kafka.topic, 0, 100)]).values():
        future.result(timeout=30)
    version = DeltaTable(config.delta.table_uri).version()
    with pytest.raises(DataLossError, match=r"offsets \[50, 100\) are no longer in Kafka"):
        backfill(config, spark, "replace", OffsetRange(config.kafka.topic, 0, 50, 150))
    assert DeltaTable(config.delta.table_uri).version() == version
    assert LedgerStore(config.ledger.url).batches(app_id="pageviews.backfill") == []
