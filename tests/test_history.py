"""The UI's checkpoint history is the ledger's: against the real broker, Spark, Delta and a
real Dagster instance.

* a batch committed by the CLI path appears as a partition with a materialization after one
  history-sensor evaluation, and a second evaluation adds nothing; a backfill batch is
  materialized without a partition; a batch whose run is still running is left to it;
* every job that commits (micro-batch, next-batch, re-drive, backfill) materializes the
  table asset with the same metadata: measures as numbers, identifiers as text;
* the Launchpad's next-batch job plans and materializes a new partition;
* re-running a committed batch's partition fails with the sentence that says how to
  reprocess it and changes nothing, unless its run config confirms the reprocess;
* re-running the partition of a batch that voted and whose run died finishes and
  materializes it; of an abandoned batch, fails with the sentence that says what to do.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import dagster as dg
import pytest
from dagster._core.storage.dagster_run import DagsterRun
from deltalake import DeltaTable

from jobs.examples.sample_data import pageviews
from jobs.wiring.pipeline import build, build_backfill
from ledger.coordinator.backfill import plan_backfill
from ledger.core.backfill import BackfillMode
from ledger.core.batch import BatchKind
from ledger.core.protocol import BatchState, OffsetRange
from orchestration.assets import quarantine_key
from orchestration.health.fates import FATE_OF
from orchestration.metadata import batch_metadata
from orchestration.pipeline_definitions import PipelineDefinitions, pipeline_definitions
from orchestration.tags import BATCH_TAG, PIPELINE_TAG, REJECTED_TAG
from tests.fixtures.batches import a_batch
from tests.fixtures.pipeline import assert_exactly_once, config_path, coordinates, crash_run

NUMBERS = (dg.IntMetadataValue, dg.FloatMetadataValue)


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:
        yield inst


def evaluate_history(
    jobs: PipelineDefinitions, instance: dg.DagsterInstance, cursor: str | None
) -> tuple[Any, str | None]:
    """One evaluation of the history sensor; returns (result, new cursor)."""
    sensor = next(s for s in jobs.sensors if s.name.endswith("_history_sensor"))
    with dg.build_sensor_context(
        instance=instance, cursor=cursor, resources=jobs.resources
    ) as context:
        return sensor(context), context.cursor


def materializations(
    jobs: PipelineDefinitions, instance: dg.DagsterInstance
) -> list[dg.AssetMaterialization]:
    records = instance.fetch_materializations(jobs.table.key, limit=1000, ascending=True).records
    return [r.asset_materialization for r in records if r.asset_materialization is not None]


def fates(jobs: PipelineDefinitions, instance: dg.DagsterInstance) -> list[dg.AssetObservation]:
    """The fates told on the table asset (orchestration/health/fates.py), oldest first."""
    records = instance.fetch_observations(jobs.table.key, limit=100, ascending=True).records
    found = [r.asset_observation for r in records if r.asset_observation is not None]
    return [o for o in found if FATE_OF in o.metadata]


def dead_run(jobs: PipelineDefinitions, instance: dg.DagsterInstance, batch: str) -> str:
    """A failed micro-batch run of `batch`, as a run whose process died leaves it; its id."""
    run = DagsterRun(
        job_name=jobs.micro_batch.name,
        tags={PIPELINE_TAG: jobs.config.pipeline, BATCH_TAG: batch},
        status=dg.DagsterRunStatus.FAILURE,
    )
    instance.add_run(run)
    return run.run_id


def last_words(instance: dg.DagsterInstance, run_id: str) -> str:
    """The last message of a run's event log."""
    return instance.all_logs(run_id)[-1].message


def table_materializations(
    result: dg.ExecuteInProcessResult, node: str
) -> list[dg.AssetMaterialization]:
    """The table asset's materializations a step logged (it logs the quarantine's too)."""
    found = result.asset_materializations_for_node(node)
    return [m for m in found if m.asset_key.path[-1].endswith("_table")]


