"""Metrics for Prometheus (jobs/metrics): scraped from `exactly run --continuous` while it
runs against the real broker, Spark and Delta, and read from a one-shot run's text file;
every figure checked against the ledger, Kafka and the table.

The Dagster code location's endpoint is scraped in tests/test_ui.py, under `dagster dev`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobs.examples.sample_data import pageviews
from jobs.metrics.collector import BUCKETS, PhaseHistogram
from jobs.metrics.exposition import parse_address
from ledger.core.errors import ConfigError
from ledger.core.protocol import PUBLISHED, BatchState
from ledger.store.ledger_store import LedgerStore
from resources.jvm.process import free_port
from tests.fixtures.pipeline import (
    assert_exactly_once,
    config_path,
    coordinates,
    shared_spark_env,
)
from tests.test_failure_lines import assert_one_clean_line, cli

#: how long a batch may take to commit on 2 busy cores
COMMIT_TIMEOUT_S = 240

Figures = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Figures:
    """Every sample of an exposition, keyed by (sample name, labels)."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(port: int) -> Figures:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        return parse(answer.read().decode())


def value(figures: Figures, name: str, **labels: str) -> float:
    return figures[(name, frozenset(labels.items()))]


def assert_figures_match_the_ledger(
    figures: Figures, config: Any, records: int, partitions: int = 2
) -> None:
    """The figures against the ledger, Kafka and the table, once the pipeline caught up."""
    name = config.pipeline
    store = LedgerStore(config.ledger.url)
    published = store.batches(pipeline=name, states=PUBLISHED)
    acked = store.batches(pipeline=name, states=[BatchState.ACKED])
    assert value(figures, "exactly_up", pipeline=name) == 1
    assert value(figures, "exactly_batches", pipeline=name, state="ACKED") == len(acked)
    assert value(figures, "exactly_records_read_total", pipeline=name) == records
    table_rows = sum(coordinates(config.delta.table_uri).values())
    assert value(figures, "exactly_rows_written_total", pipeline=name, output="table") == (
        table_rows
    )
    on_disk = sum(f.size for b in published for f in store.files(b.app_id, b.batch_id))
    written = [v for (n, _), v in figures.items() if n == "exactly_bytes_written_total"]
    assert sum(written) == on_disk > 0
    lag = [v for (n, _), v in figures.items() if n == "exactly_consumer_lag"]
    assert len(lag) == partitions and sum(lag) == 0  # caught up and acked
    newest = max(b.committed_at for b in published if b.committed_at is not None)
    assert value(figures, "exactly_last_commit_timestamp_seconds", pipeline=name) == (
        pytest.approx(newest.timestamp())
    )
    assert value(figures, "exactly_stuck_batches", pipeline=name) == 0
    newest_read = max(int(b.metrics["newest_record_ms"]) for b in published) / 1000
    assert value(figures, "exactly_newest_record_timestamp_seconds", pipeline=name) == (
        pytest.approx(newest_read)
    )
    assert newest_read <= newest.timestamp()  # read before it committed
    assert value(figures, "exactly_quarantine_ratio", pipeline=name) == 0
    store.dispose()


def wait_published(config: Any, records: int) -> None:
    """Until the ledger's published batches have read `records` records."""
    store = LedgerStore(config.ledger.url)
    deadline = time.monotonic() + COMMIT_TIMEOUT_S
    try:
        while store.records_read_total(config.pipeline) < records:
            assert time.monotonic() < deadline, "the batches did not commit in time"
            time.sleep(0.5)
    finally:
        store.dispose()


def settled_scrape(port: int, config: Any, records: int) -> Figures:
    """A scrape once the figures match the ledger: the ack that zeroes the lag follows the
    commit that publishes the records."""
    deadline = time.monotonic() + 30
    while True:
        figures = scrape(port)
        try:
            assert_figures_match_the_ledger(figures, config, records)
            return figures
        except (AssertionError, KeyError):  # KeyError: no batch ACKED yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@pytest.mark.integration
