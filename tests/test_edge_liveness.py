"""A pipeline under Dagster never stops for good, and never stops silently: against the real
broker, Spark, Delta and a real Dagster instance.

* a run that dies before the vote leaves a PLANNED or STAGED batch; the schedule's next tick
  abandons it (its owner is gone and no Dagster run of it is alive) and plans its ranges
  again (invariants 5 and 16);
* a batch that stays in any state but a final one past the stuck threshold alerts once, and
  once more when it moves on (invariant 16);
* a consumer group that refuses the advisory ack (here: it has an active member) neither
  fails the batch nor blocks the next one; it alerts after N failures in a row, and the next
  ack that succeeds catches the group up, never moving it backwards.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import dagster as dg
import pytest
from confluent_kafka import Consumer

from jobs.examples.sample_data import pageviews
from ledger.core.protocol import BatchState
from orchestration.pipeline_definitions import PipelineDefinitions, pipeline_definitions
from orchestration.tags import BATCH_TAG, PIPELINE_TAG
from tests.fixtures.pipeline import assert_exactly_once, config_path, crash_run, save_config
from tests.transforms import FAIL_STAGE_ENV

WEBHOOK = "EXACTLY_TEST_WEBHOOK_URL"


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:
        yield inst


def tick(jobs: PipelineDefinitions, instance: dg.DagsterInstance) -> Any:
    """One evaluation of the pipeline's schedule: a RunRequest or a SkipReason."""
    # closed here, not by the garbage collector: a context left open resets Dagster's current
    # instance storage whenever it is collected, to an instance a later test no longer has
    with dg.build_schedule_context(instance=instance, resources=jobs.resources) as context:
        return jobs.schedule(context)


def evaluate(jobs: PipelineDefinitions, instance: dg.DagsterInstance, suffix: str, cursor: Any):
    """One evaluation of the pipeline's sensor named `*suffix`; returns (result, new cursor)."""
    sensor = next(s for s in jobs.sensors if s.name.endswith(suffix))
    with dg.build_sensor_context(
        instance=instance, cursor=cursor, resources=jobs.resources
    ) as context:
        result = sensor(context)
        if isinstance(result, Iterator):
            result = list(result)
        return result, context.cursor


def run_batch(jobs: PipelineDefinitions, instance: dg.DagsterInstance, request: Any) -> Any:
    """The micro-batch run a schedule tick asked for, executed in this process."""
    assert isinstance(request, dg.RunRequest), request
    return jobs.micro_batch.execute_in_process(
        instance=instance,
        partition_key=request.partition_key,
        tags=request.tags,
        raise_on_error=False,
    )


# -- a run that dies before the vote -------------------------------------------------------


@pytest.mark.parametrize(
    # `make test-wide`: after_plan, whose PLANNED batch the tick abandons as it abandons
    # after_stage's STAGED one, with the staged files left for the cleaner besides
    "point",
    [pytest.param("after_plan", marks=pytest.mark.wide), "after_stage"],
)
def test_the_schedule_abandons_the_batch_of_a_run_that_died_before_the_vote(
    spark: Any,
    kafka_client: Any,
    pipeline_factory: Any,
    instance: dg.DagsterInstance,
    point: str,
) -> None:
    config = pipeline_factory(2, max_records=1000)
    kafka_client.produce(config.kafka.topic, pageviews(300, malformed_every=50))
    crash_run(config, point)  # a worker killed (-9, out of memory) before the vote
    jobs = pipeline_definitions(config_path(config))
    store = jobs.resource.pipeline().store
    dead = store.get(config.app_id, 1)
    assert dead is not None and dead.state in (BatchState.PLANNED, BatchState.STAGED)

    # while Dagster still shows a run of batch 1 as running, the tick leaves the batch alone
    # (the run may be a retry that continues it)
    run = instance.create_run_for_job(
        jobs.micro_batch,
        tags={PIPELINE_TAG: config.pipeline, BATCH_TAG: "1"},
        status=dg.DagsterRunStatus.STARTED,
    )
    waiting = tick(jobs, instance)
    assert isinstance(waiting, dg.SkipReason), waiting
    assert "batch 1" in (waiting.skip_message or "")
    assert store.get(config.app_id, 1).state is dead.state  # type: ignore[union-attr]

    instance.report_run_failed(run)
    request = tick(jobs, instance)
    assert isinstance(request, dg.RunRequest), (
        f"batch 1 stays {dead.state} for good after its run died: {request}"
    )
    assert request.partition_key == "2"
    abandoned = store.get(config.app_id, 1)
    assert abandoned is not None and abandoned.state is BatchState.ABORTED
    assert "abandoned" in (abandoned.error or "")

    result = run_batch(jobs, instance, request)
    assert result.success
    batch = result.output_for_node("pageviews_commit")
    assert (batch.batch_id, batch.state) == (2, BatchState.ACKED)
    assert batch.ranges == dead.ranges  # the same ranges, planned again
    assert assert_exactly_once(config, kafka_client) == (294, 6)


