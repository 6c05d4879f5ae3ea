"""Table maintenance from Dagster: the compact job, against the real broker, Spark, Delta and
a real Dagster instance, while live batches (a child `exactly run`) and a replace backfill
(a thread) commit; then every coordinate is in the tables once, the replace removed exactly
its rows, a committed batch's commit is still a no-op, and the cleaner keeps every file the
table reads. Its schedule ships stopped."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from deltalake import DeltaTable

from jobs.examples.sample_data import pageviews
from jobs.wiring.pipeline import build
from ledger.core.protocol import BatchState, OffsetRange
from orchestration.pipeline_definitions import pipeline_definitions
from resources.object_storage import storage
from tests.fixtures.pipeline import assert_exactly_once, config_path, shared_spark_env
from tests.test_backfill import apps_by_coordinate, backfill, live_until_caught_up


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:
        yield inst


def test_the_compact_schedule_ships_stopped() -> None:
    from orchestration.definitions import defs

    schedule = defs.resolve_schedule_def("pageviews_compact_schedule")
    assert schedule.default_status is dg.DefaultScheduleStatus.STOPPED
    assert schedule.job_name == "pageviews_compact"
    assert defs.resolve_job_def("pageviews_compact").tags["exactly/pipeline"] == (
        "pageviews.compact"
    )


def live_child(config: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
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
        # another process committing beside the compaction, staged on this worker's shared
        # Spark server (as a Dagster run's would be): the race is the commits', not the JVM's
        env={**os.environ, **shared_spark_env()},
    )


def data_files(uri: str) -> list[str]:
    paths = DeltaTable(uri).get_add_actions(flatten=True).column("path").to_pylist()
    return [storage.join(uri, p) for p in paths]


def test_compaction_beside_live_batches_and_a_replace_keeps_exactly_once(
    spark: Any, kafka_client: Any, pipeline_factory: Any, instance: dg.DagsterInstance
) -> None:
    config = pipeline_factory(2, max_records=60)
    topic = config.kafka.topic
    kafka_client.produce_to_partitions(
        topic, {p: list(pageviews(300, start=300 * p, malformed_every=40)) for p in (0, 1)}
    )
    live_until_caught_up(config, spark)  # 5 batches, a few files each
    before = apps_by_coordinate(config)
    jobs = pipeline_definitions(config_path(config))
    kafka_client.produce(topic, pageviews(600, start=600, malformed_every=40))

    live = live_child(config)
    replaced: list[Any] = []
    replace = threading.Thread(
        target=lambda: replaced.append(
            backfill(config, spark, "replace", OffsetRange(topic, 1, 20, 220))
        )
    )
    replace.start()
    compactions = []
    try:
        while replace.is_alive() or live.poll() is None or len(compactions) < 3:
            result = jobs.compact.execute_in_process(instance=instance)
            assert result.success
            compactions.append(result)
    finally:
        replace.join(timeout=600)
        out = live.communicate(timeout=600)[0]
    assert live.returncode == 0, out
    assert replaced and replaced[0].state is BatchState.ACKED
    merged = sum(
        m.value
        for r in compactions
        for e in r.all_events
        if e.event_type_value == "STEP_OUTPUT"
        for key, m in e.step_output_data.metadata.items()
        if key.endswith("_files_removed")
    )
    assert merged > 0
    live_until_caught_up(config, spark)

    table, quarantined = assert_exactly_once(config, kafka_client)
    assert table + quarantined == 1200
    after = apps_by_coordinate(config)
    for coord, app in after.items():
        if coord[0] == 1 and 20 <= coord[1] < 220:
            assert app == before[coord].upper(), coord
        else:
            assert app == app.lower(), coord

    # compacted once more, then: a replace still removes exactly its rows ...
    assert jobs.compact.execute_in_process(instance=instance).success
    assert len(data_files(config.delta.table_uri)) == 1
    backfill(config, spark, "replace", OffsetRange(topic, 0, 100, 130))
    changed = {c for c, app in apps_by_coordinate(config).items() if app != app.lower()}
    assert changed == {(1, o) for o in range(20, 220) if (1, o) in after} | {
        (0, o) for o in range(100, 130) if (0, o) in after
    }
    assert_exactly_once(config, kafka_client)

    # ... a committed batch's commit publishes nothing (its app transaction survived) ...
    assert jobs.compact.execute_in_process(instance=instance).success
    tpc = build(config, spark_factory=lambda: spark)
    first = tpc.store.get(config.app_id, 1)
    assert first is not None and first.state is BatchState.ACKED
    version = DeltaTable(config.delta.table_uri).version()
    again = tpc.publisher.publish(first, tpc.store.files(config.app_id, 1))
    assert not again.published
    assert DeltaTable(config.delta.table_uri).version() == version

    # ... and the cleaner, with no grace period, deletes no file either table reads
    cleaned = jobs.clean.execute_in_process(
        instance=instance,
        run_config={"ops": {"pageviews_clean_staged": {"config": {"older_than": "0s"}}}},
    )
    assert cleaned.success
    (observed,) = [e for e in cleaned.all_events if e.event_type_value == "ASSET_OBSERVATION"]
    assert "last_cleaned_at" in observed.asset_observation_data.asset_observation.metadata
    for uri in (config.delta.table_uri, config.delta.quarantine_uri):
        assert all(Path(f).exists() for f in data_files(uri))
    assert spark.read.format("delta").load(config.delta.table_uri).count() == table
    assert assert_exactly_once(config, kafka_client) == (table, quarantined)

    # the table asset shows its files, bytes and when maintenance last ran
    observed = [
        e.asset_observation_data.asset_observation
        for e in compactions[-1].all_events
        if e.event_type_value == "ASSET_OBSERVATION"
    ]
    (observation,) = observed
    meta = observation.metadata
    assert meta["table_files"].value >= 1 and meta["table_bytes"].value > 0
    assert "last_compacted_at" in meta

    # and so does every commit's materialization, with both maintenance jobs' last success
    kafka_client.produce(topic, pageviews(20, start=1200))
    next_id = str(max(b.batch_id for b in tpc.store.batches(app_id=config.app_id)) + 1)
    instance.add_dynamic_partitions(jobs.batches.name, [next_id])
    run = jobs.micro_batch.execute_in_process(instance=instance, partition_key=next_id)
    (materialization,) = [
        m
        for m in run.asset_materializations_for_node("pageviews_commit")
        if m.asset_key == jobs.table.key
    ]
    meta = materialization.metadata
    assert meta["table_files"].value == len(data_files(config.delta.table_uri))
    assert meta["quarantine_files"].value == len(data_files(config.delta.quarantine_uri))
    assert {"last_compacted_at", "last_cleaned_at"} <= set(meta)