def assert_plottable(meta: dict[str, dg.MetadataValue], *, staged_here: bool = True) -> None:
    """Measures are numbers Dagster plots; identifiers are text it does not. A batch staged
    by the committing path has its records/s too."""
    for key in ("batch_id", "attempt", "app_id", "batch", "last_batch_id"):
        assert isinstance(meta[key], dg.TextMetadataValue), (key, meta[key])
    for key in ("table_version", "row_count", "records_read", "files_committed"):
        assert isinstance(meta[key], dg.IntMetadataValue), (key, meta[key])
    seconds = [k for k in meta if k.endswith("_seconds")]
    assert ("records_per_second" in meta) is staged_here
    seconds += ["records_per_second"] if staged_here else []
    assert seconds, "no phase timed"
    for key in seconds:
        assert isinstance(meta[key], NUMBERS), (key, meta[key])
    assert isinstance(meta["committed_at"], dg.TimestampMetadataValue)


def test_batch_metadata_types_identifiers_as_text_and_measures_as_numbers() -> None:
    now = datetime.now(UTC)
    batch = a_batch(
        7,
        BatchState.ACKED,
        app_id="pv.backfill",
        pipeline="pv",
        kind=BatchKind.BACKFILL,
        attempt=2,
        at=now,
        prepared_at=now,
        committed_at=now,
        table_version=4,
        ranges=(OffsetRange("t", 0, 0, 100),),
        metrics={
            "records_read": 100,
            "files_committed": 2,
            "phase_s": {"stage": 1.5, "commit": 0.5},
        },
    )
    meta = batch_metadata(batch)
    assert meta["batch"] == dg.MetadataValue.text("pv.backfill/7")
    assert meta["batch_id"] == dg.MetadataValue.text("7")
    assert meta["attempt"] == dg.MetadataValue.text("2")
    assert meta["records_per_second"] == dg.MetadataValue.float(50.0)
    assert meta["stage_seconds"] == dg.MetadataValue.float(1.5)
    assert meta["table_version"] == dg.MetadataValue.int(4)
    assert meta["offsets_spanned"] == dg.MetadataValue.int(100)


def test_a_batch_committed_by_the_cli_enters_the_history_once(
    spark: Any, kafka_client: Any, pipeline_factory: Any, instance: dg.DagsterInstance
) -> None:
    config = pipeline_factory(2)
    kafka_client.produce(config.kafka.topic, pageviews(200, malformed_every=50))
    report = build(config, spark_factory=lambda: spark).run_batch()
    assert report is not None and report.batch.state is BatchState.ACKED
    jobs = pipeline_definitions(config_path(config))
    assert not instance.has_dynamic_partition(jobs.batches.name, "1")

    result, cursor = evaluate_history(jobs, instance, None)
    assert "pageviews/1" in (result.skip_message or "")
    assert instance.has_dynamic_partition(jobs.batches.name, "1")
    (materialization,) = materializations(jobs, instance)
    assert materialization.partition == "1"
    meta = dict(materialization.metadata)
    assert_plottable(meta)
    assert meta["row_count"].value == 196 and meta["quarantine_records"].value == 4
    assert meta["table_version"].value == report.batch.table_version
    assert meta["committed_at"].value == report.batch.committed_at.timestamp()  # type: ignore[union-attr]
    assert "consumer_lag_total" not in meta  # a value of now, not of the batch's commit
    # the quarantine asset records the same commit, on the same partition
    quarantined = instance.fetch_materializations(quarantine_key(config.pipeline), limit=10)
    (q,) = [r.asset_materialization for r in quarantined.records]
    assert q is not None and q.partition == "1" and q.metadata["row_count"].value == 4

    again, cursor = evaluate_history(jobs, instance, cursor)
    assert len(materializations(jobs, instance)) == 1
    # a fresh cursor reads the event log again and still adds nothing
    evaluate_history(jobs, instance, None)
    assert len(materializations(jobs, instance)) == 1
    assert "agrees" in (again.skip_message or "")


def test_the_next_batch_job_plans_and_materializes_a_new_partition(
    spark: Any, kafka_client: Any, pipeline_factory: Any, instance: dg.DagsterInstance
) -> None:
    config = pipeline_factory(2)
    kafka_client.produce(config.kafka.topic, pageviews(300, malformed_every=50))
    jobs = pipeline_definitions(config_path(config))

    result = jobs.next_batch.execute_in_process(instance=instance)
    assert result.success
    batch = result.output_for_node("pageviews_commit")
    assert (batch.batch_id, batch.state) == (1, BatchState.ACKED)
    assert instance.has_dynamic_partition(jobs.batches.name, "1")
    (materialization,) = table_materializations(result, "pageviews_commit")
    assert materialization.partition == "1"
    meta = dict(materialization.metadata)
    assert_plottable(meta)
    assert {"plan_seconds", "stage_seconds", "prepare_seconds", "commit_seconds"} <= set(meta)
    assert meta["consumer_lag_total"] == dg.MetadataValue.int(0)
    assert meta["consumer_lag_p0"] == dg.MetadataValue.int(0)
    assert meta["consumer_lag_p1"] == dg.MetadataValue.int(0)
    assert assert_exactly_once(config, kafka_client) == (294, 6)

    # what the run materialized is not materialized again by the history sensor
    evaluate_history(jobs, instance, None)
    assert len(materializations(jobs, instance)) == 1


