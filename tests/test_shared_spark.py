"""The shared Spark Connect server (`spark.server: shared`, resources/spark/shared_server.py): runs
in separate processes stage on one server, a server that died is replaced, a pid that now
belongs to another process is not taken for the server, and racing starts start one.

Real broker, real Spark Connect servers started by the product itself, real Delta tables;
each run is a separate `exactly run` process, as a daemon-launched Dagster run is.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from jobs.examples.sample_data import pageviews
from ledger.core.errors import ConfigError
from ledger.store.ledger_store import LedgerStore
from resources.config.loading import load_config
from resources.config.pipeline_config import PipelineConfig
from resources.jvm.process import free_port, process_args
from resources.kafka.client import KafkaClient
from resources.spark.shared_server import (
    STATE_ENV,
    Server,
    ServerKey,
    ensure_server,
    server_mode,
    servers,
    stop_servers,
)
from tests.fixtures.pipeline import assert_exactly_once, config_path

RUN_TIMEOUT = 900
#: How long a run may go on after its server died (generous; the default client waits 10+ min).
STALL_LIMIT = 180
#: Records of the batch whose stage the server dies under: enough that its write job still
#: runs when the test sees the job's first folder (killed then, at once), few enough that
#: the run after it stages them again in seconds.
STAGED_RECORDS = 30_000


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A state folder of the module's own; every server started in it is stopped at the end."""
    env = {**os.environ, STATE_ENV: str(tmp_path_factory.mktemp("state"))}
    try:
        yield env
    finally:
        stop_servers(env)
        assert not [s for s in servers(env) if s.is_ours()]


@pytest.fixture
def shared_config(
    pipeline_factory: Callable[..., PipelineConfig],
) -> PipelineConfig:
    config = pipeline_factory(2)
    path = config_path(config)
    doc = yaml.safe_load(path.read_text())
    doc["spark"]["server"] = "shared"
    path.write_text(yaml.safe_dump(doc))
    shared = load_config(path)
    object.__setattr__(shared, "_path", path)
    return shared