def test_run_continuous_serves_figures_that_match_the_ledger_while_it_runs(
    kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    config = pipeline_factory(2)
    kafka_client.produce(config.kafka.topic, pageviews(200))
    port = free_port()
    child = subprocess.Popen(
        [
            *(sys.executable, "-m", "exactly_cli", "run", "-c", str(config_path(config))),
            *("--continuous", "--min-interval", "0.5", "--metrics", f"127.0.0.1:{port}"),
        ],
        env={**os.environ, **shared_spark_env()},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_published(config, 200)
        first = settled_scrape(port, config, 200)
        commits = value(first, "exactly_phase_seconds_count", pipeline="pageviews", phase="commit")
        assert commits >= 1  # batches published since the endpoint started

        kafka_client.produce(config.kafka.topic, pageviews(100, start=200))
        wait_published(config, 300)
        second = settled_scrape(port, config, 300)
        more = value(second, "exactly_phase_seconds_count", pipeline="pageviews", phase="commit")
        assert more > commits
        stages = value(second, "exactly_phase_seconds_sum", pipeline="pageviews", phase="stage")
        assert stages > 0
    finally:
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=120)
    assert child.returncode == 0, out + err
    assert "Traceback" not in out + err
    assert_exactly_once(config, kafka_client)


@pytest.mark.integration
def test_a_one_shot_run_writes_the_figures_to_a_text_file(
    kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    config = pipeline_factory(2)
    kafka_client.produce(config.kafka.topic, pageviews(150))
    textfile = tmp_path / "textfile" / "exactly.prom"
    state = tmp_path / "state"
    result = cli(
        "run",
        *("-c", str(config_path(config)), "--until-caught-up"),
        *("--metrics-textfile", str(textfile)),
        state_dir=state,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert_figures_match_the_ledger(parse(textfile.read_text()), config, 150)
    assert not list(textfile.parent.glob("*.tmp*"))  # replaced whole, nothing left beside


@pytest.mark.integration
def test_a_metrics_address_in_use_or_malformed_is_one_line(
    pipeline_factory: Any, tmp_path: Path
) -> None:
    config = pipeline_factory(1)
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        taken = cli(
            "run",
            *("-c", str(config_path(config)), "--metrics", f"127.0.0.1:{port}"),
            state_dir=tmp_path,
        )
    line = assert_one_clean_line(taken)
    assert line == (
        f"exactly: error: --metrics 127.0.0.1:{port}: cannot serve metrics there (another "
        "process listens there)"
    )
    bad = cli("run", "-c", str(config_path(config)), "--metrics", "9464", state_dir=tmp_path)
    assert "give host:port, or :port for every interface" in assert_one_clean_line(bad)


@pytest.mark.unit
def test_addresses_and_histogram_buckets() -> None:
    assert parse_address(":9464", "--metrics") == ("0.0.0.0", 9464)
    assert parse_address("127.0.0.1:80", "--metrics") == ("127.0.0.1", 80)
    assert parse_address("[::1]:9464", "--metrics") == ("::1", 9464)
    for wrong in ("9464", "host:", "host:70000", "host:http"):
        with pytest.raises(ConfigError, match="give host:port"):
            parse_address(wrong, "--metrics")
    phases = PhaseHistogram()
    phases.observe({"stage": 0.3, "commit": 0.02, "unknown": 5.0})
    phases.observe({"stage": 12.0, "commit": 0.02})
    buckets = dict(phases.buckets("stage"))
    assert buckets["0.25"] == 0 and buckets["0.5"] == 1 and buckets["30.0"] == 2
    assert buckets["+Inf"] == 2 and phases.sums["stage"] == pytest.approx(12.3)
    assert [n for _, n in phases.buckets("commit")] == [0, 2, *[2] * (len(BUCKETS) - 2), 2]
