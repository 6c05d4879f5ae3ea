"""Invariant 2 on S3, between processes: two processes race to commit the same batch, and two
different batches, to one Delta table on the loopback S3 server; every round, each batch is
in the table exactly once.

delta-rs commits on S3 by writing the log entry with `If-None-Match: *`. The same race
against a store that ignores that header (the fault proxy strips it) must go wrong, and
does: that test keeps the race honest, since a race that never collides would pass both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import asdict
from pathlib import Path

import pytest
from deltalake import DeltaTable

from jobs.stage.parquet_files import describe
from ledger.core.batch import StagedFile
from ledger.core.protocol import OffsetRange
from resources.delta.table import DeltaTarget
from resources.object_storage import storage
from resources.object_storage.embedded_s3 import S3Server, start_s3_server
from tests.fixtures.fault_proxy import FaultProxy
from tests.fixtures.race_publisher import SCHEMA, parquet_of
from tests.fixtures.s3 import put_object

pytestmark = pytest.mark.integration

TOPIC = "pageviews"
LIVE = "pageviews"
BACKFILL = "pageviews.backfill"
ROUNDS = 6
REPLY_TIMEOUT = 120.0


class Racer:
    """One `race_publisher` process, started with `env` as its whole AWS configuration."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.fixtures.race_publisher"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
        )
        assert self.reply_line() == "ready"

    def reply_line(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, f"race_publisher exited with {self.process.wait(REPLY_TIMEOUT)}"
        return line.strip()

    def send(self, command: dict[str, object]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(REPLY_TIMEOUT)


def staged(root: str, app_id: str, batch_id: int, attempt: int, rng: OffsetRange) -> list[dict]:
    """One attempt's staged file on S3, described as its vote records it."""
    folder = storage.join(root, "staged", app_id, f"batch-{batch_id}-attempt-{attempt}")
    put_object(
        storage.join(folder, "part-0.parquet"), parquet_of(rng, f"{app_id}/{batch_id}/{attempt}")
    )
    return [asdict(f) for f in describe(folder, root, "table")]


def at_once(racers: list[Racer], commands: list[dict[str, object]]) -> list[dict[str, object]]:
    """Release every command together (each racer is already waiting on its stdin)."""
    for racer, command in zip(racers, commands, strict=True):
        racer.send(command)
    return [json.loads(racer.reply_line()) for racer in racers]


def rows(root: str) -> Counter[tuple[int, int, str]]:
    data = DeltaTable(root, storage_options=DeltaTarget(root).storage_options).to_pyarrow_table()
    return Counter(
        zip(
            data.column("_kafka_partition").to_pylist(),
            data.column("_kafka_offset").to_pylist(),
            data.column("value").to_pylist(),
            strict=True,
        )
    )


def race_round(racers: list[Racer], root: str) -> list[str]:
    """One round on a fresh table holding live batch 1: live batch 2 published by two
    attempts at once, then live batch 3 and backfill batch 1 at once. Returns what broke
    invariant 2 (empty: each batch once)."""
    first = [StagedFile(**f) for f in staged(root, LIVE, 1, 1, OffsetRange(TOPIC, 0, 0, 10))]
    meta = {"app_id": LIVE, "batch_id": 1}
    assert (
        DeltaTarget(root)
        .publish(app_id=LIVE, batch_id=1, files=first, schema=SCHEMA, metadata=meta)
        .published
    )
    same = OffsetRange(TOPIC, 1, 0, 20)
    same_batch = [
        {
            "uri": root,
            "app_id": LIVE,
            "batch_id": 2,
            "attempt": attempt,
            "files": staged(root, LIVE, 2, attempt, same),
        }
        for attempt in (1, 2)
    ]
    live_3, backfill_1 = OffsetRange(TOPIC, 2, 0, 30), OffsetRange(TOPIC, 3, 0, 40)
    different = [
        {"uri": root, "app_id": LIVE, "batch_id": 3, "attempt": 1,
         "files": staged(root, LIVE, 3, 1, live_3)},
        {"uri": root, "app_id": BACKFILL, "batch_id": 1, "attempt": 1,
         "files": staged(root, BACKFILL, 1, 1, backfill_1)},
    ]  # fmt: skip
    problems: list[str] = []
    same_outcomes = at_once(racers, same_batch)
    problems += [f"same batch: {o['error']}" for o in same_outcomes if "error" in o]
    winners = sum(1 for o in same_outcomes if o.get("published"))
    if winners != 1:
        problems.append(f"same batch: {winners} publishers say they committed it")
    different_outcomes = at_once(racers, different)
    problems += [f"different batches: {o['error']}" for o in different_outcomes if "error" in o]
    if not all(o.get("published") for o in different_outcomes):
        problems.append(f"different batches: not both committed: {different_outcomes}")

    found = rows(root)
    by_partition: dict[int, Counter[tuple[int, str]]] = {}
    for (partition, offset, value), n in found.items():
        by_partition.setdefault(partition, Counter())[(offset, value)] += n
    for partition, rng in ((0, OffsetRange(TOPIC, 0, 0, 10)), (1, same), (2, live_3),
                           (3, backfill_1)):  # fmt: skip
        held = by_partition.get(partition, Counter())
        offsets = Counter(offset for (offset, _value), n in held.items() for _ in range(n))
        if offsets != Counter(range(rng.start, rng.end)):
            copies = Counter(offsets.values())
            problems.append(
                f"partition {partition}: {sum(offsets.values())} rows for "
                f"{rng.end - rng.start} offsets (copies per offset: {dict(copies)})"
            )
        elif len({value for (_offset, value) in held}) != 1:
            problems.append(f"partition {partition}: rows of two attempts")
    target = DeltaTarget(root)
    if (target.transaction_version(LIVE), target.transaction_version(BACKFILL)) != (3, 1):
        problems.append(
            f"app versions {target.transaction_version(LIVE)}, "
            f"{target.transaction_version(BACKFILL)}, not 3 and 1"
        )
    return problems


@pytest.fixture
def s3_racers(s3_env: dict[str, str]) -> Iterator[list[Racer]]:
    both = [Racer(s3_env), Racer(s3_env)]
    try:
        yield both
    finally:
        for racer in both:
            racer.stop()


def test_racing_processes_commit_each_batch_once_on_s3(
    s3_racers: list[Racer], s3_bucket: str
) -> None:
    for round_ in range(ROUNDS):
        root = f"s3://{s3_bucket}/race-{round_}"
        assert race_round(s3_racers, root) == [], f"round {round_}"


@pytest.fixture
def unconditional_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[S3Server, FaultProxy]]:
    """s3proxy behind a proxy that drops `If-None-Match`: a store whose conditional writes
    are plain overwrites. The proxy changes a signed header, so this server checks no
    signatures (`authorization=none`); nothing else differs from the real one."""
    with start_s3_server(tmp_path / "s3", authorization="none") as server:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        server.create_bucket("unconditional")
        with FaultProxy(server.port, frozenset({"if-none-match"})) as proxy:
            yield server, proxy


@pytest.mark.wide  # the control of the race above: what conditional writes prevent
def test_the_same_race_without_conditional_writes_loses_or_duplicates_a_batch(
    unconditional_store: tuple[S3Server, FaultProxy],
) -> None:
    server, proxy = unconditional_store
    env = {**server.env(), "AWS_ENDPOINT_URL": proxy.url}
    racers = [Racer(env), Racer(env)]
    try:
        broken = {
            round_: problems
            for round_ in range(ROUNDS)
            if (problems := race_round(racers, f"s3://unconditional/race-{round_}"))
        }
    finally:
        for racer in racers:
            racer.stop()

    assert proxy.stripped > 0, "no commit went through the proxy"
    assert broken, f"{ROUNDS} rounds without conditional writes and no commit lost"
    print(f"without conditional writes, {len(broken)} of {ROUNDS} rounds broke: {broken}")