def test_the_schedule_abandons_the_batch_of_a_run_whose_stage_failed(
    spark: Any,
    kafka_client: Any,
    pipeline_factory: Any,
    instance: dg.DagsterInstance,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base = pipeline_factory(2)
    config = base.model_copy(update={"transform": "tests.transforms:pageviews_or_fail"})
    jobs = pipeline_definitions(save_config(config, config_path(base).with_name("flaky.yaml")))
    kafka_client.produce(config.kafka.topic, pageviews(200, malformed_every=40))

    monkeypatch.setenv(FAIL_STAGE_ENV, "1")
    failed = run_batch(jobs, instance, tick(jobs, instance))
    assert not failed.success
    monkeypatch.delenv(FAIL_STAGE_ENV)
    store = jobs.resource.pipeline().store
    left = store.get(config.app_id, 1)
    assert left is not None and left.state is BatchState.PLANNED

    request = tick(jobs, instance)
    assert isinstance(request, dg.RunRequest), (
        f"batch 1 stays PLANNED for good after its run failed: {request}"
    )
    assert request.partition_key == "2"
    result = run_batch(jobs, instance, request)
    assert result.success
    assert result.output_for_node("pageviews_commit").state is BatchState.ACKED
    assert store.get(config.app_id, 1).state is BatchState.ABORTED  # type: ignore[union-attr]
    assert assert_exactly_once(config, kafka_client) == (195, 5)


# -- stuck alerts --------------------------------------------------------------------------


def test_a_staged_batch_alerts_once_and_resolves_once_it_is_abandoned(
    spark: Any,
    kafka_client: Any,
    pipeline_factory: Any,
    instance: dg.DagsterInstance,
    webhook: Any,
) -> None:
    config = pipeline_factory(
        2, alerts={"stuck_prepared_after_seconds": 1, "webhook_url_env": WEBHOOK}
    )
    kafka_client.produce(config.kafka.topic, pageviews(300))
    crash_run(config, "after_stage")
    jobs = pipeline_definitions(config_path(config))
    time.sleep(1.2)

    _, cursor = evaluate(jobs, instance, "_stuck_prepared_sensor", None)
    _, cursor = evaluate(jobs, instance, "_stuck_prepared_sensor", cursor)
    assert webhook.kinds() == ["stuck_staged"], webhook.posts
    alert = webhook.posts[0]
    assert alert["title"] == "pageviews: batch 1 stuck in STAGED"
    assert alert["details"] == {
        "batch_id": 1,
        "attempt": 1,
        "state": "STAGED",
        "app_id": "pageviews",
        "owner": alert["details"]["owner"],
        "owner_alive": False,  # it died at its crash point
    }
    assert (
        "Its owner " in alert["text"]
        and " is gone and no Dagster run holds it: " in (alert["text"])
    )
    assert "has not voted" in alert["text"] and "nothing is published" in alert["text"]
    staged = jobs.resource.pipeline().store.get(config.app_id, 1)
    assert staged is not None and all(str(r) in alert["text"] for r in staged.ranges if r.span)

    request = tick(jobs, instance)  # abandons batch 1
    _, cursor = evaluate(jobs, instance, "_stuck_prepared_sensor", cursor)
    _, cursor = evaluate(jobs, instance, "_stuck_prepared_sensor", cursor)
    assert webhook.kinds() == ["stuck_staged", "resolved"]
    assert webhook.posts[1]["title"] == "pageviews: batch 1 abandoned"
    assert webhook.posts[1]["details"]["state"] == "ABORTED"

    assert run_batch(jobs, instance, request).success
    assert assert_exactly_once(config, kafka_client) == (300, 0)


# -- the advisory ack ----------------------------------------------------------------------


def join_group(bootstrap: str, group_id: str, topic: str) -> Consumer:
    """A real member of the pipeline's consumer group: while it is in the group, the broker
    refuses the admin offset commit the ack makes."""
    member = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group_id,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 30000,
        }
    )
    member.subscribe([topic])
    deadline = time.monotonic() + 60
    while not member.assignment():
        assert time.monotonic() < deadline, "the consumer never joined its group"
        member.poll(0.2)
    return member


