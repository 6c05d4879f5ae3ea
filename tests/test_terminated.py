"""A run terminated mid-batch says, in one sentence and no stack trace, what became of its
batch; and once recovery has done it, its log ends with the fate (orchestration/health/
failures.py `Terminated`, orchestration/health/fates.py).

Against the real broker, Spark, Delta and a persistent Dagster instance. The run is a real
process executing the next-batch job, held right after its stage (EXACTLY_PAUSE_AT) and sent
SIGINT, which is how Dagster's run worker delivers a termination: Dagster raises its
interruption inside the op. Before, the step showed `DagsterExecutionInterruptedError` and
its frames, and nothing about the batch.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from jobs.examples.sample_data import pageviews
from orchestration.pipeline_definitions import pipeline_definitions
from tests.fixtures.paused import paused_at
from tests.fixtures.pipeline import assert_exactly_once, config_path
from tests.test_edge_liveness import evaluate

pytestmark = pytest.mark.integration

#: the run: the next-batch job, executed in this process against the instance at DAGSTER_HOME
RUN = """
import sys
import dagster as dg
from orchestration.pipeline_definitions import pipeline_definitions
with dg.DagsterInstance.get() as instance:
    pipeline_definitions(sys.argv[1]).next_batch.execute_in_process(
        instance=instance, raise_on_error=False
    )
"""


def test_a_run_terminated_after_its_stage_says_what_became_of_its_batch(
    kafka_client: Any, pipeline_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = pipeline_factory(2)
    kafka_client.produce(config.kafka.topic, pageviews(90))
    home, pause = tmp_path / "dagster", tmp_path / "pause"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    child = paused_at([sys.executable, "-c", RUN, str(config_path(config))], pause, "after_stage")
    child.send_signal(signal.SIGINT)  # what terminating the run does to its worker
    child.communicate(timeout=120)

    with dg.DagsterInstance.get() as instance:
        (run,) = instance.get_runs()
        # a launched run ends CANCELED; one executed in process, as here, FAILURE
        assert run.status in (dg.DagsterRunStatus.CANCELED, dg.DagsterRunStatus.FAILURE)
        (failure,) = [
            e.dagster_event
            for e in instance.all_logs(run.run_id)
            if e.dagster_event is not None and e.dagster_event.event_type_value == "STEP_FAILURE"
        ]
        error = failure.step_failure_data.error
        assert error is not None and error.stack == [], error
        assert error.message == (
            "Terminated while batch pageviews/1 was STAGED: it did not vote, so nothing of it "
            "is published; recovery abandons it and the next batch reads its offsets again, "
            "which this run's log then says."
        )

        # as it says: the next batch reads its offsets, and the run's log ends with that
        jobs = pipeline_definitions(config_path(config))
        assert jobs.next_batch.execute_in_process(instance=instance).success
        assert assert_exactly_once(config, kafka_client) == (90, 0)
        evaluate(jobs, instance, "_history_sensor", None)
        last = instance.all_logs(run.run_id)[-1].message
        assert last.startswith("What became of its batch: batch pageviews/1 was abandoned"), last
        assert last.endswith("its offsets were read again by batch 2 (ACKED)"), last