def test_rerunning_a_committed_partition_fails_with_the_way_to_reprocess_it(
    spark: Any, kafka_client: Any, pipeline_factory: Any, instance: dg.DagsterInstance
) -> None:
    config = pipeline_factory(2)
    kafka_client.produce(config.kafka.topic, pageviews(200))
    jobs = pipeline_definitions(config_path(config))
    assert jobs.next_batch.execute_in_process(instance=instance).success
    before = coordinates(config.delta.table_uri)
    version = DeltaTable(config.delta.table_uri).version()

    rerun = jobs.micro_batch.execute_in_process(
        instance=instance, partition_key="1", raise_on_error=False
    )
    assert not rerun.success
    failure = next(e for e in rerun.all_events if e.event_type_value == "STEP_FAILURE")
    sentence = failure.step_failure_data.user_failure_data.description  # type: ignore[union-attr]
    assert sentence.startswith("Batch 1 is already committed (ACKED, table version")
    assert "reprocess: true" in sentence and "pageviews_backfill in replace mode" in sentence
    # rejected input, not a failure of the system: the run-failure sensor leaves it alone
    run = instance.get_run_by_id(rerun.run_id)
    assert run is not None and run.tags.get(REJECTED_TAG) == "AlreadyCommitted"
    assert DeltaTable(config.delta.table_uri).version() == version
    assert coordinates(config.delta.table_uri) == before
    assert len(materializations(jobs, instance)) == 1

    confirmed = jobs.micro_batch.execute_in_process(
        instance=instance,
        partition_key="1",
        run_config={"ops": {"pageviews_plan": {"config": {"reprocess": True}}}},
    )
    assert confirmed.success
    replacement = confirmed.output_for_node("pageviews_commit")
    assert replacement.kind == BatchKind.BACKFILL and replacement.state is BatchState.ACKED
    assert DeltaTable(config.delta.table_uri).version() == version + 1
    assert assert_exactly_once(config, kafka_client) == (200, 0)
    (materialization,) = table_materializations(confirmed, "pageviews_commit")
    assert materialization.partition == "1"
    assert materialization.metadata["reprocessed_by"] == dg.MetadataValue.text(
        f"pageviews.backfill/{replacement.batch_id}"
    )
    evaluate_history(jobs, instance, None)
    assert len(materializations(jobs, instance)) == 2  # the run's materialization names it
    (told,) = fates(jobs, instance)
    assert str(told.description).startswith(
        f"replace backfill pageviews.backfill/{replacement.batch_id} replaced the rows of "
        "batch(es) 1;"
    )


def test_a_partition_whose_batch_voted_is_redriven_by_its_run(
    spark: Any, kafka_client: Any, pipeline_factory: Any, instance: dg.DagsterInstance
) -> None:
    config = pipeline_factory(2)
    kafka_client.produce(config.kafka.topic, pageviews(300, malformed_every=50))
    crash_run(config, "after_prepare")  # batch 1 voted, its process died
    jobs = pipeline_definitions(config_path(config))
    instance.add_dynamic_partitions(jobs.batches.name, ["1"])
    died = dead_run(jobs, instance, "1")  # the run that process was

    rerun = jobs.micro_batch.execute_in_process(instance=instance, partition_key="1")
    assert rerun.success
    # the run finished the batch: the partition's materialization is that commit's, and the
    # run says so instead of passing for a run that staged nothing
    (materialization,) = table_materializations(rerun, "pageviews_plan")
    assert materialization.partition == "1"
    assert materialization.metadata["attempt"] == dg.MetadataValue.text("2")
    logged = [entry.user_message for entry in instance.all_logs(rerun.run_id)]
    assert any("re-drove batch 1 from PREPARED to ACKED" in line for line in logged)
    run = instance.get_run_by_id(rerun.run_id)
    assert run is not None and run.tags.get(BATCH_TAG) == "1" and REJECTED_TAG not in run.tags
    assert assert_exactly_once(config, kafka_client) == (294, 6)
    _, cursor = evaluate_history(jobs, instance, None)
    assert len(materializations(jobs, instance)) == 1
    # what became of the batch, on its partition and at the end of the run that died
    (fate,) = fates(jobs, instance)
    assert fate.partition == "1"
    assert fate.metadata["finished_by_run"] == dg.MetadataValue.dagster_run(rerun.run_id)
    said = (
        f"batch pageviews/1 voted, and its first attempt did not finish it: run {rerun.run_id} "
        "finished it under attempt 2 (ACKED at"
    )
    assert str(fate.description).startswith(said), fate.description
    assert last_words(instance, died).startswith(f"What became of its batch: {said}")
    evaluate_history(jobs, instance, cursor)
    assert len(fates(jobs, instance)) == 1  # told once


