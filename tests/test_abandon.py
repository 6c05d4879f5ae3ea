"""Releasing a batch a hung owner holds: the `<pipeline>_abandon` job and `exactly abandon`
(ledger/coordinator/release.py, orchestration/decisions/abandon_job.py).

Against the real broker, Spark, Delta and a Dagster instance. Each owner is a real `exactly
run` held at a pause point (EXACTLY_PAUSE_AT): alive and going nowhere, as a hung process
is, so recovery leaves it its batch. The release is then taken, and the owner let go: it
must find itself fenced, and the table must hold every record once. A Dagster run shown as
running over the batch (a row in the instance's run storage, whose process does not answer)
must be terminated by the job. The hostile part is the voted case: the hung owner resumes
with a voted batch in hand after someone else published it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster._core.storage.dagster_run import DagsterRun

from jobs.examples.sample_data import pageviews
from ledger.core.protocol import BatchState
from orchestration.decisions import abandon_job
from orchestration.pipeline_definitions import pipeline_definitions
from orchestration.tags import BATCH_TAG, PIPELINE_TAG, REJECTED_TAG
from tests.fixtures.paused import let_go, run_paused_at
from tests.fixtures.pipeline import assert_exactly_once, config_path
from tests.test_decide_job import failure_sentence

pytestmark = pytest.mark.integration


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:
        yield inst


def abandon_cli(config: Any, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "exactly_cli", "abandon", "-c", str(config_path(config))]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=300)


def test_a_hung_batch_is_released_from_the_job_and_the_command_line(
    kafka_client: Any,
    pipeline_factory: Any,
    instance: dg.DagsterInstance,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(abandon_job, "TERMINATE_WAIT_S", 1.0)
    config = pipeline_factory(2)
    kafka_client.produce(config.kafka.topic, pageviews(120))
    child = run_paused_at(config, tmp_path / "voted", "after_prepare")
    jobs = pipeline_definitions(config_path(config))
    store = jobs.resource.pipeline().store
    holding = DagsterRun(
        job_name=jobs.redrive.name,
        tags={PIPELINE_TAG: config.pipeline, BATCH_TAG: "1"},
        status=dg.DagsterRunStatus.STARTED,
    )
    instance.add_run(holding)

    def abandon(batch_id: int, reason: str) -> dg.ExecuteInProcessResult:
        ops = {"pageviews_abandon_op": {"config": {"batch_id": batch_id, "reason": reason}}}
        return jobs.abandon.execute_in_process(
            instance=instance, run_config={"ops": ops}, raise_on_error=False
        )

    wrong = abandon(5, "a typo")
    sentence = failure_sentence(wrong)
    assert sentence == "Refused: there is no batch pageviews/5 in the ledger: nothing to abandon."
    refused = instance.get_run_by_id(wrong.run_id)
    assert refused is not None and refused.tags[REJECTED_TAG] == "DecisionError"

    # voted, hung, and a run over it that does not answer: terminated, taken over, finished
    done = abandon(1, "hung after its vote")
    assert done.success
    ended = instance.get_run_by_id(holding.run_id)
    assert ended is not None and ended.status is dg.DagsterRunStatus.CANCELED
    batch = store.get(config.app_id, 1)
    assert batch is not None and batch.state is BatchState.ACKED
    assert batch.metrics["taken_over_by"] == f"Dagster run {done.run_id}: hung after its vote"
    shown = instance.fetch_observations(jobs.table.key, limit=1).records[0].asset_observation
    assert shown is not None and "had voted, so it is never abandoned" in str(shown.description)
    assert shown.metadata["terminated_runs"].value == holding.run_id
    # the hung owner wakes with its vote in hand, after someone else published it
    code, said = let_go(child, tmp_path / "voted", "after_prepare")
    assert code == 2 and "fenced" in said and "Traceback" not in said, said
    assert assert_exactly_once(config, kafka_client) == (120, 0)

    # never voted, hung, released from the command line: abandoned, read again once
    kafka_client.produce(config.kafka.topic, pageviews(60, start=1000))
    child = run_paused_at(config, tmp_path / "staged", "after_stage")
    cli = abandon_cli(config, "2", "--reason", "hung in its stage", "--by", "ann")
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert "abandoned batch pageviews/2: its attempt is fenced" in cli.stdout, cli.stdout
    code, said = let_go(child, tmp_path / "staged", "after_stage")
    assert code == 2 and "fenced" in said and "Traceback" not in said, said
    aborted = store.get(config.app_id, 2)
    assert aborted is not None and aborted.state is BatchState.ABORTED
    assert aborted.error == "abandoned by ann: hung in its stage"
    assert jobs.next_batch.execute_in_process(instance=instance).success
    assert assert_exactly_once(config, kafka_client) == (180, 0)
    again = abandon_cli(config, "2", "--reason", "twice")
    assert again.returncode == 2
    assert again.stderr.startswith("exactly: error: batch pageviews/2 is already ABORTED"), (
        again.stderr
    )
