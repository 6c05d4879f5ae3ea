"""Rejected input looks like rejected input: a backfill a protocol rule refuses ends its
run with one sentence and alerts nobody (against the real broker, Spark, Delta and a real
Dagster instance), and only the refusals of a request are taken for rejections. That a real
failure still alerts, with its cause, is in tests/test_orchestration.py."""

from collections.abc import Iterator
from typing import Any

import dagster as dg
import pytest
from deltalake import DeltaTable

from jobs.examples.sample_data import pageviews
from ledger.core.errors import (
    CONFIG_PLACEHOLDER,
    BusyError,
    DataLossError,
    InconsistencyError,
    TopicChangedError,
)
from ledger.core.protocol import accept_topic_command
from ledger.store.ledger_store import LedgerStore
from orchestration.health.rejection import rejection_sentence, rejections_end_the_run
from orchestration.pipeline_definitions import PipelineDefinitions, pipeline_definitions
from orchestration.resources import PipelineResource, pipeline_key
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
        f"[50, 60) of {topic}-0; fill only offsets no batch covers, or replace committed ones."
    )
    assert shown.metadata["refused_by"].value == "BackfillError"
    assert failed.step_failure_data.error is not None
    assert failed.step_failure_data.error.stack == []
    run = instance.get_run_by_id(result.run_id)
    assert run is not None and run.tags[REJECTED_TAG] == "BackfillError"
    assert DeltaTable(config.delta.table_uri).version() == version
    assert LedgerStore(config.ledger.url).batches(app_id="pageviews.backfill") == []

    evaluate_run_failure_sensor(jobs, instance, result)
    assert webhook.posts == []


CONFIG_FILE = "/etc/exactly/pv.yaml"


def run_refusing(instance: dg.DagsterInstance, error: Exception) -> dg.ExecuteInProcessResult:
    """A one-op job of pipeline `pv` whose op raises `error` inside `rejections_end_the_run`."""

    @dg.op(required_resource_keys={pipeline_key("pv")})
    def request(context: dg.OpExecutionContext) -> None:
        with rejections_end_the_run(context, "pv", {"asked": "something"}):
            raise error

    @dg.job(resource_defs={pipeline_key("pv"): PipelineResource(config_path=CONFIG_FILE)})
    def refusing() -> None:
        request()

    return refusing.execute_in_process(instance=instance, raise_on_error=False)


def test_only_refusals_of_the_request_become_rejections(instance: dg.DagsterInstance) -> None:
    busy = BusyError("batch pv/2 is PREPARED and its owner h:1 may still be running; try again")
    refused = run_refusing(instance, busy)
    (failed,) = [e for e in refused.all_events if e.event_type_value == "STEP_FAILURE"]
    shown = failed.step_failure_data.user_failure_data
    assert shown is not None
    assert shown.description == (
        "Refused: batch pv/2 is PREPARED and its owner h:1 may still be running; try again."
    )
    assert shown.metadata["asked"].value == "something"
    # the run's event log shows the sentence alone: no stack trace, no exception class
    error = failed.step_failure_data.error
    assert error is not None and (error.message, error.stack) == (shown.description, [])
    assert error.cause is None and error.context is None
    run = instance.get_run_by_id(refused.run_id)
    assert run is not None and run.tags[REJECTED_TAG] == "BusyError"

    # a command the refusal names reads, in the UI, as the job that does it and its
    # Launchpad config (orchestration/decisions/spelling.py); the rest spelled for the file
    recreated = TopicChangedError(
        f"topic t was re-created; run `{accept_topic_command('id-2')}`; see {CONFIG_PLACEHOLDER}"
    )
    spelled = run_refusing(instance, recreated)
    (failed,) = [e for e in spelled.all_events if e.event_type_value == "STEP_FAILURE"]
    shown = failed.step_failure_data.user_failure_data
    assert shown is not None and CONFIG_PLACEHOLDER not in (shown.description or "")
    assert shown.description == (
        "Refused: topic t was re-created; run the pv_decide job with "
        f"`kind: new-topic, topic_id: id-2, reason: <why>`; see {CONFIG_FILE}."
    )

    lost = DataLossError("t-0[0,10): offsets [0, 5) are no longer in Kafka")
    assert rejection_sentence(lost) == (
        "Refused: t-0[0,10): offsets [0, 5) are no longer in Kafka; "
        "choose ranges that Kafka still holds."
    )

    broken = run_refusing(instance, InconsistencyError("the ledger and the table disagree"))
    (failed,) = [e for e in broken.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failed.step_failure_data.user_failure_data is None
    run = instance.get_run_by_id(broken.run_id)
    assert run is not None and REJECTED_TAG not in run.tags