def test_a_partition_whose_batch_was_abandoned_is_refused_in_one_sentence(
    spark: Any, kafka_client: Any, pipeline_factory: Any, instance: dg.DagsterInstance
) -> None:
    config = pipeline_factory(2)
    kafka_client.produce(config.kafka.topic, pageviews(200))
    crash_run(config, "after_plan")  # batch 1 planned, its process died before staging
    jobs = pipeline_definitions(config_path(config))
    instance.add_dynamic_partitions(jobs.batches.name, ["1"])
    died = dead_run(jobs, instance, "1")  # the run that process was

    rerun = jobs.micro_batch.execute_in_process(
        instance=instance, partition_key="1", raise_on_error=False
    )
    assert not rerun.success
    failure = next(e for e in rerun.all_events if e.event_type_value == "STEP_FAILURE")
    sentence = failure.step_failure_data.user_failure_data.description  # type: ignore[union-attr]
    assert sentence.startswith("Batch 1 was abandoned (ABORTED: abandoned by recovery")
    assert "launch pageviews_next_batch" in sentence
    run = instance.get_run_by_id(rerun.run_id)
    assert run is not None and run.tags.get(REJECTED_TAG) == "AbandonedBatch"
    assert materializations(jobs, instance) == []

    # as the sentence says: the next batch reads the abandoned batch's offsets
    _, cursor = evaluate_history(jobs, instance, None)
    assert fates(jobs, instance) == []  # told once a batch reads its offsets again
    assert jobs.next_batch.execute_in_process(instance=instance).success
    assert assert_exactly_once(config, kafka_client) == (200, 0)
    _, cursor = evaluate_history(jobs, instance, cursor)
    (fate,) = fates(jobs, instance)
    assert fate.partition == "1"
    meta = {k: v.value for k, v in fate.metadata.items()}
    assert (meta["state"], meta["reread_by"]) == ("ABORTED", "pageviews/2")
    assert str(meta["why"]).startswith("abandoned by recovery: ")
    said = str(fate.description)
    assert said.startswith("batch pageviews/1 was abandoned (ABORTED at "), said
    assert said.endswith("its offsets were read again by batch 2 (ACKED)"), said
    assert last_words(instance, died) == f"What became of its batch: {said}"
    evaluate_history(jobs, instance, cursor)
    assert len(fates(jobs, instance)) == 1


