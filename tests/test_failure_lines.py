"""One clear line for a failure of the machine under the pipeline, never a Java stack: a
real full tmpfs and a real read-only folder under the tables end `exactly run` with one line
naming the cause and the path, exit code 2, and once the space (or the write access) is
back the next run commits every record exactly once.

The folders are real mounts (the suite runs as root in its container); where mounting is not
permitted the tests skip and say so. `chmod` would not do: root writes through it.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from jobs.examples.sample_data import pageviews
from ledger.core.protocol import BatchState
from ledger.store.ledger_store import LedgerStore
from orchestration.pipeline_definitions import pipeline_definitions
from orchestration.tags import REJECTED_TAG
from tests.fixtures.paused import let_go, run_paused_at
from tests.fixtures.pipeline import (
    assert_exactly_once,
    config_path,
    coordinates,
    shared_spark_env,
)

pytestmark = pytest.mark.integration

#: Room for the first batch's table, quarantine and staged files with a wide margin.
TMPFS_SIZE = "16m"


def cli(*args: str, state_dir: Path, shared: bool = False) -> subprocess.CompletedProcess[str]:
    """`exactly` as a subprocess, with its state folder (where unforeseen failures leave
    their tracebacks) inside the test's own folder. `shared`: a run that only sets the
    scene or checks what is left (the batch before the failure, the run once the cause is
    gone) stages on the worker's shared Spark server instead of a JVM of its own; the run
    that fails always runs in the default mode, local Spark in its own JVM."""
    env = {**os.environ, "EXACTLY_STATE_DIR": str(state_dir)}
    return subprocess.run(
        [sys.executable, "-m", "exactly_cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**env, **shared_spark_env()} if shared else env,
    )


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A small tmpfs of its own, unmounted at the end (skips where mount is not allowed)."""
    where = tmp_path / "mnt"
    where.mkdir()
    mounted = _mount("-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(where))
    if mounted.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs here ({mounted.stderr.strip() or mounted.returncode}): "
            "a real full or read-only folder needs root or CAP_SYS_ADMIN"
        )
    try:
        yield where
    finally:
        _mount("-o", "remount,rw", str(where))
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(folder: Path) -> Path:
    """Write a file into `folder` until its file system has no byte left; returns it."""
    filler = folder / "filler"
    chunk = b"\0" * (64 * 1024)
    with open(filler, "wb", buffering=0) as out:
        try:
            while True:
                out.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    # the last partial chunk: tmpfs may still hold a few bytes
    with open(filler, "ab", buffering=0) as out:
        try:
            while True:
                out.write(b"\0" * 512)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler


