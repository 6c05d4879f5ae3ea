"""A stuck batch is told truthfully: who holds it and the one action that frees it
(orchestration/health/holder.py), in the stuck alert and the `no_stuck_batch` check.

Against the real broker, Spark, Delta and a real Dagster instance. The owner is a real
`exactly run` child held at its crash point right after the vote (EXACTLY_PAUSE_AT): alive,
and going nowhere, as a hung process is. Recovery rightly leaves a live owner its batch, so
"the re-drive sensor retries" (what the alert said before) was false; the alert must say
that the owner is alive, which process it is, and to stop it. Once it is stopped, the
re-drive sensor does launch the commit. A Dagster run still shown as running after its
process died (a row in the instance's run storage, as a killed run worker leaves it) holds
the batch too: the check names and links it.
"""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster._core.storage.dagster_run import DagsterRun

from jobs.examples.sample_data import pageviews
from ledger.core.protocol import BatchState
from orchestration.health.table_checks import NO_STUCK_BATCH, verdicts
from orchestration.pipeline_definitions import pipeline_definitions
from orchestration.tags import BATCH_TAG, PIPELINE_TAG
from tests.fixtures.paused import run_paused_at
from tests.fixtures.pipeline import assert_exactly_once, config_path
from tests.test_edge_liveness import WEBHOOK, evaluate

pytestmark = pytest.mark.integration


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:
        yield inst


def stuck_check(jobs: Any, instance: dg.DagsterInstance) -> Any:
    (found,) = [
        v for v in verdicts(jobs.resource, lambda _m: None, instance) if v.check == NO_STUCK_BATCH
    ]
    assert not found.passed
    return found


def test_a_hung_owner_and_a_run_that_died_unseen_are_named_with_what_frees_the_batch(
    kafka_client: Any,
    pipeline_factory: Any,
    instance: dg.DagsterInstance,
    webhook: Any,
    tmp_path: Path,
) -> None:
    config = pipeline_factory(2, alerts={"stuck_after_seconds": 1, "webhook_url_env": WEBHOOK})
    kafka_client.produce(config.kafka.topic, pageviews(120))
    child = run_paused_at(config, tmp_path, "after_prepare")
    try:
        jobs = pipeline_definitions(config_path(config))
        time.sleep(1.2)

        # the owner is alive and outside Dagster: stop it
        _, cursor = evaluate(jobs, instance, "_stuck_prepared_sensor", None)
        assert webhook.kinds() == ["stuck_prepared"], webhook.posts
        alert = webhook.posts[0]
        host = socket.gethostname()
        assert (
            f"Its owner, process {child.pid} on {host}, is alive outside Dagster" in (alert["text"])
        ), alert["text"]
        assert (
            f"if it is hung, run `exactly abandon -c {config_path(config)} 1 --reason '...'`, "
            "which fences its attempt and commits it; then stop the process."
        ) in alert["text"], alert["text"]
        assert "retries" not in alert["text"], alert["text"]
        assert alert["details"]["owner_alive"] is True
        assert alert["details"]["owner"].startswith(f"{host}:{child.pid}")
        held = stuck_check(jobs, instance)
        assert f"process {child.pid} on {host}, is alive" in held.text, held.text
        # in the UI, the command is the job that does it
        assert "run the pageviews_abandon job with `batch_id: 1, reason: <why>`" in held.text
        assert held.metadata["owner_alive"] is True and "holding_run" not in held.metadata
        # while it lives, recovery leaves it alone: the re-drive sensor launches nothing
        requests, _ = evaluate(jobs, instance, "_redrive_sensor", None)
        assert requests == []
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)

    # a run of the batch that Dagster still shows as running, its process gone
    unseen = DagsterRun(
        job_name=jobs.redrive.name,
        tags={PIPELINE_TAG: config.pipeline, BATCH_TAG: "1"},
        status=dg.DagsterRunStatus.STARTED,
    )
    instance.add_run(unseen)
    held = stuck_check(jobs, instance)
    assert f"but Dagster still shows run {unseen.run_id} as running" in held.text, held.text
    assert "terminate that run" in held.text
    assert held.metadata["owner_alive"] is False
    assert held.metadata["holding_run"] == dg.MetadataValue.dagster_run(unseen.run_id)
    requests, _ = evaluate(jobs, instance, "_redrive_sensor", None)
    assert requests == []  # the run holds it, as the check says

    # terminated: nothing holds it, and the re-drive sensor launches its commit
    instance.report_run_canceled(unseen)
    held = stuck_check(jobs, instance)
    assert "is gone and no Dagster run holds it: pageviews_redrive_sensor is stopped" in (
        held.text
    ), held.text
    requests, _ = evaluate(jobs, instance, "_redrive_sensor", None)
    assert [r.partition_key for r in requests] == ["1"]
    batch = jobs.resource.pipeline().store.get(config.app_id, 1)
    assert batch is not None and batch.state is BatchState.PREPARED
    assert jobs.redrive.execute_in_process(instance=instance, partition_key="1").success
    _, cursor = evaluate(jobs, instance, "_stuck_prepared_sensor", cursor)
    assert webhook.kinds() == ["stuck_prepared", "resolved"]
    assert assert_exactly_once(config, kafka_client) == (120, 0)
