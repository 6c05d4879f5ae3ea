"""The `exactly` command line: one clear line and exit code 2 for bad input; one line per
batch and a readable ledger for good input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobs.examples.sample_data import pageviews
from ledger.core.actions import ActionKind
from ledger.store.ledger_store import LedgerStore
from resources.jvm.process import free_port
from tests.fixtures.pipeline import assert_exactly_once, config_path

EXACTLY = [sys.executable, "-m", "exactly_cli"]
REPO = Path(__file__).resolve().parent.parent


def exactly(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EXACTLY, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("exactly: error: ")
    return lines[0]


def write_config(tmp_path: Path, **changes: Any) -> Path:
    doc = yaml.safe_load((REPO / "pipelines" / "pageviews.yaml").read_text())
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = doc
        for key in parents:
            node = node[key]
        node[leaf] = value
    doc["delta"] = {"table_uri": str(tmp_path / "t"), "quarantine_uri": str(tmp_path / "q")}
    doc["ledger"] = {"url": f"sqlite:///{tmp_path / 'ledger.db'}"}
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_unknown_config_key_is_one_line_naming_the_field(tmp_path: Path) -> None:
    path = write_config(tmp_path, kafka__topik="typo")
    line = one_error_line(exactly("run", "-c", str(path)))
    assert "kafka.topik: unknown key" in line


def test_bad_config_value_is_one_line_naming_the_field(tmp_path: Path) -> None:
    path = write_config(tmp_path, batch__max_records_per_partition=0)
    line = one_error_line(exactly("run", "-c", str(path)))
    assert "batch.max_records_per_partition" in line


@pytest.mark.parametrize("command", ["run", "backfill", "ledger", "recover"])
def test_a_pipeline_named_like_a_backfill_app_id_is_one_line_naming_the_field(
    tmp_path: Path, command: str
) -> None:
    # nothing listens there: the command must stop at the config, before any connection
    broker = f"127.0.0.1:{free_port()}"
    path = write_config(tmp_path, pipeline="pageviews.backfill", kafka__bootstrap_servers=broker)
    extra = ["--partition", "0", "--from", "0", "--to", "1"] if command == "backfill" else []
    line = one_error_line(exactly(command, "-c", str(path), *extra))
    assert "pipeline: Value error, must not end in '.backfill'" in line


def test_missing_config_file(tmp_path: Path) -> None:
    line = one_error_line(exactly("ledger", "-c", str(tmp_path / "nope.yaml")))
    assert "nope.yaml" in line


def test_an_unreachable_ledger_database_is_one_line_naming_it(tmp_path: Path) -> None:
    # psycopg's refusal spans two lines ("... Connection refused" and a tab-indented "Is the
    # server running ..."): the operator must still get exactly one line, the hint kept
    port = free_port()
    path = write_config(tmp_path)
    doc = yaml.safe_load(path.read_text())
    doc["ledger"]["url"] = f"postgresql+psycopg://exactly:secret@127.0.0.1:{port}/ledger"
    path.write_text(yaml.safe_dump(doc))
    line = one_error_line(exactly("ledger", "-c", str(path)))
    assert f"127.0.0.1:{port}" in line and "ledger database" in line, line
    assert "Is the server running" in line, line
    assert "secret" not in line, line


@pytest.mark.integration  # starts no server, but waits out the Kafka client's real timeout (~30 s)
def test_unreachable_broker_is_one_line_naming_it(tmp_path: Path) -> None:
    bootstrap = f"127.0.0.1:{free_port()}"
    # the run waits `kafka.timeout_seconds` for an answer (30 s by default) and says so
    path = write_config(tmp_path, kafka__bootstrap_servers=bootstrap, kafka__timeout_seconds=4)
    line = one_error_line(exactly("run", "-c", str(path)))
    assert f"Kafka at {bootstrap} did not answer within 4s" in line, line
    # nothing was planned: the ledger holds no batch
    ledger = exactly("ledger", "-c", str(path), "--json")
    assert json.loads(ledger.stdout) == []


def test_run_prints_one_line_per_batch_and_ledger_lists_them(
    kafka_client: Any, pipeline_factory: Any
) -> None:
    config = pipeline_factory(2, max_records=150)
    kafka_client.produce(config.kafka.topic, pageviews(500))
    path = str(config_path(config))
    result = exactly("run", "-c", path, "--until-caught-up")
    assert result.returncode == 0, result.stderr
    batch_lines = [line for line in result.stdout.splitlines() if line.startswith("batch ")]
    assert len(batch_lines) >= 2
    for line in batch_lines:
        assert "ACKED" in line and "records=" in line and "files=" in line
        assert "plan=" in line and "stage=" in line and "commit=" in line
    assert "caught up" in result.stdout
    assert_exactly_once(config, kafka_client)

    listed = json.loads(exactly("ledger", "-c", path, "--json").stdout)
    assert len(listed) == len(batch_lines)
    assert {b["state"] for b in listed} == {"ACKED"}
    assert sum(b["metrics"]["records_read"] for b in listed) == 500
    table = exactly("ledger", "-c", path)
    assert table.returncode == 0 and "ACKED" in table.stdout

    again = exactly("recover", "-c", path, "--by", "oncall", "--reason", "after the outage")
    assert again.returncode == 0 and "recovered 0 batch(es)" in again.stdout
    # journaled in the ledger with who and why, whatever it found to do
    store = LedgerStore(config.ledger.url)
    try:
        (action,) = store.actions(config.pipeline)
    finally:
        store.dispose()
    assert (action.kind, action.decided_by, action.reason, action.outcome) == (
        ActionKind.RECOVER,
        "oncall",
        "after the outage",
        "nothing to recover",
    )


@pytest.mark.parametrize("kind", ["missing", "a file"])
def test_bench_work_dir_that_is_no_folder_is_one_line_naming_it(tmp_path: Path, kind: str) -> None:
    """Before any broker or Spark starts: the bench's temporary folder goes below it."""
    work_dir = tmp_path / "nowhere"
    if kind == "a file":
        work_dir.write_text("")
    line = one_error_line(exactly("bench", "--smoke", "--work-dir", str(work_dir)))
    assert f"--work-dir {work_dir}: not a folder" in line, line
    assert "Traceback" not in line