def assert_one_clean_line(result: subprocess.CompletedProcess[str]) -> str:
    """Exit code 2 and one line on stderr; no Python traceback nor Java frame anywhere."""
    both = result.stdout + result.stderr
    assert "Traceback" not in both, both[-3000:]
    assert not [ln for ln in both.splitlines() if ln.strip().startswith("at org.")], both[-3000:]
    assert "Py4J" not in both, both[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, both[-3000:]
    assert lines[0].startswith("exactly: error: "), lines
    assert result.returncode == 2, both[-3000:]
    return lines[0]


def first_batch(config: Any, kafka_client: Any, state: Path) -> None:
    kafka_client.produce(config.kafka.topic, pageviews(40), partition=0)
    first = cli("run", "-c", str(config_path(config)), state_dir=state, shared=True)
    assert first.returncode == 0, first.stdout + first.stderr
    kafka_client.produce(config.kafka.topic, pageviews(60, start=40), partition=0)


def test_a_full_disk_is_one_line_naming_it_and_nothing_is_lost_once_space_returns(
    kafka_client: Any, pipeline_factory: Any, tmpfs: Path, tmp_path: Path
) -> None:
    config = pipeline_factory(1, table_root=str(tmpfs))
    state = tmp_path / "state"
    first_batch(config, kafka_client, state)
    filler = fill(tmpfs)

    line = assert_one_clean_line(cli("run", "-c", str(config_path(config)), state_dir=state))
    assert "no space left" in line.lower(), line
    assert str(tmpfs) in line, line

    filler.unlink()
    again = cli(
        "run", "-c", str(config_path(config)), "--until-caught-up", state_dir=state, shared=True
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert sum(assert_exactly_once(config, kafka_client)) == 100


@pytest.mark.wide  # its line: the Dagster case below (the same describe_failure); its
# recovery: the full disk's above (the batch taken up again once the cause is gone)
def test_a_read_only_table_folder_is_one_line_naming_it_and_nothing_is_lost_once_writable(
    kafka_client: Any, pipeline_factory: Any, tmpfs: Path, tmp_path: Path
) -> None:
    config = pipeline_factory(1, table_root=str(tmpfs))
    state = tmp_path / "state"
    first_batch(config, kafka_client, state)
    remounted = _mount("-o", "remount,ro", str(tmpfs))
    assert remounted.returncode == 0, remounted.stderr

    line = assert_one_clean_line(cli("run", "-c", str(config_path(config)), state_dir=state))
    assert "read-only" in line.lower(), line
    assert str(tmpfs) in line, line

    assert _mount("-o", "remount,rw", str(tmpfs)).returncode == 0
    again = cli(
        "run", "-c", str(config_path(config)), "--until-caught-up", state_dir=state, shared=True
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert sum(assert_exactly_once(config, kafka_client)) == 100


def test_a_ledger_disk_full_after_the_delta_commit_is_one_line_and_the_next_run_records_it(
    kafka_client: Any, pipeline_factory: Any, tmpfs: Path, tmp_path: Path
) -> None:
    """The ledger's SQLite file on a disk that fills while a batch commits: its Delta commit
    lands, then the ledger cannot record it. One line naming the ledger and the full disk,
    exit code 2; once space is back the next run finds the batch in the table's log (its
    transaction id), records it, and reads on from its end: every record once."""
    config = pipeline_factory(1, ledger_url=f"sqlite:///{tmpfs / 'ledger.db'}")
    state = tmp_path / "state"
    kafka_client.produce(config.kafka.topic, pageviews(100), partition=0)
    pauses = tmp_path / "pauses"
    held = run_paused_at(config, pauses, "after_delta_commit")
    filler = fill(tmpfs)
    code, output = let_go(held, pauses, "after_delta_commit")
    lines = [ln for ln in output.strip().splitlines() if "pause point" not in ln]
    assert code == 2 and len(lines) == 1 and "Traceback" not in output, output[-3000:]
    assert lines[0].startswith(
        f"exactly: error: no space left on device: ledger database sqlite:///{tmpfs}"
    ), lines
    assert lines[0].endswith(
        "; free space there, then run again (nothing is lost: the batch is taken up again)"
    ), lines
    assert sum(coordinates(config.delta.table_uri).values()) == 100  # published, unrecorded

    filler.unlink()
    again = cli(
        "run", "-c", str(config_path(config)), "--until-caught-up", state_dir=state, shared=True
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert sum(assert_exactly_once(config, kafka_client)) == 100
    store = LedgerStore(config.ledger.url)
    try:
        states = [b.state for b in store.batches(app_id=config.app_id)]
    finally:
        store.dispose()
    assert states == [BatchState.ACKED], states


def test_a_ledger_on_a_read_only_folder_is_one_line_naming_it(
    pipeline_factory: Any, tmpfs: Path, tmp_path: Path
) -> None:
    """SQLite cannot even open a WAL ledger on a read-only mount ("unable to open database
    file"): the line says why, from the folder, not that the database is unreachable."""
    config = pipeline_factory(1, ledger_url=f"sqlite:///{tmpfs / 'ledger.db'}")
    state = tmp_path / "state"
    opened = cli("ledger", "-c", str(config_path(config)), state_dir=state)
    assert opened.returncode == 0, opened.stdout + opened.stderr
    assert _mount("-o", "remount,ro", str(tmpfs)).returncode == 0

    line = assert_one_clean_line(cli("run", "-c", str(config_path(config)), state_dir=state))
    assert line.startswith(
        f"exactly: error: read-only file system: ledger database sqlite:///{tmpfs}/ledger.db ("
    ), line
    assert line.endswith(
        "; make it writable, then run again (nothing is lost: the batch is taken up again)"
    ), line


def test_spark_out_of_memory_is_one_line_naming_it_and_its_log_and_nothing_is_lost(
    kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    """A transform whose rows no heap holds, under a 512 MB driver. In local mode the task's
    OutOfMemoryError ends the driver's JVM (Spark's uncaught-exception handler exits it), so
    Python sees only a lost connection: the cause is in the JVM's own log. The line says it
    and names that log; with the transform fixed, the next run commits every record once."""
    config = pipeline_factory(1, transform="tests.transforms:pageviews_exhausting_memory")
    path = config_path(config)
    doc = yaml.safe_load(path.read_text())
    doc["spark"]["conf"] = {"spark.driver.memory": "512m"}
    path.write_text(yaml.safe_dump(doc))
    kafka_client.produce(config.kafka.topic, pageviews(30), partition=0)
    state = tmp_path / "state"

    line = assert_one_clean_line(cli("run", "-c", str(path), state_dir=state))
    assert line.startswith(
        "exactly: error: Spark ran out of memory: Spark at local[2] (Java heap space"
    ), line
    (log,) = (state / "logs").glob("spark-*.log")
    assert str(log) in line and "java.lang.OutOfMemoryError" in log.read_text(), line

    doc["transform"] = "jobs.examples.pageviews:transform"
    path.write_text(yaml.safe_dump(doc))
    again = cli("run", "-c", str(path), "--until-caught-up", state_dir=state)
    assert again.returncode == 0, again.stdout + again.stderr
    assert sum(assert_exactly_once(config, kafka_client)) == 30


def test_an_unforeseen_failure_is_one_line_naming_the_log_file_with_its_traceback(
    kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    config = pipeline_factory(1, transform="tests.transforms:pageviews_failing_in_spark")
    kafka_client.produce(config.kafka.topic, pageviews(10), partition=0)
    state = tmp_path / "state"

    result = cli("run", "-c", str(config_path(config)), state_dir=state)
    both = result.stdout + result.stderr
    assert result.returncode == 1, both[-3000:]
    assert "Traceback" not in both and "at org." not in both, both[-3000:]
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("exactly: error: exactly run failed: "), line
    assert "a transform's own bug" in line, line
    (log,) = (state / "logs").glob("error-*.log")
    assert f"full traceback in {log}" in line, line
    written = log.read_text()
    assert "Traceback (most recent call last)" in written
    assert "\tat org.apache.spark" in written  # the Java stack is kept, in the file
    assert list((state / "logs").glob("spark-*.log")), "the JVM's own stderr has a log file"


@pytest.mark.parametrize(
    ("flag", "surroundings", "said"),
    [
        ("--work-dir", "read-only", "read-only"),
        ("--json-out", "read-only", "read-only"),
        ("--json-out", "full", "no space left"),
    ],
)
def test_a_bench_that_could_not_write_its_figures_is_refused_before_it_starts(
    flag: str, surroundings: str, said: str, tmpfs: Path, tmp_path: Path
) -> None:
    """A full run takes most of an hour: a folder it cannot write into is said in one line
    before a broker starts, not found when the figures are written at the end."""
    if surroundings == "full":
        fill(tmpfs)
    else:
        assert _mount("-o", "remount,ro", str(tmpfs)).returncode == 0
    where = str(tmpfs) if flag == "--work-dir" else str(tmpfs / "figures" / "bench.json")

    result = cli("bench", "--smoke", flag, where, state_dir=tmp_path / "state")
    line = assert_one_clean_line(result)
    assert said in line.lower() and flag in line and str(tmpfs) in line, line
    assert result.stdout == "", result.stdout  # nothing started: no broker, no data set


def test_a_bench_whose_figures_file_is_a_folder_is_refused_before_it_starts(
    tmp_path: Path,
) -> None:
    result = cli("bench", "--smoke", "--json-out", str(tmp_path), state_dir=tmp_path / "state")
    line = assert_one_clean_line(result)
    assert "--json-out" in line and str(tmp_path) in line and "folder" in line, line
    assert result.stdout == "", result.stdout  # nothing started: no broker, no data set


def test_a_table_folder_that_is_not_a_delta_table_is_one_line_naming_it(
    kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    """The table's folder holds a Delta log with no commit in it (a half-copied table, or a
    folder another tool left): one line naming the cause and the folder, exit code 2, and
    nothing voted; once the folder is moved aside, the next run commits every record once."""
    config = pipeline_factory(1)
    kafka_client.produce(config.kafka.topic, pageviews(30), partition=0)
    table = Path(config.delta.table_uri)
    (table / "_delta_log").mkdir(parents=True)
    (table / "_delta_log" / "_last_checkpoint").write_text('{"version": 3, "size": 1}')
    state = tmp_path / "state"

    result = cli("run", "-c", str(config_path(config)), state_dir=state)
    line = assert_one_clean_line(result)
    assert "not a Delta table" in line and str(table) in line, line

    table.rename(tmp_path / "aside")
    again = cli("run", "-c", str(config_path(config)), state_dir=state, shared=True)
    assert again.returncode == 0, again.stdout + again.stderr
    assert_exactly_once(config, kafka_client)


def test_dagster_shows_a_read_only_table_folder_as_one_line_that_alerts(
    kafka_client: Any,
    pipeline_factory: Any,
    tmpfs: Path,
    tmp_path: Path,
    webhook: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stage op's failure is the CLI's line, without frames, and the run-failure sensor
    alerts with it. (That the batch is taken up again is the CLI tests' part: the failed
    batch's owner here is the test process itself, alive, where a real run's has exited.)"""
    monkeypatch.setenv("EXACTLY_STATE_DIR", str(tmp_path / "state"))
    config = pipeline_factory(
        1, table_root=str(tmpfs), alerts={"webhook_url_env": "EXACTLY_TEST_WEBHOOK_URL"}
    )
    kafka_client.produce(config.kafka.topic, pageviews(40), partition=0)
    jobs = pipeline_definitions(config_path(config))
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(jobs.batches.name, ["1", "2"])
        assert jobs.micro_batch.execute_in_process(instance=instance, partition_key="1").success
        kafka_client.produce(config.kafka.topic, pageviews(60, start=40), partition=0)
        assert _mount("-o", "remount,ro", str(tmpfs)).returncode == 0

        result = jobs.micro_batch.execute_in_process(
            instance=instance, partition_key="2", raise_on_error=False
        )
        assert not result.success
        (failed,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
        assert failed.step_key == "pageviews_stage"
        shown = failed.step_failure_data.user_failure_data
        assert shown is not None and shown.description is not None
        assert shown.description.startswith("read-only file system: "), shown.description
        assert str(tmpfs) in shown.description and "\n" not in shown.description
        error = failed.step_failure_data.error
        assert error is not None and (error.message, error.stack) == (shown.description, [])
        run = instance.get_run_by_id(result.run_id)
        assert run is not None and REJECTED_TAG not in run.tags  # a failure: it alerts

        failure = next(e for e in result.all_events if e.event_type_value == "PIPELINE_FAILURE")
        sensor = next(s for s in jobs.sensors if s.name.endswith("_run_failure_sensor"))
        sensor(
            dg.build_run_status_sensor_context(
                sensor_name=sensor.name,
                dagster_event=failure,
                dagster_instance=instance,
                dagster_run=run,
                resources=jobs.resources,
            ).for_run_failure()
        )
        assert webhook.kinds() == ["run_failed"]
        assert webhook.posts[0]["text"] == f"pageviews_stage: {shown.description}"
