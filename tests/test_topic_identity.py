"""Topic identity (invariant 10) and recorded skips (invariant 15) against the real broker,
Spark and delta-rs: a re-created or re-pointed topic, offsets lost to retention and commit
info lost from the Delta log each stop the pipeline with one line naming the way forward,
and only an operator's recorded `exactly skip` lets it continue, exactly once from there.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from jobs.examples.sample_data import pageviews
from jobs.wiring.pipeline import Pipeline, build
from orchestration.health.stuck_sensor import evaluate
from resources.alerts.webhook import AlertsResource
from resources.delta.log import METADATA_KEY
from tests.fixtures.pipeline import (
    assert_exactly_once,
    config_path,
    coordinates,
    crash_run,
    produced_coordinates,
)
from tests.fixtures.topic_admin import delete_records_before, recreate_topic, topic_id_of
from tests.test_backfill import cli


def exactly(*args: str) -> subprocess.CompletedProcess[str]:
    """`exactly` as an operator runs it; a run that stages does so on this worker's shared
    Spark server (these tests are about topics and decisions, not the local session)."""
    return cli(*args)


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def run_until_caught_up(config: Any, spark: Any) -> list[Any]:
    tpc = build(config, spark_factory=lambda: spark)
    tpc.recover_and_commit()
    reports = []
    while (report := tpc.run_batch()) is not None:
        reports.append(report)
    return reports


def rows_by_batch(config: Any) -> dict[int, Counter[tuple[int, int]]]:
    """(partition, offset) of every row of table and quarantine, per `_batch_id`."""
    found: dict[int, Counter[tuple[int, int]]] = {}
    for uri in (config.delta.table_uri, config.delta.quarantine_uri):
        if not DeltaTable.is_deltatable(uri):
            continue
        cols = ["_batch_id", "_kafka_partition", "_kafka_offset"]
        for row in DeltaTable(uri).to_pyarrow_table(columns=cols).to_pylist():
            found.setdefault(row["_batch_id"], Counter())[
                (row["_kafka_partition"], row["_kafka_offset"])
            ] += 1
    return found


def commit_meta(config: Any, batch_id: int) -> dict[str, Any]:
    """The exactly commit metadata of the data table's commit of live batch `batch_id`."""
    for entry in DeltaTable(config.delta.table_uri).history():
        meta = entry.get(METADATA_KEY)
        if isinstance(meta, str):
            meta = json.loads(meta)
        if isinstance(meta, dict) and (meta.get("app_id"), meta.get("batch_id")) == (
            config.app_id,
            batch_id,
        ):
            return meta
    raise AssertionError(f"no commit of batch {batch_id} in {config.delta.table_uri}")


