"""The tables' asset checks under the checks sensor, against the real broker, Spark, Delta and a
real Dagster instance: a stuck batch turns its check red and back, alerting once and
resolving once across the checks sensor and the stuck sensor; a batch that quarantines too
much fails the ratio check; a row deleted from the table behind exactly's back fails the
last batch's completeness check, which after a re-created topic counts the last batch's rows
in its own topic incarnation, not the old one's left at the same coordinates."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import dagster as dg
import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable

from jobs.examples.sample_data import pageviews
from ledger.core.protocol import BatchState
from orchestration.health.freshness import FRESHNESS
from orchestration.health.table_checks import (
    CONSUMER_LAG,
    LAST_BATCH_COMPLETE,
    NO_STUCK_BATCH,
    QUARANTINE_RATIO,
    verdicts,
)
from orchestration.pipeline_definitions import PipelineDefinitions, pipeline_definitions
from tests.fixtures.pipeline import config_path, crash_run, save_config
from tests.fixtures.topic_admin import recreate_topic

WEBHOOK = "EXACTLY_TEST_WEBHOOK_URL"
#: a check's latest execution status on the instance, as the asset's page shows it
PASSED, FAILED = "SUCCEEDED", "FAILED"
TABLE, QUARANTINE = dg.AssetKey("pageviews_table"), dg.AssetKey("pageviews_quarantine")
CHECKS = {
    NO_STUCK_BATCH: dg.AssetCheckKey(TABLE, NO_STUCK_BATCH),
    CONSUMER_LAG: dg.AssetCheckKey(TABLE, CONSUMER_LAG),
    LAST_BATCH_COMPLETE: dg.AssetCheckKey(TABLE, LAST_BATCH_COMPLETE),
    QUARANTINE_RATIO: dg.AssetCheckKey(QUARANTINE, QUARANTINE_RATIO),
}


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:
        yield inst


def evaluate(
    jobs: PipelineDefinitions, instance: dg.DagsterInstance, cursor: str | None
) -> tuple[dict[str, str], str | None]:
    """One tick of the checks sensor; its evaluations are recorded on the instance as the
    sensor daemon records them. Returns each check's latest status there, and the cursor."""
    sensor = next(s for s in jobs.sensors if s.name == "pageviews_checks_sensor")
    with dg.build_sensor_context(
        instance=instance, cursor=cursor, resources=jobs.resources
    ) as context:
        result = sensor(context)
    assert isinstance(result, dg.SensorResult), result
    for event in result.asset_events:
        instance.report_runless_asset_event(event)
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(
        list(CHECKS.values())
    )
    return {name: latest[key].status.value for name, key in CHECKS.items() if key in latest}, (
        result.cursor
    )


def latest_statuses(instance: dg.DagsterInstance) -> dict[str, str]:
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(
        list(CHECKS.values())
    )
    return {name: latest[key].status.value for name, key in CHECKS.items() if key in latest}


def test_the_run_that_commits_evaluates_every_check_with_no_sensor_tick(
    spark: Any, kafka_client: Any, pipeline_factory: Any, instance: dg.DagsterInstance
) -> None:
    """A commit materializes the table, and Dagster shows its checks "Not evaluated" until
    some evaluation follows: the committing run evaluates them itself, right after, so no
    check waits for the checks sensor (which ships stopped)."""
    config = pipeline_factory(2)
    kafka_client.produce(config.kafka.topic, pageviews(200, malformed_every=50))
    jobs = pipeline_definitions(config_path(config))
    instance.add_dynamic_partitions(jobs.batches.name, ["1"])
    result = jobs.micro_batch.execute_in_process(instance=instance, partition_key="1")
    assert result.success
    assert latest_statuses(instance) == dict.fromkeys(CHECKS, PASSED)
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(
        [CHECKS[LAST_BATCH_COMPLETE]]
    )[CHECKS[LAST_BATCH_COMPLETE]]
    assert latest.event is not None and latest.event.dagster_event is not None
    shown = latest.event.dagster_event.asset_check_evaluation_data.description
    assert shown is not None and "pageviews/1" in shown, shown
    materialized = instance.get_latest_materialization_event(TABLE)
    assert materialized is not None and latest.event.timestamp >= materialized.timestamp
    # the lag, as an observation of the topic: plotted on a time axis on its page
    (observed,) = instance.fetch_observations(dg.AssetKey("pageviews_topic"), limit=5).records
    assert observed.asset_observation is not None
    lag = {k: v.value for k, v in observed.asset_observation.metadata.items()}
    assert lag == {"total_lag": 0, "lag_partition_0": 0, "lag_partition_1": 0}


