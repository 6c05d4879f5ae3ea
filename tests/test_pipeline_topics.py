"""A pipeline on several topics against the real broker, Spark and Delta: `kafka.topics`
and `kafka.pattern` (ledger/coordinator/topics.py, jobs/sources/topics_source.py).

Every record of every topic lands once, in the table or the quarantine, with its topic in
its coordinates; a topic created later that matches the pattern is read from its first
record (also with `starting_offsets: latest`) and shows in `exactly ledger`; a re-created
topic stops `exactly run` with the `exactly skip` command that names it, and that command
lets the pipeline go on; so does a deleted topic, with the command that retires it; a crash
after the vote on a two-topic batch is recovered exactly once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from jobs.examples.sample_data import pageviews
from jobs.wiring.pipeline import build
from ledger.store.ledger_store import LedgerStore
from resources.config.pipeline_config import PipelineConfig
from tests.fixtures.pipeline import (
    crash_run,
    produced_coordinates,
    run_until_caught_up,
    shared_spark_env,
)
from tests.fixtures.topic_admin import delete_topic, recreate_topic
from tests.fixtures.topics_config import several_topics_config

EXACTLY = [sys.executable, "-m", "exactly_cli"]


def stored(uri: str) -> Counter[tuple[str, int, int]]:
    """(topic, partition, offset) of every row of a Delta table, counted."""
    if not DeltaTable.is_deltatable(uri):
        return Counter()
    t = DeltaTable(uri).to_pyarrow_table(
        columns=["_kafka_topic", "_kafka_partition", "_kafka_offset"]
    )
    return Counter(
        zip(
            t.column("_kafka_topic").to_pylist(),
            t.column("_kafka_partition").to_pylist(),
            t.column("_kafka_offset").to_pylist(),
            strict=True,
        )
    )


def assert_exactly_once_on(config: PipelineConfig, client: Any, topics: list[str]) -> int:
    """Invariant 1 over table + quarantine, by (topic, partition, offset), on every topic."""
    table, quarantine = stored(config.delta.table_uri), stored(config.delta.quarantine_uri)
    both = table + quarantine
    dupes = {c: n for c, n in both.items() if n > 1}
    assert not dupes, f"duplicated coordinates: {sorted(dupes)[:10]}"
    assert not set(table) & set(quarantine)
    produced = {(t, p, o) for t in topics for p, o in produced_coordinates(client, t)}
    assert set(both) == produced, (
        f"missing {sorted(produced - set(both))[:10]} extra {sorted(set(both) - produced)[:10]}"
    )
    return len(produced)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`exactly` in a child, staging on this worker's shared Spark server (where the crash
    tests' children staged): these tests are about topics, not the local session."""
    return subprocess.run(
        [*EXACTLY, *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, **shared_spark_env()},
    )


@pytest.fixture
def prefix() -> str:
    return f"orders-{uuid.uuid4().hex[:8]}"


def test_a_list_of_two_topics_lands_every_record_once_with_its_topic(
    spark: Any, kafka_client: Any, kafka_broker: str, tmp_path: Path, prefix: str
) -> None:
    a, b = f"{prefix}-a", f"{prefix}-b"
    kafka_client.create_topic(a, 2)
    kafka_client.create_topic(b, 1)
    kafka_client.produce(a, pageviews(120, malformed_every=25))
    kafka_client.produce(b, pageviews(40, start=1000, malformed_every=9))
    config = several_topics_config(tmp_path, kafka_broker, {"topics": [a, b]}, max_records=50)
    reports = run_until_caught_up(build(config, spark_factory=lambda: spark))
    assert len(reports) >= 2  # 120 records over 2 partitions at 50 per partition
    first = reports[0].batch
    assert {r.topic for r in first.ranges} == {a, b}
    assert set(first.topic_ids) == {a, b}
    assert assert_exactly_once_on(config, kafka_client, [a, b]) == 160
    assert {t for t, _, _ in stored(config.delta.quarantine_uri)} == {a, b}


