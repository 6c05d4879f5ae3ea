"""Rejected input looks like rejected input: a backfill a protocol rule refuses ends its
run with one sentence and alerts nobody, while a real failure still alerts with its cause.
Against the real broker, Spark, Delta and a real Dagster instance."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import dagster as dg
import pytest
from deltalake import DeltaTable

from jobs.examples.sample_data import pageviews
from ledger.store import LedgerStore
from orchestration.pipeline_definitions import PipelineDefinitions, pipeline_definitions
from orchestration.tags import REJECTED_TAG
from tests.fixtures.pipeline import config_path


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:
        yield inst


def evaluate_run_failure_sensor(
    jobs: PipelineDefinitions, instance: dg.DagsterInstance, result: dg.ExecuteInProcessResult
) -> None:
    failure = next(e for e in result.all_events if e.event_type_value == "PIPELINE_FAILURE")
    sensor = next(s for s in jobs.sensors if s.name.endswith("_run_failure_sensor"))
    context = dg.build_run_status_sensor_context(
        sensor_name=sensor.name,
        dagster_event=failure,
        dagster_instance=instance,
        dagster_run=instance.get_run_by_id(result.run_id),
        resources=jobs.resources,
    )
    sensor(context)


def test_a_refused_fill_ends_in_one_sentence_and_alerts_nobody(
    spark: Any,
    kafka_client: Any,
    pipeline_factory: Any,
    instance: dg.DagsterInstance,
    webhook: Any,
) -> None:
    config = pipeline_factory(1, alerts={"webhook_url_env": "EXACTLY_TEST_WEBHOOK_URL"})
    kafka_client.produce(config.kafka.topic, pageviews(100), partition=0)
    jobs = pipeline_definitions(config_path(config))
    instance.add_dynamic_partitions(jobs.batches.name, ["1"])
    assert jobs.micro_batch.execute_in_process(instance=instance, partition_key="1").success
    version = DeltaTable(config.delta.table_uri).version()

    fill = {"mode": "fill", "ranges": [{"partition": 0, "start": 50, "end": 60}]}
    result = jobs.backfill.execute_in_process(
        instance=instance,
        run_config={"ops": {"pageviews_backfill_ranges": {"config": fill}}},
        raise_on_error=False,
    )
    assert not result.success
    (failed,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    shown = failed.step_failure_data.user_failure_data
    assert shown is not None
    topic = config.kafka.topic
    assert shown.description == (
        f"Refused: fill {topic}-0[50,60) overlaps committed data: batch pageviews/1 covers "
        f"[50, 60) of {topic}-0; change the ranges or the mode and launch again."
    )
    assert shown.metadata["refused_by"].value == "BackfillError"
    run = instance.get_run_by_id(result.run_id)
    assert run is not None and run.tags[REJECTED_TAG] == "BackfillError"
    assert DeltaTable(config.delta.table_uri).version() == version
    assert LedgerStore(config.ledger.url).batches(app_id="pageviews.backfill") == []

    evaluate_run_failure_sensor(jobs, instance, result)
    assert webhook.posts == []
