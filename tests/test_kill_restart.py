"""The product's headline promise under fire: while a producer keeps writing page views (some
malformed) to a real topic, `exactly run` (the real CLI, a child process) is SIGKILLed at
random moments and started again, several times; then the producer stops, one last run
catches up, and the table plus the quarantine must hold every record Kafka holds exactly
once (invariant 1), with nothing else.

The kill takes the child's whole process group (the Python driver and its Spark JVM at once,
as when a machine or container dies), at a moment drawn from a seeded generator: the first
kill counts from the run's first batch (it lands in a later batch staging, voting,
committing, or between two batches), the others from the start (while Spark starts, the
first batch PLANNED). A soak (tests/fixtures/soak.py): two kills in `make test`, one of each
kind, and three in `make soak` (the cluster's runs pay 15-20 s each for the session and its
executors, and each kill is a run more). The seed is in every assertion
message; `EXACTLY_KILL_SEED=<seed>` replays the same moments (the machine's timing still
varies).

Two set-ups: local Spark with local tables and a SQLite ledger; and the loopback standalone
cluster (two workers, the stage job's tasks in executors) with both tables on the loopback
S3 server and a PostgreSQL ledger: where users' data lives. The local one also has derived
outputs (an aggregate, a windowed one, an upsert by user fed tombstones: the producer keys
its records by user), so kills land in their stage, vote and MERGEs too; after the last run
each must equal its recomputation over the raw table.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from jobs.examples.sample_data import MALFORMED, pageviews
from ledger.core.protocol import BatchState
from ledger.store.ledger_store import LedgerStore
from resources.config.pipeline_config import PipelineConfig
from resources.kafka.client import KafkaClient
from tests.fixtures.derived import TRANSFORM, assert_derived_match, derived_outputs, user_events
from tests.fixtures.pipeline import assert_exactly_once, config_path
from tests.fixtures.soak import soak
from tests.test_cli import EXACTLY, REPO

pytestmark = [pytest.mark.integration, pytest.mark.soak]

#: Kills alternate between the two kinds of moment below, the first after the first batch:
#: two kills (the small size) land one of each kind.
KILLS = soak(2, 3)
#: Runs that may end on their own (caught up between two rounds) before KILLS were killed.
MAX_RUNS = 3 * KILLS
#: The first kill, and every other one after it, lands this many seconds after the run's
#: first batch was committed: in a later batch's stage, vote or commit, or between two...
KILL_AFTER_FIRST_BATCH = (0.0, 4.0)
#: ...and the others this many seconds after the start: from Python's imports through the
#: Spark session's start (about 10 s here, more on the cluster; the run's first batch is
#: planned before it, so such a kill finds it PLANNED).
KILL_AFTER_START = (2.0, 12.0)
FIRST_BATCH_TIMEOUT = 300.0
#: The producer: this many records per round, a round every PRODUCE_EVERY seconds.
RECORDS_PER_ROUND = 20
PRODUCE_EVERY = 0.25
MALFORMED_EVERY = 25
#: Small batches, so that a run goes through many of them and a kill often lands inside one.
MAX_RECORDS_PER_PARTITION = 300
FINAL_RUN_TIMEOUT = 600.0
S = BatchState
#: Where every batch must be once the last run caught up: published, or given up unpublished.
FINISHED = frozenset({S.COMMITTED, S.ACKED, S.ABORTED})


class Producer(threading.Thread):
    """Produces page views to `topic` until stopped, with a client of its own: unkeyed, or
    (`keyed_partitions`, for the derived outputs) keyed by user, tombstones among them."""

    def __init__(self, bootstrap: str, topic: str, *, keyed_partitions: int = 0) -> None:
        super().__init__(name="kill-restart-producer", daemon=True)
        self.bootstrap = bootstrap
        self.topic = topic
        self.keyed_partitions = keyed_partitions
        self.produced = 0
        #: how many of them cannot parse (quarantined)
        self.malformed = 0
        self.error: BaseException | None = None
        #: set once the first round is acknowledged, so the first run has records to read
        self.writing = threading.Event()
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            with KafkaClient(self.bootstrap, timeout=60) as client:
                while not self._stopping.is_set():
                    if self.keyed_partitions:
                        records = user_events(
                            self.produced,
                            RECORDS_PER_ROUND,
                            self.keyed_partitions,
                            malformed_every=MALFORMED_EVERY,
                        )
                        produced = client.produce_records(self.topic, records)
                        malformed = sum(1 for _, _, v in records if v in MALFORMED)
                    else:
                        batch = list(
                            pageviews(
                                RECORDS_PER_ROUND,
                                malformed_every=MALFORMED_EVERY,
                                start=self.produced,
                            )
                        )
                        produced = client.produce(self.topic, batch)
                        malformed = sum(1 for v in batch if v in MALFORMED)
                    self.produced += produced
                    self.malformed += malformed
                    self.writing.set()
                    self._stopping.wait(PRODUCE_EVERY)
        except BaseException as error:  # re-raised by the test through `finish`
            self.error = error

    def finish(self) -> int:
        """Stop, and return how many records were acknowledged; raises what broke it."""
        self._stopping.set()
        self.join(timeout=120)
        if self.error is not None:
            raise self.error
        assert not self.is_alive(), "the producer did not stop"
        return self.produced


def kill_seed() -> int:
    configured = os.environ.get("EXACTLY_KILL_SEED")
    return int(configured) if configured else random.SystemRandom().randrange(1_000_000)


def first_batch_done(child: subprocess.Popen[bytes], log: Path) -> float:
    """When the run printed its first batch line (or ended): the clock for a later kill."""
    deadline = time.monotonic() + FIRST_BATCH_TIMEOUT
    while child.poll() is None:
        if any(line.startswith("batch ") for line in log.read_text(errors="replace").splitlines()):
            break
        assert time.monotonic() < deadline, "no batch in time: " + log.read_text(errors="replace")
        time.sleep(0.1)
    return time.monotonic()


def run_and_kill(
    config: PipelineConfig, delay: float, log: Path, *, after_first_batch: bool
) -> str | None:
    """Start `exactly run --until-caught-up`, SIGKILL its process group `delay` s after the
    start, or after its first batch.

    Returns the run's last output line (where the kill found it), or None if the run ended
    on its own before: caught up because its plan came between two of the producer's
    rounds. A run that fails fails the test.
    """
    with open(log, "wb") as out:
        child = subprocess.Popen(
            [*EXACTLY, "run", "-c", str(config_path(config)), "--until-caught-up"],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: the kill takes its Spark JVM too
        )
        clock = first_batch_done(child, log) if after_first_batch else time.monotonic()
        try:
            child.wait(timeout=max(clock + delay - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()  # reaped: recovery must see the owner's pid gone, not a zombie
        else:
            assert child.returncode == 0, (
                f"exactly run failed ({child.returncode}) before its kill at {delay:.1f} s: "
                + log.read_text(errors="replace")
            )
            return None
    lines = log.read_text(errors="replace").strip().splitlines()
    return lines[-1][:160] if lines else "(no output yet)"


@pytest.mark.parametrize(
    ("ledger_url", "where"),
    [
        pytest.param("sqlite", "local", id="local-spark-sqlite"),
        # the same kills on every other deployment at once: `make test-wide`
        pytest.param("postgresql", "cluster", id="cluster-s3-postgresql", marks=pytest.mark.wide),
    ],
    indirect=["ledger_url"],
)
def test_every_record_once_after_random_kills_while_producing(
    ledger_url: str,
    where: str,
    request: pytest.FixtureRequest,
    kafka_broker: str,
    kafka_client: KafkaClient,
    pipeline_factory: Any,
    tmp_path: Path,
) -> None:
    master, table_root, derived = "local[2]", None, None
    transform = "jobs.examples.pageviews:transform"
    if where == "local":
        # derived outputs (an aggregate, a windowed one, an upsert with tombstones) MERGEd
        # in every batch's commit: the kills land in their stage, vote and MERGE too
        derived, transform = derived_outputs(tmp_path / "derived"), TRANSFORM
    if where == "cluster":
        master = request.getfixturevalue("spark_cluster").url
        request.getfixturevalue("s3_env")  # the `exactly run` children inherit the variables
        table_root = f"s3://{request.getfixturevalue('s3_bucket')}/pageviews"
    config = pipeline_factory(
        3,
        ledger_url=ledger_url,
        master=master,
        max_records=MAX_RECORDS_PER_PARTITION,
        table_root=table_root,
        transform=transform,
        derived=derived,
    )
    seed = kill_seed()
    rng = random.Random(seed)
    started = time.monotonic()
    kills: list[str] = []
    producer = Producer(kafka_broker, config.kafka.topic, keyed_partitions=3 if derived else 0)
    producer.start()
    try:
        assert producer.writing.wait(timeout=120), "the producer wrote nothing"
        for n in range(MAX_RUNS):
            late = sum(1 for k in kills if " killed " in k) % 2 == 0
            delay = rng.uniform(*(KILL_AFTER_FIRST_BATCH if late else KILL_AFTER_START))
            when = f"{delay:.1f} s after its {'first batch' if late else 'start'}"
            last = run_and_kill(config, delay, tmp_path / f"run-{n}.log", after_first_batch=late)
            kills.append(
                f"run {n} ended on its own" if last is None else f"run {n} killed {when}: {last}"
            )
            if sum(1 for k in kills if " killed " in k) == KILLS:
                break
    finally:
        produced = producer.finish()
    history = f"seed {seed} (EXACTLY_KILL_SEED={seed} replays it); " + "; ".join(kills)
    assert sum(1 for k in kills if " killed " in k) == KILLS, history

    final_started = time.monotonic()
    final = subprocess.run(
        [*EXACTLY, "run", "-c", str(config_path(config)), "--until-caught-up"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=FINAL_RUN_TIMEOUT,
    )
    assert final.returncode == 0, f"{history}\n{final.stdout}{final.stderr}"
    final_seconds = time.monotonic() - final_started

    try:
        table_rows, quarantined = assert_exactly_once(config, kafka_client)
    except AssertionError as failure:
        raise AssertionError(f"{history}: {failure}") from failure
    assert table_rows + quarantined == produced, history
    assert quarantined == producer.malformed, history
    if derived:
        try:
            assert_derived_match(config)
        except AssertionError as failure:
            raise AssertionError(f"{history}: derived outputs: {failure}") from failure
    store = LedgerStore(config.ledger.url)
    try:
        batches = store.batches(app_id=config.app_id)
    finally:
        store.dispose()
    assert not [b for b in batches if b.state not in FINISHED], history
    cut_short = [b.batch_id for b in batches if b.state is S.ABORTED or b.attempt > 1]
    print(
        f"\n{where}: {produced} records, {len(batches)} batches (cut short by a kill: "
        f"{sorted(cut_short)}), {time.monotonic() - started:.0f} s of which the last run "
        f"{final_seconds:.0f} s; {history}"
    )