def test_a_topic_that_matches_the_pattern_later_is_read_and_shown_by_exactly_ledger(
    spark: Any, kafka_client: Any, kafka_broker: str, tmp_path: Path, prefix: str
) -> None:
    x, y, z = f"{prefix}-x", f"{prefix}-y", f"{prefix}-z"
    kafka_client.create_topic(x, 2)
    kafka_client.create_topic(y, 1)
    kafka_client.create_topic(f"not-{prefix}-w", 1)  # a search would match it; a full match not
    kafka_client.produce(x, pageviews(30))
    kafka_client.produce(y, pageviews(10, start=100))
    kafka_client.produce(f"not-{prefix}-w", pageviews(5))
    config = several_topics_config(tmp_path, kafka_broker, {"pattern": f"{prefix}-.*"})
    tpc = build(config, spark_factory=lambda: spark)
    (first,) = run_until_caught_up(tpc)
    assert {r.topic for r in first.batch.ranges} == {x, y}

    kafka_client.create_topic(z, 2)
    kafka_client.produce(z, pageviews(12, start=500))
    kafka_client.produce(x, pageviews(3, start=200))
    (second,) = run_until_caught_up(tpc)
    z_ranges = sorted((r.partition, r.start) for r in second.batch.ranges if r.topic == z)
    assert z_ranges == [(0, 0), (1, 0)]  # from its first record
    assert set(second.batch.topic_ids) == {x, y, z}
    assert assert_exactly_once_on(config, kafka_client, [x, y, z]) == 55

    shown = cli("ledger", "-c", str(tmp_path / "orders.yaml"))
    assert shown.returncode == 0, shown.stderr
    line = next(ln for ln in shown.stdout.splitlines() if ln.split()[:1] == ["2"])
    assert f"{z}-0:[0," in line and f"{x}-0:" in line


def test_a_topic_created_while_a_pattern_pipeline_runs_from_latest_loses_no_record(
    spark: Any, kafka_client: Any, kafka_broker: str, tmp_path: Path, prefix: str
) -> None:
    """`starting_offsets: latest` skips what the matched topics held when the pipeline
    started, and nothing else: a topic created afterwards, and produced to before the next
    plan sees it, is read from its first record (and so is a partition added to a topic
    already read). One process keeps the pipeline across, as `run --continuous` does."""
    x, z = f"{prefix}-x", f"{prefix}-z"
    kafka_client.create_topic(x, 2)
    kafka_client.produce_to_partitions(x, {0: pageviews(10)})  # before the start
    config = several_topics_config(
        tmp_path, kafka_broker, {"pattern": f"{prefix}-.*", "starting_offsets": "latest"}
    )
    tpc = build(config, spark_factory=lambda: spark)
    run_until_caught_up(tpc)  # pins x at its end

    kafka_client.create_topic(z, 2)
    kafka_client.produce(z, pageviews(12, start=500))
    kafka_client.produce(x, pageviews(3, start=200))
    run_until_caught_up(tpc)

    read = stored(config.delta.table_uri)
    assert max(read.values()) == 1
    produced = {(t, p, o) for t in (x, z) for p, o in produced_coordinates(kafka_client, t)}
    assert set(read) == produced - {(x, 0, o) for o in range(10)}
    assert len(read) == 15