def test_the_freshness_check_measures_the_newest_committed_record_s_kafka_timestamp(
    spark: Any, kafka_client: Any, pipeline_factory: Any, instance: dg.DagsterInstance
) -> None:
    """Records produced with Kafka timestamps an hour old: the check reports their age, and
    fails once a bound below it is set; the metrics endpoint's figure is the same record's."""
    config = pipeline_factory(2, alerts={"max_staleness_seconds": 7200})
    hour_ago_ms = int((time.time() - 3600) * 1000)
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap_servers})
    for value in pageviews(50):
        producer.produce(config.kafka.topic, value, timestamp=hour_ago_ms)
    assert producer.flush(30) == 0
    jobs = pipeline_definitions(config_path(config))
    instance.add_dynamic_partitions(jobs.batches.name, ["1"])
    assert jobs.micro_batch.execute_in_process(instance=instance, partition_key="1").success
    batch = jobs.resource.pipeline().store.get(config.app_id, 1)
    assert batch is not None and batch.metrics["newest_record_ms"] == hour_ago_ms

    (fresh,) = [v for v in verdicts(jobs.resource, lambda _m: None) if v.check == FRESHNESS]
    assert fresh.passed and 3590 < fresh.metadata["staleness_seconds"] < 3700, fresh.text
    assert "within 7200s" in fresh.text

    strict = config.model_copy(
        update={"alerts": config.alerts.model_copy(update={"max_staleness_seconds": 600})}
    )
    tight = pipeline_definitions(save_config(strict, config_path(config).with_name("s.yaml")))
    (stale,) = [v for v in verdicts(tight.resource, lambda _m: None) if v.check == FRESHNESS]
    assert not stale.passed
    assert "over the bound of 600s: is the schedule on" in stale.text, stale.text


def tick_stuck_sensor(
    jobs: PipelineDefinitions, instance: dg.DagsterInstance, cursor: str | None
) -> str | None:
    """One tick of the stuck sensor on the same instance; returns its cursor."""
    sensor = next(s for s in jobs.sensors if s.name == "pageviews_stuck_prepared_sensor")
    with dg.build_sensor_context(
        instance=instance, cursor=cursor, resources=jobs.resources
    ) as context:
        sensor(context)
        return context.cursor


def test_a_stuck_batch_turns_the_check_red_and_back_and_alerts_once_across_both_sensors(
    spark: Any,
    kafka_client: Any,
    pipeline_factory: Any,
    instance: dg.DagsterInstance,
    webhook: Any,
) -> None:
    config = pipeline_factory(2, alerts={"stuck_after_seconds": 1, "webhook_url_env": WEBHOOK})
    kafka_client.produce(config.kafka.topic, pageviews(300))
    crash_run(config, "after_prepare")
    jobs = pipeline_definitions(config_path(config))
    time.sleep(1.2)

    statuses, cursor = evaluate(jobs, instance, None)
    stuck_cursor = tick_stuck_sensor(jobs, instance, None)
    assert statuses == {
        NO_STUCK_BATCH: FAILED,
        CONSUMER_LAG: PASSED,  # 300 behind, but no bound is set: the figure only
        LAST_BATCH_COMPLETE: PASSED,  # nothing committed yet
        QUARANTINE_RATIO: PASSED,
    }
    statuses, cursor = evaluate(jobs, instance, cursor)
    stuck_cursor = tick_stuck_sensor(jobs, instance, stuck_cursor)
    assert statuses[NO_STUCK_BATCH] == FAILED
    # one stuck batch, one alert: the stuck sensor's, which says who holds it and what
    # frees it (its owner died; the re-drive sensor ships stopped); the red check says so too
    assert webhook.kinds() == ["stuck_prepared"], webhook.posts
    alert = webhook.posts[0]
    assert alert["title"] == "pageviews: batch 1 stuck in PREPARED"
    # the commands it names are spelled for this pipeline's config file, ready to copy
    freed = (
        "is gone and no Dagster run holds it: pageviews_redrive_sensor is stopped: turn it "
        f"on, or run `exactly recover -c {config_path(config)}`, which commits it."
    )
    assert freed in alert["text"], alert["text"]
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(
        [CHECKS[NO_STUCK_BATCH]]
    )[CHECKS[NO_STUCK_BATCH]]
    assert latest.event is not None and latest.event.dagster_event is not None
    shown = latest.event.dagster_event.asset_check_evaluation_data.description
    assert shown is not None and "pageviews/1 PREPARED" in shown
    # in the UI, the command is the job that does it
    in_ui = freed.replace(
        f"`exactly recover -c {config_path(config)}`", "the pageviews_recover job"
    )
    assert in_ui in shown, shown
    assert f"`exactly ledger -c {config_path(config)}`" in shown

    instance.add_dynamic_partitions(jobs.batches.name, ["1"])
    assert jobs.redrive.execute_in_process(instance=instance, partition_key="1").success
    statuses, cursor = evaluate(jobs, instance, cursor)
    stuck_cursor = tick_stuck_sensor(jobs, instance, stuck_cursor)
    assert statuses == dict.fromkeys(CHECKS, PASSED)
    statuses, cursor = evaluate(jobs, instance, cursor)
    tick_stuck_sensor(jobs, instance, stuck_cursor)
    assert webhook.kinds() == ["stuck_prepared", "resolved"]
    assert webhook.posts[1]["title"] == "pageviews: batch 1 committed"


