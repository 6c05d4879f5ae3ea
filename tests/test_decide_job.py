"""Operator decisions from Dagster (orchestration/decisions): the `<pipeline>_decide` and
`<pipeline>_recover` jobs, against the real broker, Spark, Delta and a Dagster instance.

A re-created topic stops the next batch's run with a sentence that names the decide job and
its Launchpad config (not a shell command); a wrong id is refused in the same words the CLI
uses, as rejected input; the right one is recorded with who (the run) and why, shown on the
table asset, and carried by the next batch, which reads the new topic exactly once.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from deltalake import DeltaTable

from jobs.examples.sample_data import pageviews
from ledger.core.actions import ActionKind
from ledger.core.decision_rules import resume_command, retire_topic_command
from ledger.core.protocol import BatchState
from orchestration.decisions.spelling import as_launchpad
from orchestration.pipeline_definitions import pipeline_definitions
from orchestration.tags import REJECTED_TAG
from tests.fixtures.derived import TRANSFORM, assert_derived_match, derived_outputs, user_events
from tests.fixtures.pipeline import assert_exactly_once, config_path, crash_run
from tests.fixtures.topic_admin import recreate_topic
from tests.test_edge_liveness import evaluate


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:
        yield inst


def failure_sentence(result: dg.ExecuteInProcessResult) -> str:
    (failed,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    shown = failed.step_failure_data.user_failure_data
    assert shown is not None and shown.description is not None
    return shown.description


@pytest.mark.unit
def test_the_ledger_s_commands_read_as_the_jobs_that_do_them() -> None:
    assert as_launchpad(f"deleted; {retire_topic_command('b')}", "orders-eu.v2") == (
        "deleted; the orders_eu_v2_decide job with `kind: retire-topic, topic: b, reason: <why>`"
    )
    assert as_launchpad(resume_command({0: 12}, [0, 1], topic="t"), "p") == (
        "the p_decide job with `kind: resume-at, topic: t, positions: {'0': 12, '1': OFFSET}, "
        "reason: <why>`"
    )
    refused = "[0, 5) is lost (leave out --to), or add --force; --topic-id X, --topic b"
    assert as_launchpad(refused, "p", flags=True) == (
        "[0, 5) is lost (leave out `to`), or add `force: true`; `topic_id` X, `topic` b"
    )
    assert as_launchpad(refused, "p") == refused  # flags only in a decision's own refusal
    assert as_launchpad("or run `exactly recover -c <config>`, which commits it", "p") == (
        "or run the p_recover job, which commits it"
    )
    hung = "if it is hung, run `exactly abandon -c <config> 7 --backfill --reason '...'`, which"
    assert as_launchpad(hung, "p") == (
        "if it is hung, run the p_abandon job with `batch_id: 7, backfill: true, reason: <why>`,"
        " which"
    )


@pytest.mark.integration
def test_a_recreated_topic_is_accepted_from_the_decide_job_and_read_once(
    spark: Any, kafka_client: Any, pipeline_factory: Any, instance: dg.DagsterInstance
) -> None:
    config = pipeline_factory(2)
    topic, bootstrap = config.kafka.topic, config.kafka.bootstrap_servers
    kafka_client.produce(topic, pageviews(100))
    jobs = pipeline_definitions(config_path(config))
    assert jobs.next_batch.execute_in_process(instance=instance).success

    new_id = recreate_topic(bootstrap, topic, 2)
    kafka_client.produce(topic, pageviews(80, start=1000))
    blocked = jobs.next_batch.execute_in_process(instance=instance, raise_on_error=False)
    sentence = failure_sentence(blocked)
    launch = f"the pageviews_decide job with `kind: new-topic, topic_id: {new_id}, reason: <why>`"
    assert launch in sentence and "exactly skip" not in sentence, sentence

    def decide(topic_id: str) -> dg.ExecuteInProcessResult:
        ops = {
            "pageviews_decide_op": {
                "config": {
                    "kind": "new-topic",
                    "topic_id": topic_id,
                    "reason": "the topic was re-created",
                }
            }
        }
        return jobs.decide.execute_in_process(
            instance=instance, run_config={"ops": ops}, raise_on_error=False
        )

    wrong = decide("AAAAAAAAAAAAAAAAAAAAAA")
    refused = failure_sentence(wrong)
    assert refused.startswith(f"Refused: topic {topic} has id {new_id}, not AAAA"), refused
    assert launch in refused
    run = instance.get_run_by_id(wrong.run_id)
    assert run is not None and run.tags[REJECTED_TAG] == "DecisionError"

    accepted = decide(new_id)
    assert accepted.success
    (decision,) = jobs.resource.pipeline().store.decisions(pipeline=config.pipeline)
    assert decision.decided_by == f"Dagster run {accepted.run_id}"
    assert decision.reason == "the topic was re-created"
    shown = instance.fetch_observations(jobs.table.key, limit=5).records
    assert shown and shown[0].asset_observation is not None
    metadata = {k: v.value for k, v in shown[0].asset_observation.metadata.items()}
    assert metadata["decided_by"] == decision.decided_by
    assert metadata["decision_id"] == decision.id
    # the history sensor shows decisions recorded outside Dagster (`exactly skip`), once
    store = jobs.resource.pipeline().store
    store.insert_decision(dataclasses.replace(decision, id="b" * 32, decided_by="ann"))
    _, cursor = evaluate(jobs, instance, "_history_sensor", None)
    evaluate(jobs, instance, "_history_sensor", cursor)
    shown = instance.fetch_observations(jobs.table.key, limit=10).records
    told = [r.asset_observation.metadata for r in shown if r.asset_observation is not None]
    by = sorted(str(m["decided_by"].value) for m in told if "decision_id" in m)
    assert by == sorted([decision.decided_by, "ann"])

    after = jobs.next_batch.execute_in_process(instance=instance)
    committed = after.output_for_node("pageviews_commit")
    assert committed.topic_id == new_id and decision.id in {d.id for d in committed.decisions}
    # the old incarnation's rows stay, as history; the new one's 80 records once each
    held = DeltaTable(config.delta.table_uri).to_pyarrow_table(columns=["_batch_id"])
    ids = held["_batch_id"].to_pylist()
    assert (ids.count(1), ids.count(2), len(ids)) == (100, 80, 180)


@pytest.mark.integration
def test_the_recover_job_finishes_a_voted_batch(
    spark: Any, kafka_client: Any, pipeline_factory: Any, instance: dg.DagsterInstance
) -> None:
    config = pipeline_factory(2)
    kafka_client.produce(config.kafka.topic, pageviews(120))
    crash_run(config, "after_prepare")
    jobs = pipeline_definitions(config_path(config))
    ops = {"pageviews_recover_op": {"config": {"reason": "after the node's restart"}}}
    result = jobs.recover.execute_in_process(instance=instance, run_config={"ops": ops})
    assert result.success
    store = jobs.resource.pipeline().store
    batch = store.get(config.app_id, 1)
    assert batch is not None and batch.state is BatchState.ACKED
    assert assert_exactly_once(config, kafka_client) == (120, 0)
    # journaled in the ledger with who, why and what it did, and shown on the table asset
    (action,) = store.actions("pageviews")
    assert (action.kind, action.decided_by, action.reason) == (
        ActionKind.RECOVER,
        f"Dagster run {result.run_id}",
        "after the node's restart",
    )
    assert action.outcome == f"recovered 1 batch(es): {config.app_id}/1 ACKED", action.outcome
    _, cursor = evaluate(jobs, instance, "history_sensor", None)
    evaluate(jobs, instance, "history_sensor", cursor)  # a second tick shows it no second time
    observed = instance.fetch_observations(jobs.table.key, limit=100).records
    shown = [
        r.asset_observation
        for r in observed
        if r.asset_observation is not None and "action" in r.asset_observation.metadata
    ]
    assert len(shown) == 1 and shown[0].metadata["action"].value == "recover", shown
    assert shown[0].description == action.text()


@pytest.mark.integration
def test_a_derived_output_added_later_is_built_by_the_rebuild_job(
    spark: Any,
    kafka_client: Any,
    pipeline_factory: Any,
    instance: dg.DagsterInstance,
    tmp_path: Path,
) -> None:
    """An output added to a pipeline with history holds the next batch back with a sentence
    that names the rebuild job (not the command); the job refuses an unknown output as
    rejected input, builds the named one, and refuses it a second time; the next batch then
    commits and the output equals its recomputation."""
    plain = pipeline_factory(2, max_records=500, transform=TRANSFORM)
    topic = plain.kafka.topic
    kafka_client.produce_records(topic, user_events(0, 120, 2, tombstone_every=0))
    assert (
        pipeline_definitions(config_path(plain))
        .next_batch.execute_in_process(instance=instance)
        .success
    )
    doc = plain.model_dump(mode="json")
    doc["derived"] = derived_outputs(tmp_path / "derived")[:1]
    path = tmp_path / "with-derived.yaml"
    path.write_text(json.dumps(doc))
    jobs = pipeline_definitions(path)
    kafka_client.produce_records(topic, user_events(120, 60, 2, tombstone_every=7))

    blocked = jobs.next_batch.execute_in_process(instance=instance, raise_on_error=False)
    launch = "the pageviews_rebuild job with `output: views_per_app, reason: <why>`"
    sentence = failure_sentence(blocked)
    assert launch in sentence and "exactly derived" not in sentence, sentence

    def rebuild(output: str) -> dg.ExecuteInProcessResult:
        ops = {"pageviews_rebuild_op": {"config": {"output": output, "reason": "added"}}}
        return jobs.rebuild.execute_in_process(
            instance=instance, run_config={"ops": ops}, raise_on_error=False
        )

    unknown = rebuild("views")
    assert failure_sentence(unknown).startswith(
        "Refused: derived output 'views' is not in pipeline pageviews's config (its derived "
        "outputs: views_per_app)"
    ), failure_sentence(unknown)
    refused = instance.get_run_by_id(unknown.run_id)
    assert refused is not None and refused.tags[REJECTED_TAG] == "DecisionError"
    built = rebuild("views_per_app")
    assert built.success
    (shown,) = built.asset_materializations_for_node("pageviews_rebuild_op")
    assert shown.metadata["rebuilt_by"].value == f"Dagster run {built.run_id}"
    assert shown.metadata["holds"].value == "pageviews/1"
    # the output's own log says who rebuilt it and why
    (commit,) = DeltaTable(jobs.config.derived[0].table_uri).history(1)
    kept = (
        json.loads(commit["exactly"]) if isinstance(commit["exactly"], str) else commit["exactly"]
    )
    assert (kept["decided_by"], kept["reason"]) == (f"Dagster run {built.run_id}", "added")
    again = rebuild("views_per_app")
    assert "already holds batches (pageviews up to batch 1)" in failure_sentence(again)
    # the rebuild, not its refusals, is journaled in the ledger too
    (action,) = jobs.resource.pipeline().store.actions("pageviews")
    assert (action.kind, action.subject, action.decided_by, action.reason) == (
        ActionKind.REBUILD,
        "views_per_app",
        f"Dagster run {built.run_id}",
        "added",
    )
    assert action.outcome.startswith("rebuilt derived output views_per_app: "), action

    assert jobs.next_batch.execute_in_process(instance=instance).success
    assert assert_exactly_once(jobs.config, kafka_client)[0] == 180
    assert_derived_match(jobs.config)