def test_a_recreated_topic_stops_exactly_run_with_the_skip_command_naming_it(
    spark: Any, kafka_client: Any, kafka_broker: str, tmp_path: Path, prefix: str
) -> None:
    a, b = f"{prefix}-a", f"{prefix}-b"
    kafka_client.create_topic(a, 1)
    kafka_client.create_topic(b, 1)
    kafka_client.produce(a, pageviews(5))
    kafka_client.produce(b, pageviews(5, start=100))
    config = several_topics_config(tmp_path, kafka_broker, {"topics": [a, b]})
    run_until_caught_up(build(config, spark_factory=lambda: spark))

    new_id = recreate_topic(kafka_broker, b, 1)
    kafka_client.produce(b, pageviews(4, start=300))
    kafka_client.produce(a, pageviews(2, start=400))
    path = str(tmp_path / "orders.yaml")
    stopped = cli("run", "-c", path)
    assert stopped.returncode == 2, stopped.stdout + stopped.stderr
    assert "Traceback" not in stopped.stderr
    error = [ln for ln in stopped.stderr.splitlines() if ln.strip()]
    assert len(error) == 1, stopped.stderr
    command = f"exactly skip new-topic -c {path} --topic {b} --topic-id {new_id}"
    assert error[0].startswith("error: ") or f"topic {b}" in error[0]
    assert command in error[0]
    assert LedgerStore(config.ledger.url).last_batch_id(config.app_id) == 1

    accepted = cli(
        "skip", "new-topic", "-c", path, "--topic", b, "--topic-id", new_id, "--reason", "test"
    )
    assert accepted.returncode == 0, accepted.stderr
    ran = cli("run", "-c", path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    store = LedgerStore(config.ledger.url)
    (batch,) = store.batches(app_id=config.app_id, limit=1)
    assert [str(r) for r in batch.ranges] == [f"{a}-0[5,7)", f"{b}-0[0,4)"]
    assert batch.topic_ids[b] == new_id
    assert [d.topic for d in batch.decisions] == [b]


def test_a_deleted_topic_stops_exactly_run_until_retired_and_the_others_go_on(
    spark: Any, kafka_client: Any, kafka_broker: str, tmp_path: Path, prefix: str
) -> None:
    """A topic matched by the pattern is deleted: `exactly run` stops in one line naming
    `exactly skip retire-topic` for it; that command, run as printed, lets the other topic
    go on, every one of its records once, and the deleted topic's records stay as they
    landed."""
    a, b = f"{prefix}-a", f"{prefix}-b"
    kafka_client.create_topic(a, 1)
    kafka_client.create_topic(b, 2)
    kafka_client.produce(a, pageviews(5))
    kafka_client.produce(b, pageviews(6, start=100))
    config = several_topics_config(tmp_path, kafka_broker, {"pattern": f"{prefix}-.*"})
    run_until_caught_up(build(config, spark_factory=lambda: spark))
    landed = {(t, p, o) for t, p, o in stored(config.delta.table_uri) if t == b}
    assert len(landed) == 6

    delete_topic(kafka_broker, b)
    kafka_client.produce(a, pageviews(3, start=200))
    path = str(tmp_path / "orders.yaml")
    stopped = cli("run", "-c", path)
    assert stopped.returncode == 2, stopped.stdout + stopped.stderr
    error = [ln for ln in stopped.stderr.splitlines() if ln.strip()]
    assert len(error) == 1, stopped.stderr
    command = f"exactly skip retire-topic -c {path} --topic {b} --reason"
    assert command in error[0]

    retired = cli("skip", "retire-topic", "-c", path, "--topic", b, "--reason", "gone")
    assert retired.returncode == 0, retired.stdout + retired.stderr
    assert f"retire-topic: retire topic {b}" in retired.stdout
    reports = run_until_caught_up(build(config, spark_factory=lambda: spark))
    assert [str(r) for r in reports[0].batch.ranges] == [f"{a}-0[5,8)"]
    assert [d.kind for d in reports[0].batch.decisions] == ["retire-topic"]
    table = stored(config.delta.table_uri)
    assert {c for c in table if c[0] == b} == landed
    assert sorted(o for t, _, o in table if t == a) == list(range(8))
    assert max(table.values()) == 1


def test_an_upsert_on_two_topics_is_rebuilt_equal_to_the_live_one_unless_one_was_recreated(
    spark: Any, kafka_client: Any, kafka_broker: str, tmp_path: Path, prefix: str
) -> None:
    """`exactly derived rebuild` of an upsert output on a pipeline reading two topics: the
    same users in both, so keys meet across topics. The rebuilt table equals the one the
    live MERGEs built (one order, jobs/derived/partials.py); once one topic is re-created,
    a full rebuild is refused naming that topic, and an empty start is the way on."""
    import shutil

    from jobs.derived.invariants import live_rows
    from tests.fixtures.derived import TRANSFORM, assert_derived_match, user_events

    a, b = f"{prefix}-a", f"{prefix}-b"
    kafka_client.create_topic(a, 2)
    kafka_client.create_topic(b, 2)
    kafka_client.produce_records(a, user_events(0, 120, 2))
    kafka_client.produce_records(b, user_events(1_000, 120, 2))
    upsert = {"kind": "upsert", "name": "users", "table_uri": f"{tmp_path}/users", "key": ["user"]}
    config = several_topics_config(
        tmp_path, kafka_broker, {"topics": [a, b]}, max_records=40,
        transform=TRANSFORM, derived=[upsert],
    )  # fmt: skip
    assert len(run_until_caught_up(build(config, spark_factory=lambda: spark))) >= 2
    live = live_rows(DeltaTable(upsert["table_uri"]).to_pyarrow_table())
    assert_derived_match(config)

    path = str(tmp_path / "orders.yaml")
    shutil.rmtree(upsert["table_uri"])
    rebuilt = cli("derived", "rebuild", "-c", path, "users")
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    again = live_rows(DeltaTable(upsert["table_uri"]).to_pyarrow_table())
    assert again.sort_by("user").to_pylist() == live.sort_by("user").to_pylist()
    assert_derived_match(config)

    recreate_topic(kafka_broker, b, 2)
    shutil.rmtree(upsert["table_uri"])
    refused = cli("derived", "rebuild", "-c", path, "users")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    error = [ln for ln in refused.stderr.splitlines() if ln.strip()]
    assert len(error) == 1 and f"of topic {b}, now " in error[0], refused.stderr
    assert "--empty" in error[0]
    started = cli("derived", "rebuild", "--empty", "-c", path, "users")
    assert started.returncode == 0, started.stdout + started.stderr


@pytest.mark.parametrize(
    ("point", "ledger"),
    # each point and each ledger once in `make test`, every pair in `make test-wide`
    [
        ("after_prepare", "lost"),
        ("between_table_commits", "kept"),
        pytest.param("after_prepare", "kept", marks=pytest.mark.wide),
        pytest.param("between_table_commits", "lost", marks=pytest.mark.wide),
    ],
)
def test_a_crash_after_the_vote_on_two_topics_is_recovered_exactly_once(
    kafka_client: Any, kafka_broker: str, tmp_path: Path, prefix: str, point: str, ledger: str
) -> None:
    """A real `exactly run` on two topics (by pattern) killed past the vote, then a plain
    `exactly run` with the ledger kept or deleted: every record of every topic once. A
    topic that matches only after the crash is not part of the voted batch."""
    a, b, c = f"{prefix}-a", f"{prefix}-b", f"{prefix}-c"
    kafka_client.create_topic(a, 2)
    kafka_client.create_topic(b, 1)
    kafka_client.produce(a, pageviews(40, malformed_every=7))
    kafka_client.produce(b, pageviews(20, start=100, malformed_every=5))
    config = several_topics_config(tmp_path, kafka_broker, {"pattern": f"{prefix}-.*"})
    object.__setattr__(config, "_path", tmp_path / "orders.yaml")
    crash_run(config, point)
    store = LedgerStore(config.ledger.url)
    (voted,) = store.batches(app_id=config.app_id)
    assert str(voted.state) == "PREPARED"
    ids = voted.topic_ids
    assert set(ids) == {a, b}
    assert stored(config.delta.table_uri) == Counter()
    store.dispose()
    if ledger == "lost":
        (tmp_path / "ledger.db").unlink()

    kafka_client.create_topic(c, 1)  # matches only after the vote
    kafka_client.produce(c, pageviews(3, start=900))
    ran = cli("run", "-c", str(tmp_path / "orders.yaml"))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    store = LedgerStore(config.ledger.url)
    first = store.get(config.app_id, 1)
    assert first is not None and str(first.state) in ("COMMITTED", "ACKED")
    if (point, ledger) != ("after_prepare", "lost"):  # else nothing held batch 1: re-planned
        assert {r.topic for r in first.ranges} == {a, b}
        assert first.topic_ids == ids
    assert assert_exactly_once_on(config, kafka_client, [a, b, c]) == 63


def test_a_replace_backfill_of_one_topic_keeps_every_record_of_both_once(
    spark: Any, kafka_client: Any, kafka_broker: str, tmp_path: Path, prefix: str
) -> None:
    """`exactly backfill --topic b --mode replace` on a two-topic pipeline: the replace is
    one batch on b's id, its rows replace b's committed rows in the same Delta commit, and
    every record of both topics is still in the tables once."""
    a, b = f"{prefix}-a", f"{prefix}-b"
    kafka_client.create_topic(a, 1)
    kafka_client.create_topic(b, 1)
    kafka_client.produce(a, pageviews(60, malformed_every=25))
    kafka_client.produce(b, pageviews(40, start=1000, malformed_every=9))
    config = several_topics_config(tmp_path, kafka_broker, {"topics": [a, b]})
    assert run_until_caught_up(build(config, spark_factory=lambda: spark))
    done = cli("backfill", "-c", str(tmp_path / "orders.yaml"), "--topic", b,
               "--partition", "0", "--from", "0", "--to", "40", "--mode", "replace")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    store = LedgerStore(config.ledger.url)
    try:
        (replace,) = store.batches(app_id=f"{config.app_id}.backfill")
    finally:
        store.dispose()
    assert replace.state.value in ("COMMITTED", "ACKED")
    assert {r.topic for r in replace.ranges} == {b} and set(replace.topic_ids) == {b}
    assert assert_exactly_once_on(config, kafka_client, [a, b]) == 100
