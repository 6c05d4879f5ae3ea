"""The Dagster code location against the real broker, Spark and Delta: definitions load, the
job takes a batch through every state, the re-drive sensor finishes a batch left PREPARED,
and alerts reach a real webhook exactly once."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
import yaml
from dagster._core.storage.dagster_run import DagsterRun
from deltalake import DeltaTable

from jobs.examples.sample_data import pageviews
from ledger.core.batch import Batch, utcnow
from ledger.core.protocol import BatchState
from ledger.core.stuck import decide_stuck
from ledger.store.ledger_store import LedgerStore
from orchestration.pipeline_definitions import PipelineDefinitions, pipeline_definitions
from orchestration.tags import BATCH_TAG, PIPELINE_TAG
from tests.fixtures.batches import a_batch
from tests.fixtures.pipeline import assert_exactly_once, config_path, crash_run, save_config
from tests.test_restage_pipeline import delete_one_voted_file

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:
        yield inst


def sensor(jobs: PipelineDefinitions, suffix: str) -> Any:
    return next(s for s in jobs.sensors if s.name.endswith(suffix))


def sensor_context(
    jobs: PipelineDefinitions, instance: dg.DagsterInstance, cursor: str | None = None
) -> dg.SensorEvaluationContext:
    """A sensor evaluation with the pipeline's resources, as the code location gives them."""
    return dg.build_sensor_context(instance=instance, cursor=cursor, resources=jobs.resources)


def tick(jobs: PipelineDefinitions, instance: dg.DagsterInstance) -> Any:
    """One evaluation of the pipeline's schedule: a RunRequest or a SkipReason."""
    # closed here, not by the garbage collector (see tests/test_edge_liveness.py `tick`)
    with dg.build_schedule_context(instance=instance, resources=jobs.resources) as context:
        return jobs.schedule(context)


def test_definitions_load_for_the_demo_pipeline() -> None:
    from orchestration.definitions import defs

    job = defs.resolve_job_def("pageviews_micro_batch")
    deps = job.graph.dependency_structure
    upstream = {
        node.name: sorted({o.node_name for o in deps.all_upstream_outputs_from_node(node.name)})
        for node in job.nodes
    }
    assert upstream == {
        "pageviews_plan": [],
        "pageviews_stage": ["pageviews_plan"],
        "pageviews_prepare": ["pageviews_stage"],
        "pageviews_commit": ["pageviews_prepare"],
    }
    assert job.partitions_def == dg.DynamicPartitionsDefinition(name="pageviews_batches")
    assert defs.resolve_schedule_def("pageviews_schedule").cron_schedule == "*/5 * * * *"
    assert {s.name for s in defs.sensors} == {
        "pageviews_redrive_sensor",
        "pageviews_stuck_prepared_sensor",
        "pageviews_run_failure_sensor",
        "pageviews_history_sensor",
        "pageviews_checks_sensor",
    }
    assert defs.resolve_job_def("pageviews_redrive").partitions_def == job.partitions_def
    assert defs.resolve_assets_def("pageviews_table") is not None


def _examples(text: str) -> list[str]:
    """The YAML after each `example:` in a text, up to the end of its line or sentence."""
    found = []
    for part in re.split(r"(?i)example:", text)[1:]:
        found.append(part.strip().split("\n")[0].rstrip("."))
    return found


def test_every_example_shown_in_a_job_description_and_the_readme_parses() -> None:
    """An operator pastes the Launchpad examples the UI shows, and the README's YAML: each
    must parse, and a Launchpad example must be the job's own op config."""
    from orchestration.definitions import defs

    jobs = [j for j in defs.resolve_all_job_defs() if not j.name.startswith("__")]
    shown = 0
    for job in jobs:
        for example in _examples(job.description or ""):
            doc = yaml.safe_load(example)
            assert isinstance(doc, dict) and set(doc) == {"ops"}, (job.name, example)
            assert set(doc["ops"]) <= {node.name for node in job.nodes}, (job.name, example)
            shown += 1
    from orchestration.batches.backfill_job import BackfillRequest

    for field in BackfillRequest.model_fields.values():
        for example in _examples(field.description or ""):
            assert isinstance(yaml.safe_load(example), list), example
            shown += 1
    assert shown >= 2
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", readme, flags=re.S)
    assert blocks
    for block in blocks:
        yaml.safe_load(block)