def test_too_much_quarantine_and_a_deleted_row_fail_their_checks(
    spark: Any,
    kafka_client: Any,
    pipeline_factory: Any,
    instance: dg.DagsterInstance,
    webhook: Any,
) -> None:
    config = pipeline_factory(2, alerts={"max_quarantine_ratio": 0.1, "webhook_url_env": WEBHOOK})
    kafka_client.produce(config.kafka.topic, pageviews(200, malformed_every=4))
    jobs = pipeline_definitions(config_path(config))
    with dg.build_schedule_context(instance=instance, resources=jobs.resources) as context:
        request = jobs.schedule(context)
    assert isinstance(request, dg.RunRequest), request
    run = jobs.micro_batch.execute_in_process(
        instance=instance, partition_key=request.partition_key, tags=request.tags
    )
    assert run.success
    batch = run.output_for_node("pageviews_commit")
    assert batch.state is BatchState.ACKED and batch.metrics["quarantine_records"] == 50
    quarantined = next(
        m
        for m in run.asset_materializations_for_node("pageviews_commit")
        if m.asset_key == QUARANTINE
    )
    assert quarantined.partition == "1"
    assert quarantined.metadata["row_count"].value == 50

    statuses, cursor = evaluate(jobs, instance, None)
    assert statuses[QUARANTINE_RATIO] == FAILED
    assert statuses[LAST_BATCH_COMPLETE] == PASSED
    assert webhook.kinds() == ["check_failed"]
    assert "quarantined 50 of 200 records (25.00%)" in webhook.posts[0]["text"]
    assert webhook.posts[0]["details"]["check"] == QUARANTINE_RATIO

    # one row of batch 1 deleted from the table behind exactly's back, with delta-rs
    table = DeltaTable(config.delta.table_uri)
    rows = table.to_pyarrow_table(columns=["_kafka_partition", "_kafka_offset"])
    partition, offset = rows["_kafka_partition"][0].as_py(), rows["_kafka_offset"][0].as_py()
    table.delete(f"_kafka_partition = {partition} AND _kafka_offset = {offset}")

    statuses, cursor = evaluate(jobs, instance, cursor)
    assert statuses[LAST_BATCH_COMPLETE] == FAILED
    statuses, cursor = evaluate(jobs, instance, cursor)
    assert webhook.kinds() == ["check_failed", "check_failed"]
    text = webhook.posts[1]["text"]
    assert "149 rows in the table (expected 150)" in text
    assert "50 in the quarantine (expected 50)" in text

    # run from the UI (the asset's Checks tab -> Execute): the same verdicts, and no alert
    checks_run = jobs.definitions.resolve_implicit_global_asset_job_def().execute_in_process(
        instance=instance
    )
    assert checks_run.success
    ran = {
        e.asset_check_evaluation_data.check_name: e.asset_check_evaluation_data.passed
        for e in checks_run.all_events
        if e.event_type_value == "ASSET_CHECK_EVALUATION"
    }
    assert ran == {
        NO_STUCK_BATCH: True,
        CONSUMER_LAG: True,
        LAST_BATCH_COMPLETE: False,
        QUARANTINE_RATIO: False,
        FRESHNESS: True,  # no bound set: it reports the age
    }
    assert webhook.kinds() == ["check_failed", "check_failed"]


