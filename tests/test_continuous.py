"""Continuous mode (jobs/wiring/continuous.py): the cadence's logic on a fake clock, then the real
thing: `exactly run --continuous` under a live producer, stopped by SIGTERM, and the Dagster
`<pipeline>_continuous` job, each checked against the broker and the tables."""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from jobs.examples.sample_data import pageviews
from jobs.wiring.continuous import Cadence, run_continuously
from ledger.core.protocol import BatchState
from ledger.store.ledger_store import LedgerStore
from orchestration.pipeline_definitions import pipeline_definitions
from orchestration.tags import BATCH_TAG
from tests.fixtures.pipeline import (
    assert_exactly_once,
    config_path,
    crash_env,
    shared_spark_env,
)
from tests.test_cli import EXACTLY, REPO
from tests.test_history import evaluate_history, materializations


class FakeTime:
    """A clock that only moves when a batch takes time or the loop waits."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Waits(threading.Event):
    """A stop event whose waits advance the fake clock instead of sleeping."""

    def __init__(self, clock: FakeTime) -> None:
        super().__init__()
        self.clock = clock
        self.waited: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waited.append(timeout)
        self.clock.now += timeout
        return self.is_set()


def scripted(clock: FakeTime, durations: list[float | None]) -> tuple[Any, list[float]]:
    """A run_batch that takes `durations[i]` seconds on pass i (None: nothing new)."""
    starts: list[float] = []

    def run_batch() -> Any:
        starts.append(clock.now)
        took = durations[len(starts) - 1]
        clock.now += took or 0.01
        return None if took is None else f"report {len(starts)}"

    return run_batch, starts


@pytest.mark.parametrize("min_interval", [0.0, 1.0, 5.0])
def test_batches_start_no_closer_than_the_interval_and_a_long_batch_is_followed_at_once(
    min_interval: float,
) -> None:
    clock = FakeTime()
    stop = Waits(clock)
    run_batch, starts = scripted(clock, [0.2, 7.0, None, None, 0.5])
    reports: list[Any] = []
    done = run_continuously(
        run_batch, Cadence(min_interval, max_batches=3), stop, reports.append, clock=clock
    )

    assert done == 3 and reports == ["report 1", "report 2", "report 5"]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert all(gap >= min_interval for gap in gaps), gaps
    # after the 7-second batch the next pass starts at once whatever the interval
    assert gaps[1] == pytest.approx(7.0)
    if min_interval:
        # an idle pass (nothing new) waits out the interval too: one poll per interval
        assert gaps[2] == pytest.approx(max(min_interval, 0.01))


def test_a_stop_request_lets_the_batch_in_flight_finish_and_starts_no_other() -> None:
    clock = FakeTime()
    stop = Waits(clock)
    run_batch, starts = scripted(clock, [0.5, 0.5, 0.5, 0.5])

    def on_batch(report: Any) -> None:
        if report == "report 2":
            stop.set()  # as the SIGTERM handler does while batch 2 is in flight

    done = run_continuously(run_batch, Cadence(1.0), stop, on_batch, clock=clock)
    assert done == 2 and len(starts) == 2


def test_the_sweep_runs_between_batches_once_per_interval_and_not_before_the_first() -> None:
    """Recovery ran before the loop; a backfill that dies while it runs is swept up between
    two batches once `sweep_interval` passed, never in the middle of one."""
    clock = FakeTime()
    stop = Waits(clock)
    run_batch, starts = scripted(clock, [4.0] * 8)
    swept: list[float] = []
    cadence = Cadence(1.0, max_batches=8, sweep_interval=10.0)
    done = run_continuously(
        run_batch,
        cadence,
        stop,
        lambda _r: None,
        sweep=lambda: swept.append(clock.now),
        clock=clock,
    )
    assert done == 8
    assert swept == [12.0, 24.0]  # batches start at 0, 4, 8, 12, ...: a sweep right before
    assert all(s in starts for s in swept)
    with pytest.raises(ValueError, match="sweep interval"):
        Cadence(1.0, sweep_interval=0)


def test_an_idle_pipeline_stops_at_once_when_asked() -> None:
    stop = threading.Event()
    stop.set()
    assert run_continuously(lambda: None, Cadence(3600.0), stop, lambda _r: None) == 0


def test_a_failing_batch_ends_the_loop_with_its_error() -> None:
    def run_batch() -> Any:
        raise RuntimeError("broker gone")

    with pytest.raises(RuntimeError, match="broker gone"):
        run_continuously(run_batch, Cadence(0.0), threading.Event(), lambda _r: None)


@pytest.mark.parametrize("bad", [{"min_interval": -1.0}, {"max_batches": 0}])
def test_a_cadence_that_makes_no_sense_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Cadence(**bad)


def _produce_steadily(client: Any, topic: str, stop: threading.Event, produced: list[int]) -> None:
    """About 100 records every 0.3 s, malformed ones included, until `stop`."""
    while not stop.is_set():
        records = list(pageviews(100, malformed_every=25, start=sum(produced)))
        client.produce(topic, records)
        produced.append(len(records))
        stop.wait(0.3)


IN_FLIGHT = (BatchState.PLANNED, BatchState.STAGED, BatchState.PREPARED)


def _batches(config: Any, app_id: str | None = None) -> list[Any]:
    """The batches of `app_id` (default: the live ones), newest first."""
    store = LedgerStore(config.ledger.url)
    try:
        return store.batches(app_id=app_id or config.app_id, limit=1000)
    finally:
        store.dispose()


def test_exactly_run_continuous_commits_under_a_live_producer_and_stops_cleanly_on_sigterm(
    kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    config = pipeline_factory(2, max_records=200)
    # the loop compacts the tables between its batches once files pile up (issue 31)
    path = config_path(config)
    doc = yaml.safe_load(path.read_text())
    doc["compact"] = {"when_files_over": 3}
    path.write_text(yaml.safe_dump(doc))
    produced: list[int] = []
    stop_producing = threading.Event()
    producer = threading.Thread(
        target=_produce_steadily, args=(kafka_client, config.kafka.topic, stop_producing, produced)
    )
    log = tmp_path / "continuous.log"
    with log.open("wb") as out:
        child = subprocess.Popen(
            [
                *EXACTLY,
                "run",
                "-c",
                str(config_path(config)),
                "--continuous",
                "--min-interval",
                "0.5",
                "--recover-interval",
                "1",
            ],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            # the loop stages on this worker's shared Spark server, as a Dagster-launched
            # run would: the point is the loop and its stop, not the local session
            env={**os.environ, **shared_spark_env()},
        )
        producer.start()
        try:
            deadline = time.monotonic() + 240
            while len(_batches(config)) < 3:
                assert child.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.5)
            # a replace whose process dies after its vote, while the loop runs: the loop
            # finishes it between two batches, not the next start
            replace = ["--partition", "0", "--from", "0", "--to", "20", "--mode", "replace"]
            crashed = subprocess.run(
                [*EXACTLY, "backfill", "-c", str(config_path(config)), *replace],
                cwd=REPO,
                capture_output=True,
                text=True,
                env={**os.environ, **crash_env("after_prepare")},
                check=False,
            )
            assert crashed.returncode == 137, crashed.stdout + crashed.stderr
            while _batches(config, "pageviews.backfill")[0].state is not BatchState.ACKED:
                assert child.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.5)
            # the stop request comes while a batch is in flight, records still arriving
            in_flight = None
            while in_flight is None:
                assert time.monotonic() < deadline, log.read_text()
                unfinished = [b for b in _batches(config) if b.state in IN_FLIGHT]
                in_flight = unfinished[0].batch_id if unfinished else None
            child.send_signal(signal.SIGTERM)
        finally:
            stop_producing.set()
            producer.join()
        assert child.wait(timeout=120) == 0, log.read_text()
    # the batch in flight when the signal came committed: nothing is left unfinished
    batches = _batches(config)
    assert any(b.batch_id == in_flight for b in batches)
    assert {b.state for b in batches} <= {BatchState.ACKED, BatchState.COMMITTED}, [
        (b.batch_id, b.state) for b in batches
    ]
    text = log.read_text()
    assert "SIGTERM: stopping after the batch in flight" in text
    assert "recovered batch pageviews.backfill/1: ACKED" in text
    assert "stopped after" in text
    assert re.search(r"^table: \d+ files merged into 1 \(version \d+", text, re.M), text

    # the rest of the topic, then every produced coordinate is in the tables once
    caught_up = subprocess.run(
        [*EXACTLY, "run", "-c", str(config_path(config)), "--until-caught-up"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert caught_up.returncode == 0, caught_up.stderr
    table, quarantined = assert_exactly_once(config, kafka_client)
    assert table + quarantined == sum(produced)


def test_the_continuous_job_materializes_every_batch_it_commits_in_one_run(
    kafka_client: Any, pipeline_factory: Any
) -> None:
    config = pipeline_factory(3, max_records=100)
    kafka_client.produce(config.kafka.topic, pageviews(900, malformed_every=30))
    jobs = pipeline_definitions(config_path(config))
    with dg.instance_for_test() as instance:
        result = jobs.continuous.execute_in_process(
            instance=instance,
            run_config={
                "ops": {
                    "pageviews_commit_continuously": {
                        "config": {"min_interval_seconds": 0.0, "max_batches": 2}
                    }
                }
            },
        )
        assert result.success
        assert result.output_for_node("pageviews_commit_continuously") == 2
        table_events = [
            m
            for m in result.asset_materializations_for_node("pageviews_commit_continuously")
            if m.asset_key == jobs.table.key
        ]
        assert [m.partition for m in table_events] == ["1", "2"]
        assert instance.get_dynamic_partitions(jobs.batches.name) == ["1", "2"]
        run = instance.get_run_by_id(result.run_id)
        assert run is not None and run.tags[BATCH_TAG] == "2"
        batches = sorted(_batches(config), key=lambda b: b.batch_id)
        assert [(b.batch_id, b.state) for b in batches] == [
            (1, BatchState.ACKED),
            (2, BatchState.ACKED),
        ]
        # each materialization describes its own batch, as a micro-batch run's does
        assert [m.metadata["records_read"].value for m in table_events] == [
            b.metrics["records_read"] for b in batches
        ]
        assert [m.metadata["last_batch_id"].value for m in table_events] == ["1", "2"]

        # the history sensor finds both batches in the UI already and adds nothing
        evaluate_history(jobs, instance, None)
        assert [m.partition for m in materializations(jobs, instance)] == ["1", "2"]