def test_the_code_location_loads_when_its_shared_spark_server_cannot_be_set_up(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Warming the shared Spark server is a convenience of the code location's load: a bad
    EXACTLY_SPARK_SERVER or object-store environment must fail the runs that stage (one
    line each), not take every job, sensor and asset of the UI down with it."""
    from orchestration.definitions import build_definitions

    monkeypatch.setenv("EXACTLY_SPARK_SERVER", "remote")
    monkeypatch.setenv("EXACTLY_STATE_DIR", str(tmp_path))
    defs = build_definitions()
    assert defs.resolve_job_def("pageviews_micro_batch") is not None


def test_each_pipeline_is_an_asset_group_of_its_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Two pipelines in one code location: each one's topic, table, quarantine and derived
    outputs form a group named for it, so the UI shows one pipeline's health in one view. A
    name with '.' and '-', which the config allows, is spelled with '_' in every Dagster
    name (orchestration/names.py): the location failed to load on it before."""
    from orchestration.definitions import build_definitions

    folder = tmp_path / "pipelines"
    folder.mkdir()
    demo = yaml.safe_load((REPO / "pipelines" / "pageviews.yaml").read_text())
    for name in ("pageviews", "orders-eu.v2"):
        doc = {**demo, "pipeline": name}
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("EXACTLY_PIPELINES_DIR", str(folder))
    graph = build_definitions().resolve_asset_graph()
    groups = {str(key.path[0]): graph.get(key).group_name for key in graph.get_all_asset_keys()}
    assert groups["pageviews_table"] == groups["pageviews_topic"] == "pageviews"
    assert groups["pageviews_views_per_app"] == "pageviews"
    assert groups["orders_eu_v2_quarantine"] == groups["orders_eu_v2_table"] == "orders_eu_v2"
    assert set(groups.values()) == {"pageviews", "orders_eu_v2"}


def test_dagster_validates_the_workspace() -> None:
    dagster = Path(sys.executable).parent / "dagster"
    result = subprocess.run(
        [str(dagster), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_job_takes_a_batch_through_every_state(
    spark: Any, kafka_client: Any, pipeline_factory: Any, instance: dg.DagsterInstance
) -> None:
    config = pipeline_factory(2)
    jobs = pipeline_definitions(config_path(config))
    assert isinstance(tick(jobs, instance), dg.SkipReason)  # nothing produced yet
    kafka_client.produce(config.kafka.topic, pageviews(400, malformed_every=50))

    request = tick(jobs, instance)
    assert isinstance(request, dg.RunRequest) and request.partition_key == "1"
    result = jobs.micro_batch.execute_in_process(
        instance=instance, partition_key="1", tags=request.tags
    )
    assert result.success
    batch = result.output_for_node("pageviews_commit")
    assert batch.state is BatchState.ACKED and batch.batch_id == 1
    assert set(batch.metrics["phase_s"]) == {"plan", "stage", "prepare", "commit"}
    assert assert_exactly_once(config, kafka_client) == (392, 8)

    materialization, _quarantine = result.asset_materializations_for_node("pageviews_commit")
    assert materialization.partition == "1"
    meta = {k: v.value for k, v in materialization.metadata.items()}
    assert meta["row_count"] == 392 and meta["last_batch_id"] == "1"
    assert meta["records_read"] == 400 and meta["quarantine_records"] == 8
    assert meta["consumer_lag_total"] == meta["consumer_lag_p0"] == meta["consumer_lag_p1"] == 0
    assert len(meta["ranges"].split()) == 2
    run = instance.get_run_by_id(result.run_id)
    assert run is not None and run.tags[BATCH_TAG] == "1"

    # caught up: the schedule skips, and a run for a new partition plans nothing
    assert isinstance(tick(jobs, instance), dg.SkipReason)
    instance.add_dynamic_partitions(jobs.batches.name, ["2"])
    idle = jobs.micro_batch.execute_in_process(instance=instance, partition_key="2")
    assert idle.success
    skipped = {e.step_key for e in idle.all_events if e.event_type_value == "STEP_SKIPPED"}
    assert skipped == {"pageviews_stage", "pageviews_prepare", "pageviews_commit"}


def test_redrive_sensor_finishes_a_batch_left_prepared(
    spark: Any, kafka_client: Any, pipeline_factory: Any, instance: dg.DagsterInstance
) -> None:
    config = pipeline_factory(3, max_records=1000)
    kafka_client.produce(config.kafka.topic, pageviews(900, malformed_every=45))
    crash_run(config, "after_prepare")
    jobs = pipeline_definitions(config_path(config))
    assert isinstance(tick(jobs, instance), dg.SkipReason)  # batch 1 in flight

    redrive = sensor(jobs, "_redrive_sensor")
    requests = list(redrive(sensor_context(jobs, instance)))
    assert [(r.partition_key, r.run_key) for r in requests] == [("1", "pageviews:1:1")]
    result = jobs.redrive.execute_in_process(
        instance=instance, partition_key="1", tags=requests[0].tags
    )
    assert result.success
    batch = result.output_for_node("pageviews_redrive_commit")
    assert batch.state is BatchState.ACKED and batch.attempt == 2
    assert assert_exactly_once(config, kafka_client) == (880, 20)
    assert list(redrive(sensor_context(jobs, instance))) == []

    # a second re-drive of the same batch publishes nothing more
    again = jobs.redrive.execute_in_process(instance=instance, partition_key="1")
    assert again.success
    assert not [e for e in again.all_events if e.event_type_value == "STEP_OUTPUT"]
    assert assert_exactly_once(config, kafka_client) == (880, 20)


def test_a_pipeline_named_with_dots_and_dashes_runs_and_recovers_under_dagster(
    spark: Any, kafka_client: Any, pipeline_factory: Any, instance: dg.DagsterInstance
) -> None:
    """`orders-eu.v2` is a valid pipeline name (the ledger's application id), not a valid
    Dagster name: its jobs, ops, sensors and assets are spelled `orders_eu_v2_...`, while
    its run tags keep the real name, which is what the liveness checks look runs up by."""
    config = pipeline_factory(2, name="orders-eu.v2")
    kafka_client.produce(config.kafka.topic, pageviews(200))
    crash_run(config, "after_prepare")
    jobs = pipeline_definitions(config_path(config))
    assert jobs.micro_batch.name == "orders_eu_v2_micro_batch"

    redrive = sensor(jobs, "_redrive_sensor")
    (request,) = list(redrive(sensor_context(jobs, instance)))
    assert request.run_key == "orders-eu.v2:1:1"
    # while Dagster shows a run of the batch as running, the sensor launches none
    instance.add_run(
        DagsterRun(
            job_name=jobs.redrive.name,
            tags={PIPELINE_TAG: "orders-eu.v2", BATCH_TAG: "1"},
            status=dg.DagsterRunStatus.STARTED,
        )
    )
    assert list(redrive(sensor_context(jobs, instance))) == []
    done = jobs.redrive.execute_in_process(instance=instance, partition_key="1", tags=request.tags)
    assert done.output_for_node("orders_eu_v2_redrive_commit").state is BatchState.ACKED

    kafka_client.produce(config.kafka.topic, pageviews(100, start=200))
    nxt = tick(jobs, instance)
    assert isinstance(nxt, dg.RunRequest) and nxt.partition_key == "2"
    result = jobs.micro_batch.execute_in_process(
        instance=instance, partition_key="2", tags=nxt.tags
    )
    table, _quarantine = result.asset_materializations_for_node("orders_eu_v2_commit")
    assert table.asset_key == dg.AssetKey("orders_eu_v2_table") and table.partition == "2"
    run = instance.get_run_by_id(result.run_id)
    assert run is not None and run.tags[PIPELINE_TAG] == "orders-eu.v2"
    assert assert_exactly_once(config, kafka_client) == (300, 0)


def test_redrive_sensor_finishes_a_restaging_batch_whose_run_died(
    spark: Any, kafka_client: Any, pipeline_factory: Any, instance: dg.DagsterInstance
) -> None:
    config = pipeline_factory(2)
    kafka_client.produce(config.kafka.topic, pageviews(400, malformed_every=50))
    crash_run(config, "after_prepare")
    delete_one_voted_file(config, "table")
    # the next start finds the file gone, re-stages the batch and dies before its new vote
    crash_run(config, "after_stage")
    jobs = pipeline_definitions(config_path(config))
    redrive = sensor(jobs, "_redrive_sensor")
    requests = list(redrive(sensor_context(jobs, instance)))
    assert [(r.partition_key, r.run_key) for r in requests] == [("1", "pageviews:1:3")]

    result = jobs.redrive.execute_in_process(
        instance=instance, partition_key="1", tags=requests[0].tags
    )
    assert result.success
    batch = result.output_for_node("pageviews_redrive_commit")
    assert (batch.state, batch.attempt) == (BatchState.ACKED, 4)
    assert assert_exactly_once(config, kafka_client) == (392, 8)
    materialization, _quarantine = result.asset_materializations_for_node(
        "pageviews_redrive_commit"
    )
    meta = {k: v.value for k, v in materialization.metadata.items()}
    assert meta["files_missing"] == 1 and meta["files_already_committed"] == 0
    assert meta["files_committed"] == meta["files_staged"] > 0
    assert meta["restages"] == 1
    assert list(redrive(sensor_context(jobs, instance))) == []


def test_stuck_alert_fires_once_and_resolves_after_the_commit(
    spark: Any,
    kafka_client: Any,
    pipeline_factory: Any,
    instance: dg.DagsterInstance,
    webhook: Any,
) -> None:
    config = pipeline_factory(
        2,
        alerts={"stuck_prepared_after_seconds": 1, "webhook_url_env": "EXACTLY_TEST_WEBHOOK_URL"},
    )
    kafka_client.produce(config.kafka.topic, pageviews(300))
    crash_run(config, "after_prepare")
    jobs = pipeline_definitions(config_path(config))
    stuck = sensor(jobs, "_stuck_prepared_sensor")
    time.sleep(1.2)

    context = sensor_context(jobs, instance)
    stuck(context)
    stuck(sensor_context(jobs, instance, context.cursor))
    assert webhook.kinds() == ["stuck_prepared"]
    alert = webhook.posts[0]
    assert alert["pipeline"] == "pageviews" and alert["details"]["batch_id"] == 1
    assert "PREPARED" in alert["title"]
    assert webhook.paths == ["/hooks/secret-token-123"]

    instance.add_dynamic_partitions(jobs.batches.name, ["1"])
    assert jobs.redrive.execute_in_process(instance=instance, partition_key="1").success
    context2 = sensor_context(jobs, instance, context.cursor)
    stuck(context2)
    stuck(sensor_context(jobs, instance, context2.cursor))
    assert webhook.kinds() == ["stuck_prepared", "resolved"]
    assert webhook.posts[1]["details"]["state"] == "ACKED"
    # the secret URL is in no alert, cursor or config the UI shows
    for shown in (json.dumps(webhook.posts), context2.cursor, config.model_dump_json()):
        assert "secret-token-123" not in (shown or "")


def test_failed_runs_alert_through_the_same_sinks(
    pipeline_factory: Any, instance: dg.DagsterInstance, webhook: Any
) -> None:
    config = pipeline_factory(1, alerts={"webhook_url_env": "EXACTLY_TEST_WEBHOOK_URL"})
    bad = config.model_copy(
        update={
            "kafka": config.kafka.model_copy(update={"topic": "no-such-topic-exists-here"}),
        }
    )
    jobs = pipeline_definitions(save_config(bad, config_path(config).with_name("bad.yaml")))
    instance.add_dynamic_partitions(jobs.batches.name, ["1"])
    result = jobs.micro_batch.execute_in_process(
        instance=instance, partition_key="1", raise_on_error=False
    )
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "PIPELINE_FAILURE")
    context = dg.build_run_status_sensor_context(
        sensor_name="pageviews_run_failure_sensor",
        dagster_event=failure,
        dagster_instance=instance,
        dagster_run=instance.get_run_by_id(result.run_id),
        resources=jobs.resources,
    ).for_run_failure()
    sensor(jobs, "_run_failure_sensor")(context)
    assert webhook.kinds() == ["run_failed"]
    assert webhook.posts[0]["details"]["job"] == "pageviews_micro_batch"
    # the cause, not only the step names: the error line the op raised
    assert "pageviews_plan: " in webhook.posts[0]["text"]
    assert "no-such-topic-exists-here" in webhook.posts[0]["text"]
    assert "Traceback" not in webhook.posts[0]["text"]


def _batch(batch_id: int, state: BatchState, prepared_ago_s: float | None) -> Batch:
    now = utcnow()
    return a_batch(
        batch_id,
        state,
        at=now,
        prepared_at=None if prepared_ago_s is None else now - timedelta(seconds=prepared_ago_s),
        committed_at=None,
    )


def test_decide_stuck_alerts_once_and_resolves_once() -> None:
    old, young = _batch(1, BatchState.PREPARED, 600), _batch(2, BatchState.PREPARED, 10)
    first = decide_stuck({}, [old, young], {}, utcnow(), 300)
    assert [b.batch_id for b in first.stuck] == [1] and first.open_after == {"pv/1": "PREPARED"}
    second = decide_stuck(first.open_after, [old, young], {"pv/1": old}, utcnow(), 300)
    assert second.stuck == [] and second.resolved == [] and second.open_after == first.open_after
    committed = _batch(1, BatchState.COMMITTED, 600)
    third = decide_stuck(second.open_after, [young], {"pv/1": committed}, utcnow(), 300)
    assert [(b.batch_id, was) for b, was in third.resolved] == [(1, BatchState.PREPARED)]
    assert third.open_after == {}


def test_instance_settings_allow_one_run_per_pipeline(tmp_path: Path) -> None:
    (tmp_path / "dagster.yaml").write_text((REPO / "orchestration" / "dagster.yaml").read_text())
    with dg.DagsterInstance.from_config(str(tmp_path)) as inst:
        limits = inst.get_concurrency_config().run_queue_config.tag_concurrency_limits
    assert limits == [
        {"key": "exactly/pipeline", "value": {"applyLimitPerUniqueValue": True}, "limit": 1}
    ]


def test_backfill_job_and_partition_backfill_replace_ranges(
    spark: Any, kafka_client: Any, pipeline_factory: Any, instance: dg.DagsterInstance
) -> None:
    config = pipeline_factory(2)
    topic = config.kafka.topic
    kafka_client.produce_to_partitions(
        topic, {p: list(pageviews(150, start=150 * p)) for p in (0, 1)}
    )
    jobs = pipeline_definitions(config_path(config))
    instance.add_dynamic_partitions(jobs.batches.name, ["1"])
    assert jobs.micro_batch.execute_in_process(instance=instance, partition_key="1").success

    def apps() -> dict[tuple[int, int], str]:
        table = DeltaTable(config.delta.table_uri).to_pyarrow_table()
        return {(r["_kafka_partition"], r["_kafka_offset"]): r["app"] for r in table.to_pylist()}

    # the backfill job's launchpad: ranges, mode and a fixed transform
    run_config = {
        "ops": {
            "pageviews_backfill_ranges": {
                "config": {
                    "mode": "replace",
                    "ranges": [{"partition": 0, "start": 10, "end": 50}],
                    "transform": "tests.transforms:pageviews_v2",
                }
            }
        }
    }
    result = jobs.backfill.execute_in_process(instance=instance, run_config=run_config)
    assert result.success
    replaced = result.output_for_node("pageviews_backfill_ranges")
    assert replaced.state is BatchState.ACKED and replaced.app_id == "pageviews.backfill"
    upper = sorted(c for c, app in apps().items() if app != app.lower())
    assert upper == [(0, o) for o in range(10, 50)]

    # a plain re-run of a committed batch's partition fails and plans nothing
    rerun = jobs.micro_batch.execute_in_process(
        instance=instance, partition_key="1", raise_on_error=False
    )
    assert not rerun.success
    started = {e.step_key for e in rerun.all_events if e.event_type_value == "STEP_START"}
    assert started == {"pageviews_plan"}
    # a confirmed re-run reprocesses the batch with the pipeline's transform
    fixed = pipeline_definitions(
        save_config(
            config.model_copy(update={"transform": "tests.transforms:pageviews_v2"}),
            config_path(config).with_name("fixed.yaml"),
        )
    )
    result = fixed.micro_batch.execute_in_process(
        instance=instance,
        partition_key="1",
        run_config={"ops": {"pageviews_plan": {"config": {"reprocess": True}}}},
    )
    assert result.success
    batch = result.output_for_node("pageviews_commit")
    assert batch.kind == "backfill" and batch.state is BatchState.ACKED
    assert all(app == app.upper() for app in apps().values())
    materialization, _quarantine = result.asset_materializations_for_node("pageviews_commit")
    assert materialization.partition == "1"
    assert (
        materialization.metadata["reprocessed_by"].value == f"pageviews.backfill/{batch.batch_id}"
    )
    assert assert_exactly_once(config, kafka_client) == (300, 0)


def test_the_backfill_job_on_two_topics_replaces_the_ranges_of_the_topic_each_names(
    spark: Any, kafka_client: Any, kafka_broker: str, instance: dg.DagsterInstance, tmp_path
) -> None:
    """The Launchpad's ranges name their topic on a pipeline reading several: a replace of
    one topic's offsets rewrites those rows only, every record of both topics still once;
    a range without its topic fails the run in one sentence and plans nothing."""
    from tests.fixtures.topics_config import several_topics_config

    a, b = (f"orders-{uuid.uuid4().hex[:8]}-{s}" for s in "ab")
    kafka_client.create_topic(a, 1)
    kafka_client.create_topic(b, 1)
    kafka_client.produce(a, pageviews(40))
    kafka_client.produce(b, pageviews(40, start=100))
    config = several_topics_config(tmp_path, kafka_broker, {"topics": [a, b]})
    jobs = pipeline_definitions(tmp_path / "orders.yaml")
    assert jobs.next_batch.execute_in_process(instance=instance).success

    def ranges_config(*ranges: dict[str, Any]) -> dict[str, Any]:
        return {
            "ops": {
                "orders_backfill_ranges": {
                    "config": {
                        "mode": "replace",
                        "ranges": list(ranges),
                        "transform": "tests.transforms:pageviews_v2",
                    }
                }
            }
        }

    unnamed = jobs.backfill.execute_in_process(
        instance=instance,
        run_config=ranges_config({"partition": 0, "start": 5, "end": 15}),
        raise_on_error=False,
    )
    assert not unnamed.success
    (failure,) = [e for e in unnamed.all_events if e.event_type_value == "STEP_FAILURE"]
    message = failure.step_failure_data.error.message.strip()
    assert "reads several topics" in message and "give each range its topic" in message
    assert "\n" not in message, message
    store = LedgerStore(config.ledger.url)
    try:
        assert store.batches(app_id="orders.backfill") == []
    finally:
        store.dispose()

    named = jobs.backfill.execute_in_process(
        instance=instance,
        run_config=ranges_config({"topic": b, "partition": 0, "start": 5, "end": 15}),
    )
    assert named.success
    table = DeltaTable(config.delta.table_uri).to_pyarrow_table().to_pylist()
    upper = sorted(
        (r["_kafka_topic"], r["_kafka_offset"]) for r in table if r["app"] != r["app"].lower()
    )
    assert upper == [(b, o) for o in range(5, 15)]
    coordinates = Counter((r["_kafka_topic"], r["_kafka_offset"]) for r in table)
    assert set(coordinates.values()) == {1}
    assert len(coordinates) == 80


def test_the_next_scheduled_run_finishes_a_backfill_whose_process_died(
    spark: Any, kafka_client: Any, pipeline_factory: Any, instance: dg.DagsterInstance
) -> None:
    """A replace whose `exactly backfill` died after its vote is finished by the next
    scheduled micro-batch run, not only by the re-drive sensor or a second backfill: every
    start recovers the backfills' application id too (docs/protocol.md)."""
    from tests.test_backfill import cli

    config = pipeline_factory(2)
    topic = config.kafka.topic
    kafka_client.produce_to_partitions(
        topic, {p: list(pageviews(150, start=150 * p)) for p in (0, 1)}
    )
    jobs = pipeline_definitions(config_path(config))
    assert jobs.next_batch.execute_in_process(instance=instance).success
    args = ["--partition", "0", "--from", "10", "--to", "50", "--mode", "replace"]
    crashed = cli(
        "backfill",
        "-c",
        str(config_path(config)),
        *args,
        "--transform",
        "tests.transforms:pageviews_v2",
        env={"EXACTLY_CRASH_AT": "after_prepare"},
    )
    assert crashed.returncode == 137, crashed.stdout + crashed.stderr
    kafka_client.produce_to_partitions(topic, {0: list(pageviews(20, start=300)), 1: []})

    result = jobs.next_batch.execute_in_process(instance=instance)
    assert result.success
    store = jobs.resource.pipeline().store
    (replace,) = store.batches(app_id="pageviews.backfill")
    assert replace.state is BatchState.ACKED and replace.attempt == 2
    table = DeltaTable(config.delta.table_uri).to_pyarrow_table().to_pylist()
    upper = sorted(
        (r["_kafka_partition"], r["_kafka_offset"]) for r in table if r["app"] != r["app"].lower()
    )
    assert upper == [(0, o) for o in range(10, 50)]
    assert assert_exactly_once(config, kafka_client) == (320, 0)


@pytest.mark.parametrize(("configured", "expected"), [(None, [30, 30, 30, 60]), (7, [7, 7, 7, 7])])
def test_the_sensors_tick_at_the_configured_interval(
    tmp_path: Path, configured: int | None, expected: list[int]
) -> None:
    doc: dict[str, Any] = {
        "pipeline": "ticks",
        "kafka": {"bootstrap_servers": "127.0.0.1:9", "topic": "t"},
        "delta": {"table_uri": str(tmp_path / "t"), "quarantine_uri": str(tmp_path / "q")},
        "ledger": {"url": f"sqlite:///{tmp_path / 'ledger.db'}"},
    }
    if configured is not None:
        doc["schedule"] = {"sensor_interval_seconds": configured}
    path = tmp_path / "ticks.yaml"
    path.write_text(json.dumps(doc))
    jobs = pipeline_definitions(path)
    names = ["redrive_sensor", "stuck_prepared_sensor", "history_sensor", "checks_sensor"]
    intervals = [sensor(jobs, f"_{n}").minimum_interval_seconds for n in names]
    assert intervals == expected


def test_derived_outputs_are_assets_materialized_per_batch_and_checked_against_the_raw_table(
    spark: Any,
    kafka_client: Any,
    pipeline_factory: Any,
    instance: dg.DagsterInstance,
    postgres_url: str,
    tmp_path: Path,
) -> None:
    """An aggregate, an upsert and a PostgreSQL output through the micro-batch job: each is an
    asset
    downstream of the table, materialized with its batch's merge outcome on the batch's
    partition, by the run or, for a batch the CLI committed, by the history sensor;
    `<name>_matches_recomputation` passes through the checks sensor, and fails,
    naming the group or the key, once the derived table is changed behind exactly's back."""
    from jobs.wiring.pipeline import build
    from orchestration.health.checks_sensor import loads
    from tests.fixtures.derived import TRANSFORM, derived_outputs, postgres_output, user_events

    per_app, _per_minute, latest = derived_outputs(tmp_path / "derived")
    dashboard = postgres_output(postgres_url, f"views_{uuid.uuid4().hex[:12]}")
    config = pipeline_factory(
        2, max_records=60, transform=TRANSFORM, derived=[per_app, latest, dashboard]
    )
    kafka_client.produce_records(config.kafka.topic, user_events(0, 120, 2))
    jobs = pipeline_definitions(config_path(config))
    table = dg.AssetKey("pageviews_table")
    keys = [dg.AssetKey("pageviews_views_per_app"), dg.AssetKey("pageviews_latest_per_user")]
    keys.append(dg.AssetKey("pageviews_views_dashboard"))
    graph = jobs.definitions.resolve_asset_graph()
    assert [graph.get(key).parent_keys for key in keys] == [{table}, {table}, {table}]

    for partition in ("1", "2"):
        instance.add_dynamic_partitions(jobs.batches.name, [partition])
        result = jobs.micro_batch.execute_in_process(instance=instance, partition_key=partition)
        assert result.success
        batch = result.output_for_node("pageviews_commit")
        logged = result.asset_materializations_for_node("pageviews_commit")
        assert [m.asset_key for m in logged][2:] == keys
        for spec, materialization in zip(config.derived, logged[2:], strict=True):
            meta = {k: v.value for k, v in materialization.metadata.items()}
            outcome = batch.metrics["derived"][spec.name]
            assert materialization.partition == partition
            assert meta["batch"] == f"pageviews/{partition}" and meta["applied"] is True
            if spec.kind == "postgres":
                assert meta["held_batch_id"] == int(partition) and meta["rows_upserted"] > 0
                continue
            assert meta["merge_version"] == meta["table_version"] == outcome["version"]
            assert meta["rows_inserted"] == outcome["rows_inserted"]
            assert meta["last_batch_id"] == partition
            held = DeltaTable(spec.table_uri, version=outcome["version"]).to_pyarrow_table()
            assert meta["row_count"] == held.num_rows > 0
    assert batch.batch_id == 2 and batch.metrics["derived"]["views_per_app"]["rows_updated"] > 0

    # a batch committed outside Dagster (the CLI): the history sensor materializes it
    kafka_client.produce_records(config.kafka.topic, user_events(120, 40, 2))
    report = build(config, spark_factory=lambda: spark).run_batch()
    assert report is not None and report.batch.batch_id == 3
    history = next(s for s in jobs.sensors if s.name == "pageviews_history_sensor")
    with dg.build_sensor_context(instance=instance, resources=jobs.resources) as context:
        history(context)
    for spec, key in zip(config.derived, keys, strict=True):
        records = instance.fetch_materializations(key, limit=10).records
        found = [r.asset_materialization for r in records]
        assert sorted(m.partition for m in found if m is not None) == ["1", "2", "3"]
        (third,) = [m for m in found if m is not None and m.partition == "3"]
        outcome = report.batch.metrics["derived"][spec.name]
        assert third.metadata["batch"].value == "pageviews/3"
        if spec.kind == "postgres":
            assert third.metadata["held_batch_id"].value == 3
            continue
        assert third.metadata["merge_version"].value == outcome["version"]

    checks = next(s for s in jobs.sensors if s.name == "pageviews_checks_sensor")
    names = ["views_per_app_matches_recomputation", "latest_per_user_matches_recomputation"]
    names.append("views_dashboard_matches_recomputation")

    def evaluate(cursor: str | None) -> tuple[dict[str, Any], str | None]:
        with dg.build_sensor_context(
            instance=instance, cursor=cursor, resources=jobs.resources
        ) as context:
            result = checks(context)
        assert isinstance(result, dg.SensorResult)
        evaluations = [e for e in result.asset_events if isinstance(e, dg.AssetCheckEvaluation)]
        found = {e.check_name: e for e in evaluations if e.check_name in names}
        assert sorted(found) == sorted(names)
        return found, result.cursor

    passed, cursor = evaluate(None)
    assert all(e.passed for e in passed.values()), [e.description for e in passed.values()]
    # 4 apps; the tombstones are no page views, so no null app
    assert "all 4 groups equal" in (passed[names[0]].description or "")
    assert loads(cursor) == []

    # behind exactly's back: one more view for web, one user's latest record gone
    DeltaTable(per_app["table_uri"]).update(updates={"views": "views + 1"}, predicate="app = 'web'")
    held = DeltaTable(latest["table_uri"]).to_pyarrow_table(columns=["user", "_deleted"])
    gone = sorted(r["user"] for r in held.to_pylist() if not r["_deleted"])[0]  # a live one
    DeltaTable(latest["table_uri"]).delete(f"user = '{gone}'")
    engine = sa.create_engine(postgres_url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"DELETE FROM \"{dashboard['table']}\" WHERE app = 'web'"))
    engine.dispose()
    failed, cursor = evaluate(cursor)
    assert not any(e.passed for e in failed.values())
    text = failed[names[0]].description or ""
    assert "group {'app': 'web'}: views is" in text and "1 of 4 groups differ" in text
    assert f"key {{'user': '{gone}'}}: missing from the derived table" in (
        failed[names[1]].description or ""
    )
    assert "group {'app': 'web'}: missing" in (failed[names[2]].description or "")
    assert sorted(loads(cursor)) == sorted(names)  # alerted once; the next tick keeps it open
    _again, cursor = evaluate(cursor)
    assert sorted(loads(cursor)) == sorted(names)


def test_a_transform_beside_the_config_runs_in_dagster_without_shadowing_anything(
    spark: Any, kafka_client: Any, pipeline_factory: Any, instance: dg.DagsterInstance
) -> None:
    """The issue's outage: with the transforms' folder on PYTHONPATH, a `gql.py` in it took
    the Dagster webserver down. The config's `python_path` reaches this run only, appended
    after every installed module, and exports nothing to the processes it starts."""
    import os

    config = pipeline_factory(1)
    path = config_path(config)
    code = path.parent / "code"
    code.mkdir()
    (code / "gql.py").write_text("raise RuntimeError('the user gql.py was imported')\n")
    (code / "views_in_dagster.py").write_text(
        "from jobs.examples.pageviews import transform as pageviews\n\n\n"
        "def transform(records):\n    return pageviews(records)\n"
    )
    doc = yaml.safe_load(path.read_text())
    doc.update(transform="views_in_dagster:transform", python_path=["code"])
    path.write_text(yaml.safe_dump(doc))
    environment = os.environ.get("PYTHONPATH")
    kafka_client.produce(config.kafka.topic, pageviews(50))

    jobs = pipeline_definitions(path)
    request = tick(jobs, instance)
    assert isinstance(request, dg.RunRequest)
    result = jobs.micro_batch.execute_in_process(
        instance=instance, partition_key=request.partition_key, tags=request.tags
    )
    assert result.success
    assert assert_exactly_once(config, kafka_client) == (50, 0)
    import gql

    assert "site-packages" in str(gql.__file__)
    assert os.environ.get("PYTHONPATH") == environment