def test_a_refused_ack_neither_fails_nor_blocks_and_the_group_catches_up_later(
    spark: Any,
    kafka_client: Any,
    kafka_broker: str,
    pipeline_factory: Any,
    instance: dg.DagsterInstance,
    webhook: Any,
) -> None:
    config = pipeline_factory(2, alerts={"webhook_url_env": WEBHOOK})
    topic, group = config.kafka.topic, config.group_id
    jobs = pipeline_definitions(config_path(config))
    live = jobs.resource.pipeline().live
    member = join_group(kafka_broker, group, topic)
    try:
        kafka_client.produce(topic, pageviews(100))
        first = run_batch(jobs, instance, tick(jobs, instance))
        kafka_client.produce(topic, pageviews(100, start=100))
        request = tick(jobs, instance)
        assert isinstance(request, dg.RunRequest), (
            f"a refused consumer-group commit blocks the pipeline: {request}"
        )
        assert first.success, "a refused consumer-group commit failed a complete batch"
        batch1 = first.output_for_node("pageviews_commit")
        assert batch1.state is BatchState.COMMITTED
        assert group in batch1.metrics["ack_error"]
        second = run_batch(jobs, instance, request)
        assert second.success
        assert second.output_for_node("pageviews_commit").state is BatchState.COMMITTED
        assert kafka_client.group_offsets(group, topic) == {}  # never moved

        # batch 1's ack was retried by run 2's recovery: three refusals in a row by now
        assert live.ack_failures_in_a_row() == 3
        _, cursor = evaluate(jobs, instance, "_stuck_prepared_sensor", None)
        _, cursor = evaluate(jobs, instance, "_stuck_prepared_sensor", cursor)
        assert webhook.kinds() == ["ack_failing"], webhook.posts
        alert = webhook.posts[0]
        assert group in alert["title"] and "3" in alert["title"]
        assert alert["details"]["batch_ids"] == [1, 2]
        # the redrive sensor does not hammer the group with a run per evaluation
        requests, _ = evaluate(jobs, instance, "_redrive_sensor", None)
        assert requests == []
    finally:
        member.close()  # leaves the group: the next ack is accepted

    kafka_client.produce(topic, pageviews(100, start=200))
    third = run_batch(jobs, instance, tick(jobs, instance))
    assert third.success
    batch3 = third.output_for_node("pageviews_commit")
    assert batch3.state is BatchState.ACKED
    states = {b.batch_id: b.state for b in live.store.batches(app_id=config.app_id)}
    assert states == {1: BatchState.ACKED, 2: BatchState.ACKED, 3: BatchState.ACKED}
    ends = {r.partition: r.end for r in batch3.ranges}
    assert kafka_client.group_offsets(group, topic) == ends
    assert sum(ends.values()) == 300
    _, cursor = evaluate(jobs, instance, "_stuck_prepared_sensor", cursor)
    assert webhook.kinds() == ["ack_failing", "resolved"]

    # a zombie still holding batch 1 as COMMITTED acks late: the group does not move back
    assert live.ack(batch1).state is BatchState.ACKED
    assert kafka_client.group_offsets(group, topic) == ends
    assert assert_exactly_once(config, kafka_client) == (300, 0)
