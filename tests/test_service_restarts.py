"""The services a batch depends on, restarted under it at a known moment (issue: hostile
infrastructure): the Kafka broker while a batch stages, and PostgreSQL (the ledger) between
the Delta commit and the ledger's COMMITTED. Each time the run either rides it out or ends
with one `exactly: error:` line and exit code 2 (never a traceback), the next run finishes
what was left, and every record is in the tables once.

The run is held at a pause point (ledger/coordinator/crash.py) while the test stops the service, so
the restart lands where the protocol is most exposed, not wherever a timer happens to fall. Each
test owns its service (a broker, a PostgreSQL cluster): the session's are shared.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from jobs.examples.sample_data import pageviews
from ledger.core.protocol import BatchState
from ledger.store.ledger_store import LedgerStore
from resources.config.loading import load_config
from resources.config.pipeline_config import PipelineConfig
from resources.delta.table import DeltaTarget
from resources.jvm.process import free_port
from resources.kafka.client import KafkaClient
from resources.kafka.embedded_broker import EmbeddedBroker
from tests.fixtures.kafka import BROKER_START_TIMEOUT
from tests.fixtures.pipeline import assert_exactly_once, shared_spark_env
from tests.fixtures.postgres import PostgresServer, find_pg_bin
from tests.fixtures.spark_conf import suite_spark
from tests.test_cli import EXACTLY

pytestmark = pytest.mark.integration

RUN_TIMEOUT = 600
RECORDS = 400
MAX_RECORDS = 100
#: How long the broker stays down once the held run goes on into Spark's read of Kafka.
BROKER_DOWN_SECONDS = 5.0
#: Spark's Kafka client settings that make it give up on a dead broker in ~15 s, not ~3 min
#: (three tries of the API timeout): far above a loopback broker's answer on a busy machine.
SPARK_GIVES_UP_SOONER = {"default.api.timeout.ms": "4000", "request.timeout.ms": "2000"}


class HeldRun:
    """`exactly run` in a child held at `point` until `resume`."""

    def __init__(
        self,
        config: Path,
        point: str,
        folder: Path,
        *args: str,
        env: dict[str, str] | None = None,
    ) -> None:
        self.point, self.folder = point, folder
        folder.mkdir()
        env = {
            **os.environ,
            **(env or {}),
            "EXACTLY_PAUSE_AT": point,
            "EXACTLY_PAUSE_DIR": str(folder),
        }
        self.started = time.monotonic()
        self.child = subprocess.Popen(
            [*EXACTLY, "run", "-c", str(config), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def wait_held(self) -> None:
        while not (self.folder / f"{self.point}.reached").exists():
            if self.child.poll() is not None:
                out, err = self.child.communicate()
                pytest.fail(f"exited {self.child.returncode} before {self.point}:\n{out}{err}")
            assert time.monotonic() - self.started < RUN_TIMEOUT, f"never reached {self.point}"
            time.sleep(0.1)

    def resume(self) -> None:
        (self.folder / f"{self.point}.resume").touch()

    def finish(self) -> tuple[int, str, float]:
        out, err = self.child.communicate(timeout=RUN_TIMEOUT)
        return self.child.returncode, out + err, time.monotonic() - self.started


def exactly(
    *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        [*EXACTLY, *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        env={**os.environ, **(env or {})},
    )
    return done, time.monotonic() - started


def failed_cleanly(code: int, output: str) -> str:
    """The one error line of a run that failed as an operator should see it."""
    assert code == 2 and "Traceback" not in output, output[-5000:]
    errors = [line for line in output.splitlines() if line.startswith("exactly: error: ")]
    assert len(errors) == 1, output[-5000:]
    return errors[0]


def write_config(
    folder: Path,
    bootstrap: str,
    topic: str,
    ledger_url: str,
    spark_options: dict[str, str] | None = None,
) -> Path:
    doc = {
        "pipeline": "restarts",
        "kafka": {
            "bootstrap_servers": bootstrap,
            "topic": topic,
            "spark_options": spark_options or {},
        },
        "delta": {
            "table_uri": str(folder / "table"),
            "quarantine_uri": str(folder / "quarantine"),
        },
        "ledger": {"url": ledger_url},
        "spark": suite_spark(),
        "batch": {"max_records_per_partition": MAX_RECORDS, "lease_seconds": 30},
        "transform": "jobs.examples.pageviews:transform",
    }
    path = folder / "restarts.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def assert_every_batch_once(config: PipelineConfig) -> None:
    """Every batch of the ledger finished (ACKED), each in the table's log as the
    application's transaction, the last one the table's version for it."""
    store = LedgerStore(config.ledger.url)
    try:
        batches = store.batches(pipeline=config.pipeline)
    finally:
        store.dispose()
    live = [b for b in batches if b.state is not BatchState.ABORTED]
    assert live and all(b.state is BatchState.ACKED for b in live), batches
    last = max(b.batch_id for b in live)
    assert DeltaTarget(config.delta.table_uri).transaction_version(live[0].app_id) == last


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    broker = EmbeddedBroker(tmp_path / "kafka", port=free_port())
    broker.start(timeout=BROKER_START_TIMEOUT)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    # not under pytest's basetemp: 0700 root, which the postgres user cannot enter
    root = Path(tempfile.mkdtemp(prefix="exactly-pg-restart-"))
    server = PostgresServer(find_pg_bin(), root)
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize(
    "point",
    [
        "after_plan",  # down as the run checks the planned ranges readable (librdkafka)
        pytest.param(  # down as Spark's Kafka source plans and fetches the read
            "before_stage", marks=pytest.mark.wide
        ),
    ],
)
def test_a_broker_restarted_while_a_batch_stages(
    own_broker: EmbeddedBroker, tmp_path: Path, point: str
) -> None:
    with KafkaClient(own_broker.bootstrap, timeout=60) as client:
        client.create_topic("restarts", 2)
        client.produce("restarts", pageviews(RECORDS, malformed_every=40))
        path = write_config(
            tmp_path, own_broker.bootstrap, "restarts", f"sqlite:///{tmp_path / 'ledger.db'}"
        )
        config = load_config(path)

        # the run stages on this worker's shared Spark server (as a Dagster run does): the
        # restart is the broker's, and a local JVM start per run was most of the test's time
        shared = shared_spark_env()
        held = HeldRun(path, point, tmp_path / "pauses", "--until-caught-up", env=shared)
        held.wait_held()
        own_broker.stop()
        held.resume()
        time.sleep(BROKER_DOWN_SECONDS)  # the batch goes on against a dead broker
        own_broker.start(timeout=BROKER_START_TIMEOUT)
        code, output, seconds = held.finish()
        timings = {"run with the restart": seconds}
        if code != 0:
            print("broker restart: the run failed: " + failed_cleanly(code, output))
            done, timings["recovery run"] = exactly(
                "run", "-c", str(path), "--until-caught-up", env=shared
            )
            assert done.returncode == 0, done.stdout + done.stderr
        print(
            f"broker restart at {point}: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items())
        )
        assert_exactly_once(config, client)
        assert_every_batch_once(config)


def test_a_broker_down_until_spark_gives_up(own_broker: EmbeddedBroker, tmp_path: Path) -> None:
    """The broker goes down after the run checked the ranges readable and before Spark reads
    them, and stays down: Spark's Kafka client gives up, which must be one line naming the
    cluster and the batch (not the Java stack of every retry), and nothing is lost."""
    with KafkaClient(own_broker.bootstrap, timeout=60) as client:
        client.create_topic("restarts", 2)
        client.produce("restarts", pageviews(RECORDS, malformed_every=40))
        path = write_config(
            tmp_path,
            own_broker.bootstrap,
            "restarts",
            f"sqlite:///{tmp_path / 'ledger.db'}",
            # Spark's admin client gives up after 3 tries of this (the default is a minute)
            spark_options=SPARK_GIVES_UP_SOONER,
        )
        config = load_config(path)

        held = HeldRun(path, "before_stage", tmp_path / "pauses", "--until-caught-up")
        held.wait_held()
        own_broker.stop()
        held.resume()
        code, output, seconds = held.finish()
        line = failed_cleanly(code, output)
        assert f"Kafka at {own_broker.bootstrap} unreachable while Spark staged" in line, line
        assert "\tat " not in line and len(line) < 1000, line
        # not voted: the ledger holds it as PLANNED, with no file recorded
        store = LedgerStore(config.ledger.url)
        try:
            (failed,) = store.batches(pipeline=config.pipeline)
        finally:
            store.dispose()
        assert failed.state is BatchState.PLANNED, failed

        own_broker.start(timeout=BROKER_START_TIMEOUT)
        # what is left is checked on the worker's shared server: the failure was local Spark's
        done, recovery = exactly(
            "run", "-c", str(path), "--until-caught-up", env=shared_spark_env()
        )
        assert done.returncode == 0, done.stdout + done.stderr
        print(
            f"broker down until Spark gives up: failed after {seconds:.1f}s, "
            f"recovery run {recovery:.1f}s"
        )
        assert_exactly_once(config, client)
        assert_every_batch_once(config)


def test_the_ledger_database_restarted_between_the_delta_commit_and_committed(
    own_postgres: PostgresServer,
    kafka_broker: str,
    kafka_client: KafkaClient,
    topic_factory: Callable[[int], str],
    tmp_path: Path,
) -> None:
    topic = topic_factory(2)
    kafka_client.produce(topic, pageviews(RECORDS, malformed_every=40))
    path = write_config(tmp_path, kafka_broker, topic, own_postgres.create_database("restarts"))
    config = load_config(path)
    timings: dict[str, float] = {}
    # the runs stage on this worker's shared Spark server: the restart is the database's,
    # and three local JVM starts were most of the test's time
    shared = shared_spark_env()

    # restarted while the run is held: its pooled connection is dead when it writes COMMITTED
    held = HeldRun(path, "after_delta_commit", tmp_path / "restarted", env=shared)
    held.wait_held()
    own_postgres.stop()
    own_postgres.start_again()
    held.resume()
    code, output, timings["restarted before the write"] = held.finish()
    assert code == 0, output[-5000:]

    # down when the run writes COMMITTED: the batch is in Delta, the ledger says PREPARED
    held = HeldRun(path, "after_delta_commit", tmp_path / "down", env=shared)
    held.wait_held()
    own_postgres.stop()
    held.resume()
    code, output, timings["down at the write"] = held.finish()
    line = failed_cleanly(code, output)
    assert "ledger database" in line, line
    own_postgres.start_again()
    done, timings["recovery run"] = exactly("run", "-c", str(path), "--until-caught-up", env=shared)
    assert done.returncode == 0, done.stdout + done.stderr
    print("ledger restart: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
    assert_exactly_once(config, kafka_client)
    assert_every_batch_once(config)