def test_the_backfill_and_redrive_jobs_materialize_the_table(
    spark: Any, kafka_client: Any, pipeline_factory: Any, instance: dg.DagsterInstance
) -> None:
    config = pipeline_factory(2)
    # 150 records in each partition: keyless records land wherever librdkafka's sticky
    # partitioner puts a whole batch of them, which once left 6 in partition 0, fewer than
    # the replace of [0, 20) below needs committed
    kafka_client.produce_to_partitions(
        config.kafka.topic,
        {0: pageviews(150, malformed_every=50), 1: pageviews(150, malformed_every=50, start=150)},
    )
    crash_run(config, "after_prepare")  # batch 1 voted, its process died
    jobs = pipeline_definitions(config_path(config))
    instance.add_dynamic_partitions(jobs.batches.name, ["1"])

    redriven = jobs.redrive.execute_in_process(instance=instance, partition_key="1")
    assert redriven.success
    (materialization,) = table_materializations(redriven, "pageviews_redrive_commit")
    assert materialization.partition == "1"
    assert_plottable(dict(materialization.metadata), staged_here=False)
    assert materialization.metadata["attempt"] == dg.MetadataValue.text("2")
    assert isinstance(materialization.metadata["redrive_seconds"], dg.FloatMetadataValue)

    run_config = {
        "ops": {
            "pageviews_backfill_ranges": {
                "config": {"mode": "replace", "ranges": [{"partition": 0, "start": 0, "end": 20}]}
            }
        }
    }
    filled = jobs.backfill.execute_in_process(instance=instance, run_config=run_config)
    assert filled.success
    batch = filled.output_for_node("pageviews_backfill_ranges")
    (materialization,) = table_materializations(filled, "pageviews_backfill_ranges")
    # a backfill batch is no live batch: no partition, labelled with its application id
    assert materialization.partition is None
    meta = dict(materialization.metadata)
    assert_plottable(meta)
    assert meta["batch"] == dg.MetadataValue.text(f"pageviews.backfill/{batch.batch_id}")
    assert meta["app_id"] == dg.MetadataValue.text("pageviews.backfill")
    assert meta["table_version"].value == DeltaTable(config.delta.table_uri).version()
    assert meta["row_count"].value == assert_exactly_once(config, kafka_client)[0]

    # the replaced batch's partition gets a new materialization naming the replace
    _, cursor = evaluate_history(jobs, instance, None)
    found = materializations(jobs, instance)
    assert [m.partition for m in found] == ["1", None, "1"]
    label = f"pageviews.backfill/{batch.batch_id}"
    assert found[2].metadata["reprocessed_by"] == dg.MetadataValue.text(label)
    assert found[2].metadata["replaced_batch"] == dg.MetadataValue.text("pageviews/1")
    told = [f for f in fates(jobs, instance) if f.metadata[FATE_OF].value == label]
    assert [str(f.description) for f in told] == [
        f"replace backfill {label} replaced the rows of batch(es) 1; each of their partitions "
        "has a materialization that names it"
    ]
    evaluate_history(jobs, instance, cursor)
    assert len(materializations(jobs, instance)) == 3


def test_the_history_sensor_waits_for_a_running_run_and_records_backfills_unpartitioned(
    spark: Any, kafka_client: Any, pipeline_factory: Any, instance: dg.DagsterInstance
) -> None:
    config = pipeline_factory(2)
    # both partitions hold records, so the replace of partition 1 has committed rows
    kafka_client.produce_to_partitions(
        config.kafka.topic, {p: list(pageviews(100, start=100 * p)) for p in (0, 1)}
    )
    jobs = pipeline_definitions(config_path(config))
    # a run of batch 1 that Dagster still shows running may yet log the batch's commit
    run = instance.create_run_for_job(
        jobs.micro_batch,
        tags={PIPELINE_TAG: config.pipeline, BATCH_TAG: "1"},
        status=dg.DagsterRunStatus.STARTED,
    )
    assert build(config, spark_factory=lambda: spark).run_batch() is not None
    tpc = build_backfill(config, spark_factory=lambda: spark)
    filled, planned = plan_backfill(
        tpc,
        live_app_id=config.app_id,
        mode=BackfillMode.REPLACE,
        ranges=[OffsetRange(config.kafka.topic, 1, 0, 30)],
        transform=config.transform,
    )
    assert planned and tpc.finish(filled).batch.state is BatchState.ACKED

    _, cursor = evaluate_history(jobs, instance, None)
    (backfill,) = materializations(jobs, instance)
    assert backfill.partition is None
    assert backfill.metadata["batch"] == dg.MetadataValue.text(f"{tpc.app_id}/{filled.batch_id}")
    assert instance.has_dynamic_partition(
        jobs.batches.name, "1"
    )  # the partition, not yet its commit

    instance.report_run_failed(run)
    _, cursor = evaluate_history(jobs, instance, cursor)
    # batch 1's commit, then (only after it) the replace of its rows on its partition
    found = materializations(jobs, instance)
    assert [m.partition for m in found] == [None, "1", "1"]
    assert "reprocessed_by" not in found[1].metadata
    assert found[2].metadata["reprocessed_by"] == backfill.metadata["batch"]
    evaluate_history(jobs, instance, cursor)
    assert len(materializations(jobs, instance)) == 3