def ledger_json(path: str, *extra: str) -> Any:
    result = exactly("ledger", "-c", path, "--json", *extra)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_recreated_topic_stops_the_pipeline_until_an_operator_accepts_it(
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    config = pipeline_factory(2)
    topic, bootstrap, path = config.kafka.topic, config.kafka.bootstrap_servers, ""
    path = str(config_path(config))
    kafka_client.produce_to_partitions(
        topic, {p: list(pageviews(100, start=100 * p)) for p in (0, 1)}
    )
    (first,) = run_until_caught_up(config, spark)
    old_id = topic_id_of(bootstrap, topic)

    new_id = recreate_topic(bootstrap, topic, 2)
    kafka_client.produce_to_partitions(
        topic, {p: list(pageviews(150, start=1000 + 150 * p)) for p in (0, 1)}
    )
    # the stored positions (100 per partition) belong to the deleted topic: continuing from
    # them would skip the new topic's first 100 records of every partition
    line = one_error_line(exactly("run", "-c", path, "--until-caught-up"))
    assert topic in line and old_id in line and new_id in line
    assert f"exactly skip new-topic -c {path} --topic-id {new_id} --reason" in line
    assert [b["batch_id"] for b in ledger_json(path)] == [first.batch.batch_id]
    # no batch is in flight, so only the blocked alert tells a person (once, not per tick)
    heard: list[str] = []
    with Pipeline(config) as watched:
        _, cursor = evaluate(watched, AlertsResource(), None, heard.append)
        _, cursor = evaluate(watched, AlertsResource(), cursor, heard.append)
    (blocked,) = heard
    assert "[blocked]" in blocked and old_id in blocked and new_id in blocked

    # a careless accept of an id that is not the topic's current one is refused
    wrong = one_error_line(
        exactly("skip", "new-topic", "-c", path, "--topic-id", old_id, "--reason", "oops")
    )
    assert new_id in wrong
    accepted = exactly(
        "skip",
        "new-topic",
        "-c",
        path,
        "--topic-id",
        new_id,
        "--reason",
        "topic re-created by ticket OPS-42",
        "--by",
        "alice",
    )
    assert accepted.returncode == 0, accepted.stderr

    with Pipeline(config) as watched:
        _, cursor = evaluate(watched, AlertsResource(), cursor, heard.append)
    assert len(heard) == 2 and "[resolved]" in heard[1] and "planned again" in heard[1]

    reports = run_until_caught_up(config, spark)
    assert reports
    by_batch = rows_by_batch(config)
    old_rows = by_batch.pop(first.batch.batch_id)
    assert sum(old_rows.values()) == 200  # the old topic's rows stay, as history
    new_rows: Counter[tuple[int, int]] = sum(by_batch.values(), Counter())
    assert set(new_rows.values()) == {1}
    assert set(new_rows) == produced_coordinates(kafka_client, topic)
    assert len(new_rows) == 300

    (decision,) = ledger_json(path, "--decisions")
    assert decision["kind"] == "new-topic"
    assert (decision["previous_topic_id"], decision["topic_id"]) == (old_id, new_id)
    assert (decision["decided_by"], decision["reason"]) == (
        "alice",
        "topic re-created by ticket OPS-42",
    )
    listing = exactly("ledger", "-c", path)
    assert "new-topic" in listing.stdout and "alice" in listing.stdout
    carried = commit_meta(config, reports[0].batch.batch_id)
    assert carried["topic_id"] == new_id
    assert [d["id"] for d in carried["decisions"]] == [decision["id"]]
    assert commit_meta(config, first.batch.batch_id)["topic_id"] == old_id
    if len(reports) > 1:
        assert commit_meta(config, reports[1].batch.batch_id)["decisions"] == []


def test_a_pipeline_repointed_at_another_topic_is_refused(
    spark: Any, kafka_client: Any, pipeline_factory: Any, topic_factory: Any
) -> None:
    config = pipeline_factory(2)
    kafka_client.produce(config.kafka.topic, pageviews(200))
    run_until_caught_up(config, spark)
    other = topic_factory(2)
    kafka_client.produce_to_partitions(
        other, {p: list(pageviews(300, start=300 * p)) for p in (0, 1)}
    )
    repointed = pipeline_factory(2, topic=other)  # same ledger and tables, another topic
    bootstrap = config.kafka.bootstrap_servers
    line = one_error_line(exactly("run", "-c", str(config_path(repointed))))
    assert other in line and config.kafka.topic in line
    assert topic_id_of(bootstrap, config.kafka.topic) in line
    assert topic_id_of(bootstrap, other) in line
    assert coordinates(config.delta.table_uri).total() == 200


def test_offsets_lost_to_retention_are_skipped_only_by_a_recorded_decision(
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    config = pipeline_factory(2, max_records=50)
    topic, bootstrap = config.kafka.topic, config.kafka.bootstrap_servers
    path = str(config_path(config))
    kafka_client.produce_to_partitions(
        topic, {p: list(pageviews(200, start=200 * p)) for p in (0, 1)}
    )
    tpc = build(config, spark_factory=lambda: spark)
    first = tpc.run_batch()  # [0, 50) of each partition
    assert first is not None
    delete_records_before(bootstrap, topic, 0, 120)

    line = one_error_line(exactly("run", "-c", path))
    assert f"{topic}-0: offsets [50, 120) are no longer in Kafka" in line
    assert f"exactly skip lost-offsets -c {path} --partition 0 --reason" in line
    # skipping further than what is lost would drop records Kafka still holds
    greedy = one_error_line(
        exactly(
            "skip",
            "lost-offsets",
            "-c",
            path,
            "--partition",
            "0",
            "--to",
            "150",
            "--reason",
            "retention",
        )
    )
    assert "[120, 150)" in greedy and "--force" in greedy
    nothing = one_error_line(
        exactly("skip", "lost-offsets", "-c", path, "--partition", "1", "--reason", "why not")
    )
    assert f"{topic}-1" in nothing and "nothing" in nothing
    skipped = exactly(
        "skip",
        "lost-offsets",
        "-c",
        path,
        "--partition",
        "0",
        "--reason",
        "retention ran during the outage of 2026-11-20",
        "--by",
        "bob",
    )
    assert skipped.returncode == 0, skipped.stderr
    assert f"{topic}-0[50,120)" in skipped.stdout

    reports = run_until_caught_up(config, spark)
    assert reports and reports[0].batch.ranges[0].start == 120
    stored = coordinates(config.delta.table_uri) + coordinates(config.delta.quarantine_uri)
    assert set(stored.values()) == {1}
    expected = {(0, o) for o in [*range(50), *range(120, 200)]} | {(1, o) for o in range(200)}
    assert set(stored) == expected

    (decision,) = ledger_json(path, "--decisions")
    assert decision["kind"] == "lost-offsets" and decision["decided_by"] == "bob"
    assert decision["skipped"] == [{"topic": topic, "partition": 0, "start": 50, "end": 120}]
    assert decision["forced"] is False
    listing = exactly("ledger", "-c", path)
    assert f"{topic}-0[50,120)" in listing.stdout and "bob" in listing.stdout
    carried = commit_meta(config, reports[0].batch.batch_id)
    assert [d["skipped"] for d in carried["decisions"]] == [decision["skipped"]]


def test_lost_commit_info_needs_the_positions_stated_by_an_operator(
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    config = pipeline_factory(2, max_records=60)
    topic, path = config.kafka.topic, str(config_path(config))
    kafka_client.produce_to_partitions(
        topic, {p: list(pageviews(100, start=100 * p)) for p in (0, 1)}
    )
    assert len(run_until_caught_up(config, spark)) == 2
    # another writer compacts the table, a checkpoint follows and log cleanup deletes the
    # commits before it: the table keeps its transaction version and its rows, but the
    # commits that carried the offsets are gone; and the ledger is lost too
    table = DeltaTable(config.delta.table_uri)
    table.optimize.compact()
    table.create_checkpoint()
    log = Path(config.delta.table_uri) / "_delta_log"
    for commit in log.glob("*.json"):
        if int(commit.stem) < table.version():
            commit.unlink()
    ledger_file = Path(config.ledger.url.removeprefix("sqlite:///"))
    for suffix in ("", "-wal", "-shm"):
        Path(f"{ledger_file}{suffix}").unlink(missing_ok=True)

    line = one_error_line(exactly("run", "-c", path))
    assert "offsets cannot be rebuilt" in line
    assert f"exactly skip resume-at -c {path}" in line
    assert "0=100" in line and "1=100" in line  # what the table's rows suggest

    # more records arrive meanwhile: a careless position would skip some of them
    kafka_client.produce_to_partitions(
        topic, {p: list(pageviews(40, start=1000 + 40 * p)) for p in (0, 1)}
    )

    duplicating = one_error_line(
        exactly(
            "skip",
            "resume-at",
            "-c",
            path,
            "--position",
            "0=80",
            "--position",
            "1=100",
            "--reason",
            "log cleanup",
        )
    )
    assert f"{topic}-0" in duplicating and "[80, 100)" in duplicating
    skipping = one_error_line(
        exactly(
            "skip",
            "resume-at",
            "-c",
            path,
            "--position",
            "0=100",
            "--position",
            "1=130",
            "--reason",
            "log cleanup",
        )
    )
    assert f"{topic}-1" in skipping and "--force" in skipping
    stated = exactly(
        "skip",
        "resume-at",
        "-c",
        path,
        "--position",
        "0=100",
        "--position",
        "1=100",
        "--reason",
        "log cleanup removed commits 0-2",
    )
    assert stated.returncode == 0, stated.stderr

    reports = run_until_caught_up(config, spark)
    assert reports and reports[0].batch.batch_id == 3  # above the table's version
    table_rows, quarantined = assert_exactly_once(config, kafka_client)
    assert table_rows + quarantined == 280
    (decision,) = ledger_json(path, "--decisions")
    assert decision["kind"] == "resume-at"
    assert decision["positions"] == {"0": 100, "1": 100}
    assert [d["id"] for d in commit_meta(config, 3)["decisions"]] == [decision["id"]]


@pytest.mark.parametrize(
    # before the vote the decision is planned again (the live matrix's abandonment):
    # `make test-wide`; after it, the voted batch must carry the decision
    "point",
    [pytest.param("after_plan", marks=pytest.mark.wide), "after_prepare"],
)
def test_a_crash_after_a_skip_still_commits_the_decision_once(
    point: str, spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    config = pipeline_factory(1, max_records=100)
    topic, path = config.kafka.topic, str(config_path(config))
    kafka_client.produce(topic, pageviews(300), partition=0)
    tpc = build(config, spark_factory=lambda: spark)
    assert tpc.run_batch() is not None  # [0, 100)
    delete_records_before(config.kafka.bootstrap_servers, topic, 0, 150)
    skipped = exactly("skip", "lost-offsets", "-c", path, "--reason", "retention")
    assert skipped.returncode == 0, skipped.stderr

    crash_run(config, point)  # batch 2, planned on the decision, dies there
    run_until_caught_up(config, spark)
    stored = coordinates(config.delta.table_uri) + coordinates(config.delta.quarantine_uri)
    assert set(stored.values()) == {1}
    assert set(stored) == {(0, o) for o in [*range(100), *range(150, 300)]}
    (decision,) = ledger_json(path, "--decisions")
    carriers = [b for b in ledger_json(path) if b["state"] == "ACKED" and b["decisions"]]
    assert [[d["id"] for d in b["decisions"]] for b in carriers] == [[decision["id"]]]
    assert [d["id"] for d in commit_meta(config, carriers[0]["batch_id"])["decisions"]] == [
        decision["id"]
    ]


def test_a_new_topic_is_refused_while_an_upsert_output_would_keep_the_old_records(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    """Invariant 10 with an upsert output (docs/derived-tables.md "Topic re-created"): the
    re-created topic's offsets restart at 0, below the old topic's, so an upsert's
    (partition, offset) order would let the old topic's records win over the newer ones for
    ever (new values for existing keys silently dropped). Accepting the new topic is refused
    with one line while the upsert's table holds the old rows; once it is deleted, the new
    topic is accepted and the upsert starts again from it: the newer values are there."""
    import shutil

    from jobs.derived.invariants import live_rows, recompute_latest, upsert_differences
    from tests.fixtures.derived import TRANSFORM, derived_outputs, user_events

    upsert = [o for o in derived_outputs(tmp_path / "derived") if o["kind"] == "upsert"]
    config = pipeline_factory(3, transform=TRANSFORM, derived=upsert)
    topic, bootstrap = config.kafka.topic, config.kafka.bootstrap_servers
    path = str(config_path(config))
    kafka_client.produce_records(topic, user_events(0, 300, 3, tombstone_every=0))
    assert run_until_caught_up(config, spark)
    (spec,) = config.derived
    upsert_version = DeltaTable(spec.table_uri).version()

    new_id = recreate_topic(bootstrap, topic, 3)
    newer = user_events(10_000, 60, 3, tombstone_every=0)
    kafka_client.produce_records(topic, newer)
    accept = ["skip", "new-topic", "-c", path, "--topic-id", new_id, "--reason", "re-created"]
    line = one_error_line(exactly(*accept))
    assert spec.name in line and "delete their tables" in line, line
    assert ledger_json(path, "--decisions") == []
    # --force is for re-reading a topic on purpose, not for this
    assert spec.name in one_error_line(exactly(*accept, "--force"))
    # still blocked on the topic change, nothing published anywhere
    assert new_id in one_error_line(exactly("run", "-c", path, "--until-caught-up"))
    assert DeltaTable(spec.table_uri).version() == upsert_version

    # the way forward: the upsert's table deleted, the new topic is accepted, and the upsert
    # starts again from it
    shutil.rmtree(spec.table_uri)
    accepted = exactly(*accept)
    assert accepted.returncode == 0, accepted.stderr
    # an output with no batch on a table with history waits for its rebuild; a full one
    # would mix both topics' offsets, so only an empty start is taken
    waiting = exactly("run", "-c", path)  # stages with Spark (its warnings), then refuses
    assert waiting.returncode == 2, waiting.stdout + waiting.stderr
    assert "exactly derived rebuild" in waiting.stderr.strip().splitlines()[-1]
    assert "incarnation" in one_error_line(exactly("derived", "rebuild", "-c", path, spec.name))
    started = exactly("derived", "rebuild", "--empty", "-c", path, spec.name)
    assert started.returncode == 0, started.stderr
    assert run_until_caught_up(config, spark)
    expected = {}  # each user's last record (a user is on one partition: Kafka's order)
    for _partition, user, value in newer:
        assert value is not None
        expected[user] = json.loads(value)["event_id"]
    rows_table = DeltaTable(spec.table_uri).to_pyarrow_table()
    rows = live_rows(rows_table).to_pylist()
    assert {r["user"]: r["event_id"] for r in rows} == expected
    # the known gap (docs/derived-tables.md): the recomputation over the raw table mixes both
    # topics under the same coordinates, so the derived check disagrees from now on
    raw = DeltaTable(config.delta.table_uri).to_pyarrow_table()
    assert upsert_differences(recompute_latest(raw, spec), rows_table, spec) != []