def run(
    config: PipelineConfig, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "exactly_cli", "run", "-c", str(config_path(config)), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def only_server(env: dict[str, str]) -> Server:
    running = [s for s in servers(env) if s.is_ours()]
    assert len(running) == 1, running
    return running[0]


#: `make test-wide`: make test's shared-server cases are the server killed under a stage
#: (a dead server replaced by the next run, and the operator's status and stop) and the
#: racing starts (processes that find a live server start none).
@pytest.mark.wide
def test_runs_in_separate_processes_share_one_server_and_a_dead_one_is_replaced(
    shared_config: PipelineConfig, kafka_client: KafkaClient, state: dict[str, str]
) -> None:
    topic = shared_config.kafka.topic
    kafka_client.produce(topic, pageviews(300, malformed_every=50))
    run(shared_config, state)
    first = only_server(state)

    kafka_client.produce(topic, pageviews(200, start=300, malformed_every=50))
    run(shared_config, state)
    assert only_server(state) == first  # the second process connected; it started nothing
    assert_exactly_once(shared_config, kafka_client)

    # the server dies between runs (OOM killer, an operator): the next run starts another
    os.killpg(first.pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while first.is_ours() and time.monotonic() < deadline:
        time.sleep(0.2)
    kafka_client.produce(topic, pageviews(100, start=500, malformed_every=50))
    run(shared_config, state)
    second = only_server(state)
    assert second.pid != first.pid
    table, quarantine = assert_exactly_once(shared_config, kafka_client)
    assert table + quarantine == 600

    # the operator's view and stop
    status = cli(["spark-server", "status"], state)
    assert f"pid {second.pid}" in status and "running" in status
    assert "stopped 1 shared Spark server(s)" in cli(["spark-server", "stop"], state)
    assert not second.is_ours()


def cli(args: list[str], env: dict[str, str]) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "exactly_cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_a_server_killed_under_a_stage_fails_the_run_in_one_line_and_nothing_stalls(
    shared_config: PipelineConfig, kafka_client: KafkaClient, state: dict[str, str]
) -> None:
    """The server dies while a run's stage waits on it. Spark Connect's client would retry
    an unavailable server for over ten minutes, holding the batch PLANNED by a live owner:
    instead the run fails in one line (exit 2), and the next run starts a server and lands
    the batch once. With `spark.connect_retries: 4` (about 4 s of retries per call, not the
    default's 45 s: the same bound, sooner; the process retries more than one call on its
    way out)."""
    path = config_path(shared_config)
    doc = yaml.safe_load(path.read_text())
    doc["spark"]["connect_retries"] = 4
    path.write_text(yaml.safe_dump(doc))
    topic = shared_config.kafka.topic
    kafka_client.produce(topic, pageviews(100))
    run(shared_config, state)  # a warm server; batch 1
    kafka_client.produce(topic, pageviews(STAGED_RECORDS, start=100))
    store = LedgerStore(shared_config.ledger.url)
    staged = Path(shared_config.delta.table_uri).parent
    try:
        doomed = subprocess.Popen(
            [sys.executable, "-m", "exactly_cli", "run", "-c", str(config_path(shared_config))],
            env=state,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + RUN_TIMEOUT
        while store.get(shared_config.app_id, 2) is None and time.monotonic() < deadline:
            time.sleep(0.2)  # planned: its stage is being sent to the server
        # the server made batch 2's attempt folder: its write job runs (the one job that
        # reads and writes every record) and the stage waits on the server's answer
        while not any(staged.rglob("batch-000000000002-attempt-*")):
            assert doomed.poll() is None, doomed.communicate()
            assert time.monotonic() < deadline, "batch 2 never started staging"
            time.sleep(0.05)
        server = only_server(state)
        os.killpg(server.pid, signal.SIGKILL)
        killed = time.monotonic()
        try:
            _, err = doomed.communicate(timeout=STALL_LIMIT)
        except subprocess.TimeoutExpired:
            doomed.kill()
            doomed.communicate()
            pytest.fail(f"the run still waited on the dead server {STALL_LIMIT} s later")
        print(f"server killed under a stage: the run exited {time.monotonic() - killed:.1f}s later")
        assert doomed.returncode == 2, err
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and "Spark Connect server" in lines[0], err
        assert "nothing was voted" in lines[0]
    finally:
        store.dispose()
    run(shared_config, state, "--until-caught-up")
    assert sum(assert_exactly_once(shared_config, kafka_client)) == 100 + STAGED_RECORDS

    # the run after the death started another server; the operator's view and stop
    replaced = only_server(state)
    assert replaced.pid != server.pid
    status = cli(["spark-server", "status"], state)
    assert f"pid {replaced.pid}" in status and "running" in status
    assert "stopped 1 shared Spark server(s)" in cli(["spark-server", "stop"], state)
    assert not replaced.is_ours()


@pytest.mark.integration
def test_a_pid_now_owned_by_another_process_is_not_taken_for_the_server(
    state: dict[str, str], tmp_path: Path
) -> None:
    """The recorded pid was reused by an unrelated process: that process is neither used as
    the server nor signalled, and a real server is started (a different settings key, so a
    folder of its own)."""
    secret = "hunter2-never-on-a-command-line"
    conf = {"spark.sql.shuffle.partitions": "3", "spark.hadoop.fs.s3a.secret.key": secret}
    started = ensure_server("local[1]", conf, env=state)
    # any user of the host reads command lines (ps): settings, keys among them, stay off it
    assert not [arg for arg in process_args(started.pid) if secret in arg]
    record = started.folder / "server.json"
    started.stop()
    stranger = subprocess.Popen(["sleep", "600"])
    try:
        port = free_port()
        record.write_text(
            f'{{"pid": {stranger.pid}, "port": {port}, "started_at": 0, "master": "local[1]"}}'
        )
        replaced = ensure_server("local[1]", conf, env=state)
        assert replaced.pid not in (stranger.pid, started.pid)
        assert replaced.is_ours() and replaced.answers()
        assert stranger.poll() is None, "an unrelated process was signalled"
        assert process_args(stranger.pid)[0] == "sleep"
    finally:
        stranger.kill()
        stranger.wait()
        stop_servers(state)


@pytest.mark.integration
def test_processes_racing_to_start_the_server_start_one(state: dict[str, str]) -> None:
    code = (
        "from resources.spark.shared_server import ensure_server; "
        "s = ensure_server('local[1]', {'spark.sql.shuffle.partitions': '5'}); "
        "print(s.pid, s.port)"
    )
    racers = [
        subprocess.Popen([sys.executable, "-c", code], env=state, stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    answers = {racer.communicate(timeout=RUN_TIMEOUT)[0].strip() for racer in racers}
    assert all(racer.returncode == 0 for racer in racers)
    assert len(answers) == 1, answers
    stop_servers(state)


def test_the_mode_comes_from_the_config_then_the_environment() -> None:
    assert server_mode(None, env={}) == "local"
    assert server_mode(None, env={"EXACTLY_SPARK_SERVER": "shared"}) == "shared"
    assert server_mode("local", env={"EXACTLY_SPARK_SERVER": "shared"}) == "local"
    with pytest.raises(ConfigError, match="EXACTLY_SPARK_SERVER='remote' is not"):
        server_mode(None, env={"EXACTLY_SPARK_SERVER": "remote"})


def test_other_credentials_or_settings_get_a_server_of_their_own() -> None:
    """A process never stages through a server that holds another process's keys (or a
    rotated key), nor one started with other settings; the key holds secrets only hashed."""
    from resources.object_storage.s3 import S3Access

    def key(conf: dict[str, str], secret: str | None) -> ServerKey:
        access = S3Access(
            region="us-east-1",
            endpoint_url="http://127.0.0.1:9000",
            access_key_id="exactly" if secret else None,
            secret_access_key=secret,
            allow_http=True,
        )
        return ServerKey.of("local[2]", conf, access)

    base = key({}, "old-secret")
    assert key({}, "old-secret").digest == base.digest
    assert key({}, "rotated-secret").digest != base.digest
    assert key({"spark.sql.shuffle.partitions": "8"}, "old-secret").digest != base.digest
    assert ServerKey.of("local[2]", {}, None).digest != base.digest
    assert "old-secret" not in base.credentials


def test_connect_retries_come_from_the_config(tmp_path: Path) -> None:
    """`spark.connect_retries` reaches the stager's sessions; unset, the default's ~45 s."""
    from jobs.stage.spark_stager import SharedSpark
    from resources.spark.session import CONNECT_RETRIES

    doc = {
        "pipeline": "retries",
        "kafka": {"bootstrap_servers": "127.0.0.1:9", "topic": "t"},
        "delta": {"table_uri": str(tmp_path / "t"), "quarantine_uri": str(tmp_path / "q")},
        "ledger": {"url": f"sqlite:///{tmp_path / 'l.db'}"},
        "spark": {"master": "local[1]", "server": "shared"},
    }
    path = tmp_path / "retries.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert SharedSpark.for_config(load_config(path)).connect_retries == CONNECT_RETRIES == 8
    doc["spark"]["connect_retries"] = 3
    path.write_text(yaml.safe_dump(doc))
    assert SharedSpark.for_config(load_config(path)).connect_retries == 3
    doc["spark"]["connect_retries"] = -1
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="connect_retries"):
        load_config(path)