def test_after_a_recreated_topic_the_last_batch_is_counted_in_its_own_incarnation(
    spark: Any, kafka_client: Any, pipeline_factory: Any, instance: dg.DagsterInstance
) -> None:
    config = pipeline_factory(2)
    topic, bootstrap = config.kafka.topic, config.kafka.bootstrap_servers
    kafka_client.produce_to_partitions(
        topic, {p: list(pageviews(100, start=100 * p)) for p in (0, 1)}
    )
    jobs = pipeline_definitions(config_path(config))
    first = jobs.next_batch.execute_in_process(instance=instance)
    assert first.success

    # the topic is re-created: its offsets start at 0 again, at the coordinates (topic name,
    # partition, offset) of the old incarnation's rows, which stay in the table as history
    new_id = recreate_topic(bootstrap, topic, 2)
    kafka_client.produce_to_partitions(
        topic, {p: list(pageviews(150, start=1000 + 150 * p)) for p in (0, 1)}
    )
    accept = ["skip", "new-topic", "-c", str(config_path(config)), "--topic-id", new_id]
    accepted = subprocess.run(
        [sys.executable, "-m", "exactly_cli", *accept, "--reason", "re-created"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert accepted.returncode == 0, accepted.stderr
    second = jobs.next_batch.execute_in_process(instance=instance)
    assert second.success
    last = second.output_for_node("pageviews_commit")
    assert last.topic_id == new_id
    assert first.output_for_node("pageviews_commit").topic_id != new_id
    held = DeltaTable(config.delta.table_uri).to_pyarrow_table(columns=["_batch_id"])
    assert held["_batch_id"].to_pylist().count(1) == 200  # the old incarnation's rows

    statuses, _cursor = evaluate(jobs, instance, None)
    assert statuses[LAST_BATCH_COMPLETE] == PASSED


def test_the_checks_of_a_pipeline_on_two_topics_pass_and_name_each_topic(
    spark: Any, kafka_client: Any, kafka_broker: str, instance: dg.DagsterInstance, tmp_path
) -> None:
    """A pipeline reading two topics, run from its Dagster job: every check passes, the lag
    names each topic's partitions, and a row of one topic deleted behind exactly's back
    fails the completeness check naming that topic."""
    import uuid

    from tests.fixtures.topics_config import several_topics_config

    a, b = (f"orders-{uuid.uuid4().hex[:8]}-{s}" for s in "ab")
    kafka_client.create_topic(a, 2)
    kafka_client.create_topic(b, 1)
    kafka_client.produce(a, pageviews(60))
    kafka_client.produce(b, pageviews(30, start=100))
    several_topics_config(tmp_path, kafka_broker, {"topics": [a, b]})
    path = tmp_path / "orders.yaml"
    jobs = pipeline_definitions(path)
    assert jobs.next_batch.execute_in_process(instance=instance).success

    def checks() -> dict[str, Any]:
        run = jobs.definitions.resolve_implicit_global_asset_job_def().execute_in_process(
            instance=instance
        )
        return {
            e.asset_check_evaluation_data.check_name: e.asset_check_evaluation_data
            for e in run.all_events
            if e.event_type_value == "ASSET_CHECK_EVALUATION"
        }

    ran = checks()
    assert {name: data.passed for name, data in ran.items()} == {
        NO_STUCK_BATCH: True,
        CONSUMER_LAG: True,
        LAST_BATCH_COMPLETE: True,
        QUARANTINE_RATIO: True,
        FRESHNESS: True,
    }
    lag = " ".join(str(v.value) for v in ran[CONSUMER_LAG].metadata.values())
    lag += " ".join(ran[CONSUMER_LAG].metadata)
    assert f"{a}-0" in lag and f"{a}-1" in lag and f"{b}-0" in lag, lag

    table = DeltaTable(f"{tmp_path}/table")
    table.delete(f"_kafka_topic = '{b}' AND _kafka_offset = 0")
    complete = checks()[LAST_BATCH_COMPLETE]
    assert not complete.passed
    text = " ".join(f"{k} {v.value}" for k, v in complete.metadata.items())
    text += str(complete.description or "")
    assert b in text, text
