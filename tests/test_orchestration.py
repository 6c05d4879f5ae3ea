"""The Dagster code location: definitions load, and the job runs a batch end to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import dagster as dg

from jobs.examples.sample_data import pageviews
from ledger.protocol import BatchState
from orchestration.micro_batch import build_micro_batch_job
from tests.fixtures.pipeline import assert_exactly_once

REPO = Path(__file__).resolve().parent.parent


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
    schedule = defs.resolve_schedule_def("pageviews_schedule")
    assert schedule.cron_schedule == "*/5 * * * *"


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
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    config = pipeline_factory(2)
    kafka_client.produce(config.kafka.topic, pageviews(400, malformed_every=50))
    job = build_micro_batch_job(config)
    with dg.DagsterInstance.ephemeral() as instance:
        result = job.execute_in_process(instance=instance)
        assert result.success
        batch = result.output_for_node("pageviews_commit")
        assert batch.state is BatchState.ACKED
        assert batch.batch_id == 1
        table, quarantined = assert_exactly_once(config, kafka_client)
        assert (table, quarantined) == (392, 8)

        # nothing new: the run succeeds and plans nothing
        idle = job.execute_in_process(instance=instance)
        assert idle.success
        skipped = {e.step_key for e in idle.all_events if e.event_type_value == "STEP_SKIPPED"}
        assert skipped == {"pageviews_stage", "pageviews_prepare", "pageviews_commit"}
