"""A renamed pipeline, or a copy of a config that keeps the first one's table: a new
application id with no history in a table another one fills from the same topic. Started
anew it read the topic from `starting_offsets` again and committed every record a second
time (5,880 rows for 2,940 records, by hand, before the fix). Now refused before its first
batch, in one line naming the other pipeline (ledger/core/other_writers.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable, write_deltalake

from jobs.examples.sample_data import pageviews
from jobs.wiring.pipeline import build
from ledger.core.errors import InconsistencyError
from ledger.core.layout import OFFSET, PARTITION, TOPIC
from ledger.core.other_writers import (
    first_commit_refusal,
    new_topics_refusal,
    shared_topics_refusal,
    unattributed_rows_refusal,
)
from resources.delta.log import topics_in_rows
from tests.fixtures.paused import let_go, paused_at
from tests.fixtures.pipeline import assert_exactly_once, config_path, shared_spark_env

EXACTLY = [sys.executable, "-m", "exactly_cli"]
OTHERS = {"pageviews": {"pipeline": "pageviews", "batch_id": 7, "topics": {"pv", "clicks"}}}


def test_another_pipeline_on_a_topic_this_one_reads_is_named_with_the_ways_out() -> None:
    refusal = shared_topics_refusal("pageviews_v2", "/lake/pv", ["pv"], OTHERS)
    assert refusal is not None
    line = str(refusal)
    assert "pipeline pageviews (application id pageviews)" in line, line
    assert "up to 7" in line and "topic(s) pv," in line and "/lake/pv" in line, line
    assert "`pipeline: pageviews`" in line and "tables of its own" in line, line


def test_another_pipeline_on_other_topics_may_share_the_table() -> None:
    assert shared_topics_refusal("orders", "/lake/pv", ["orders"], OTHERS) is None
    assert shared_topics_refusal("orders", "/lake/pv", ["orders"], {}) is None


def test_a_first_commit_is_refused_by_the_topics_its_batch_read() -> None:
    meta = {"app_id": "pv2", "pipeline": "pv2", "batch_id": 3, "ranges": [{"topic": "pv"}]}
    refusal = first_commit_refusal(meta, "/lake/pv", OTHERS)
    assert refusal is not None
    line = str(refusal)
    assert line.startswith("pipeline pv2 holds no batch in /lake/pv"), line
    assert "pipeline pageviews (application id pageviews)" in line, line
    assert "batch pv2/3" in line and "not committed there" in line, line
    elsewhere = {**meta, "ranges": [{"topic": "orders"}]}
    assert first_commit_refusal(elsewhere, "/lake/pv", OTHERS) is None


def test_a_topic_new_to_a_pipeline_that_another_fills_the_table_from_is_refused() -> None:
    refusal = new_topics_refusal("orders", "/lake/pv", ["pv", "returns"], OTHERS)
    assert refusal is not None
    line = str(refusal)
    assert line.startswith("pipeline orders now reads topic(s) pv, which it never read"), line
    assert "pipeline pageviews (application id pageviews) committed batches up to 7" in line
    assert "Leave them to pageviews" in line and "tables of its own" in line, line
    assert new_topics_refusal("orders", "/lake/pv", ["returns"], OTHERS) is None


def _exactly(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **shared_spark_env()}
    return subprocess.run([*EXACTLY, *args], capture_output=True, text=True, timeout=600, env=env)


def test_a_renamed_pipeline_is_refused_before_it_commits_the_topic_again(
    kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    config = pipeline_factory(2)
    kafka_client.produce(config.kafka.topic, pageviews(200, malformed_every=40))
    first = _exactly("run", "-c", str(config_path(config)), "--until-caught-up")
    assert first.returncode == 0, first.stdout + first.stderr

    # the same config under a new name, its ledger kept (a rename) or new (a copy)
    doc = yaml.safe_load(config_path(config).read_text())
    for ledger in (doc["ledger"]["url"], f"sqlite:///{tmp_path / 'copy.db'}"):
        renamed = tmp_path / "renamed.yaml"
        renamed.write_text(
            yaml.safe_dump({**doc, "pipeline": "pageviews_v2", "ledger": {"url": ledger}})
        )
        again = _exactly("run", "-c", str(renamed), "--until-caught-up")
        lines = again.stderr.strip().splitlines()
        assert again.returncode == 2 and len(lines) == 1, again.stdout + again.stderr
        assert "pipeline pageviews (application id pageviews)" in lines[0], lines[0]
        assert "Traceback" not in again.stdout + again.stderr
        # nothing was committed twice
        assert assert_exactly_once(config, kafka_client) == (195, 5)

    # under its own name it carries on
    kafka_client.produce(config.kafka.topic, pageviews(40, start=200))
    carry_on = _exactly("run", "-c", str(config_path(config)), "--until-caught-up")
    assert carry_on.returncode == 0, carry_on.stdout + carry_on.stderr
    assert assert_exactly_once(config, kafka_client) == (235, 5)


def _copy_voted_before_the_first_commits(config: Any, tmp_path: Path) -> tuple[Path, Any]:
    """A copy of `config` under another name and ledger, run until it has voted its first
    batch, its outputs still empty; then `config`'s pipeline run to the end; then the copy
    let go: the copy's config, and its exit code and everything it printed."""
    doc = yaml.safe_load(config_path(config).read_text())
    copy = tmp_path / "copy.yaml"
    copy.write_text(
        yaml.safe_dump(
            {**doc, "pipeline": "pageviews_copy", "ledger": {"url": f"sqlite:///{tmp_path}/c.db"}}
        )
    )
    pauses = tmp_path / "pauses"
    argv = [*EXACTLY, "run", "-c", str(copy), "--until-caught-up"]
    held = paused_at(argv, pauses, "after_prepare")
    first = _exactly("run", "-c", str(config_path(config)), "--until-caught-up")
    assert first.returncode == 0, first.stdout + first.stderr
    return copy, let_go(held, pauses, "after_prepare")


def test_a_copy_started_before_the_first_commit_is_refused_at_its_own_commit(
    kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    """The start check reads the tables as they are when a pipeline starts: a copy of a
    config started while the first pipeline's first batch is still staging finds them
    empty, stages the same records, and committed them a second time (400 rows for 200
    records before the fix). The commit is where it is refused: in the very snapshot the
    commit goes onto (resources/delta/commit.py), so whichever of the two commits second
    reads the first one's batch."""
    config = pipeline_factory(2)
    kafka_client.produce(config.kafka.topic, pageviews(200, malformed_every=40))
    copy, (code, printed) = _copy_voted_before_the_first_commits(config, tmp_path)
    lines = [line for line in printed.splitlines() if "pause point" not in line]
    assert code == 2 and "Traceback" not in printed, printed
    refusal = [line for line in lines if "pipeline pageviews (application id pageviews)" in line]
    assert len(refusal) == 1 and "pageviews_copy" in refusal[0], printed
    assert assert_exactly_once(config, kafka_client) == (195, 5)

    # started again, the copy is refused before it stages anything; the first carries on
    again = _exactly("run", "-c", str(copy), "--until-caught-up")
    assert again.returncode == 2, again.stdout + again.stderr
    assert "pipeline pageviews (application id pageviews)" in again.stderr, again.stderr
    kafka_client.produce(config.kafka.topic, pageviews(40, start=200))
    carry_on = _exactly("run", "-c", str(config_path(config)), "--until-caught-up")
    assert carry_on.returncode == 0, carry_on.stdout + carry_on.stderr
    assert assert_exactly_once(config, kafka_client) == (235, 5)


def test_a_copy_sharing_a_postgres_output_is_refused_before_any_output_takes_its_batch(
    kafka_client: Any, pipeline_factory: Any, postgres_url: str, tmp_path: Path
) -> None:
    """The copy's refusal came at the first Delta output whose log holds the first
    pipeline's batches; a PostgreSQL output published before the data table has no log to
    ask, and took the copy's partial first (every view counted twice, before the fix). The
    data table is asked before any output is published (jobs/publish/delta_publisher.py)."""
    from resources.config.derived_spec import PostgresOutput
    from tests.fixtures.derived import postgres_output, postgres_rows

    dashboard = postgres_output(postgres_url, f"views_{uuid.uuid4().hex[:12]}")
    config = pipeline_factory(2, derived=[dashboard])
    kafka_client.produce(config.kafka.topic, pageviews(200))  # no quarantine to commit first
    _copy, (code, printed) = _copy_voted_before_the_first_commits(config, tmp_path)
    assert code == 2 and "pipeline pageviews (application id pageviews)" in printed, printed
    spec = next(d for d in config.derived if isinstance(d, PostgresOutput))
    assert sum(postgres_rows(spec).column("views").to_pylist()) == 200
    assert assert_exactly_once(config, kafka_client) == (200, 0)


def _rows_by_coordinate(*uris: str) -> Counter[tuple[str, int, int]]:
    """(topic, partition, offset) of every row of the tables at `uris`, counted."""
    found: Counter[tuple[str, int, int]] = Counter()
    for uri in uris:
        t = DeltaTable(uri).to_pyarrow_table(columns=[TOPIC, PARTITION, OFFSET]).to_pylist()
        found.update((r[TOPIC], r[PARTITION], r[OFFSET]) for r in t)
    return found


def test_a_topic_added_to_a_pipeline_that_shares_the_table_is_refused_if_another_fills_it(
    kafka_client: Any, pipeline_factory: Any, topic_factory: Any, tmp_path: Path
) -> None:
    """Pipelines of different topics may share a table. The start's check asked only while
    a pipeline held nothing, so a topic added later to one of them that the other already
    fills the table from was read from its first records and committed a second time
    (every one of its 100 records twice, before the fix)."""
    config = pipeline_factory(2)
    orders = topic_factory(2)
    kafka_client.produce(config.kafka.topic, pageviews(100, malformed_every=25))
    kafka_client.produce(orders, pageviews(60, malformed_every=30))
    first = _exactly("run", "-c", str(config_path(config)), "--until-caught-up")
    assert first.returncode == 0, first.stdout + first.stderr
    doc = yaml.safe_load(config_path(config).read_text())
    kafka = {k: v for k, v in doc["kafka"].items() if k != "topic"}
    sharing = {**doc, "pipeline": "orders", "ledger": {"url": f"sqlite:///{tmp_path}/o.db"}}
    other = tmp_path / "orders.yaml"
    other.write_text(yaml.safe_dump({**sharing, "kafka": {**kafka, "topics": [orders]}}))
    shared = _exactly("run", "-c", str(other), "--until-caught-up")
    assert shared.returncode == 0, shared.stdout + shared.stderr

    other.write_text(
        yaml.safe_dump({**sharing, "kafka": {**kafka, "topics": [orders, config.kafka.topic]}})
    )
    added = _exactly("run", "-c", str(other), "--until-caught-up")
    lines = added.stderr.strip().splitlines()
    assert added.returncode == 2 and len(lines) == 1, added.stdout + added.stderr
    assert f"pipeline orders now reads topic(s) {config.kafka.topic}," in lines[0], lines[0]
    assert "pipeline pageviews (application id pageviews)" in lines[0], lines[0]
    rows = _rows_by_coordinate(config.delta.table_uri, config.delta.quarantine_uri)
    assert len(rows) == 160 and set(rows.values()) == {1}, rows.most_common(3)


def _expire_the_log(uri: str) -> None:
    """What log retention does to a table after `delta.logRetentionDuration` (30 days by
    default): a checkpoint, then every commit JSON before it deleted, its commit info (the
    batch's pipeline and topics) with it. The app transactions stay, in the checkpoint."""
    DeltaTable(uri).alter.set_table_properties({"delta.logRetentionDuration": "interval 0 seconds"})
    table = DeltaTable(uri)
    table.create_checkpoint()
    table.cleanup_metadata()
    assert all(entry.get("exactly") is None for entry in DeltaTable(uri).history()), (
        "the batches' commit info is still in the log"
    )


def test_a_renamed_pipeline_is_refused_after_log_retention_dropped_the_others_commits(
    kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    """A pipeline stopped for longer than the log's retention, then renamed: no commit in
    either log says which pipeline or topic wrote the rows any more, and the new name read
    the topic again from its start (every record twice, before the fix). The rows say it:
    they carry their topic."""
    config = pipeline_factory(2)
    kafka_client.produce(config.kafka.topic, pageviews(120, malformed_every=30))
    first = _exactly("run", "-c", str(config_path(config)), "--until-caught-up")
    assert first.returncode == 0, first.stdout + first.stderr
    for uri in (config.delta.table_uri, config.delta.quarantine_uri):
        _expire_the_log(uri)

    doc = yaml.safe_load(config_path(config).read_text())
    renamed = tmp_path / "renamed.yaml"
    renamed.write_text(
        yaml.safe_dump(
            {**doc, "pipeline": "pageviews_v2", "ledger": {"url": f"sqlite:///{tmp_path}/n.db"}}
        )
    )
    again = _exactly("run", "-c", str(renamed), "--until-caught-up")
    lines = again.stderr.strip().splitlines()
    assert again.returncode == 2 and len(lines) == 1, again.stdout + again.stderr
    assert "rows of topic(s) it reads" in lines[0] and config.kafka.topic in lines[0], lines[0]
    assert "Traceback" not in again.stdout + again.stderr
    assert assert_exactly_once(config, kafka_client) == (116, 4)


def test_the_rows_name_their_topics_whatever_the_statistics_say(tmp_path: Path) -> None:
    """`topics_in_rows` on real delta-rs tables: a file whose statistics name one other
    topic whole is skipped, a file of several topics and a topic name too long for the
    statistics are read, and a table partitioned by topic is answered from its log."""
    long_topic = "t" * 40  # past the 32 characters string statistics may keep
    plain = str(tmp_path / "plain")
    for topics in (["other"], ["a", "other"], [long_topic]):
        write_deltalake(
            plain, pa.table({TOPIC: topics, "x": list(range(len(topics)))}), mode="append"
        )
    table = DeltaTable(plain)
    assert topics_in_rows(table, plain, ["a", "b"]) == {"a"}
    assert topics_in_rows(table, plain, [long_topic, "other"]) == {long_topic, "other"}
    assert topics_in_rows(table, plain, ["b"]) == set()

    by_topic = str(tmp_path / "by_topic")
    write_deltalake(
        by_topic, pa.table({TOPIC: ["a", "c"], "x": [1, 2]}), partition_by=[TOPIC], mode="append"
    )
    assert topics_in_rows(DeltaTable(by_topic), by_topic, ["c", "d"]) == {"c"}


def test_rows_of_a_topic_read_that_no_commit_names_are_refused_with_the_tables() -> None:
    assert unattributed_rows_refusal("pv2", {}) is None
    refusal = unattributed_rows_refusal("pv2", {"/lake/q": {"pv"}, "/lake/t": {"pv", "x"}})
    assert refusal is not None
    line = str(refusal)
    assert "pipeline pv2 holds no batch" in line and "/lake/q: pv; /lake/t: pv, x" in line, line
    assert "a second time" in line and "tables of its own" in line, line


def test_a_second_ledger_for_the_same_pipeline_and_table_is_refused_at_its_commit(
    spark: Any,
    kafka_client: Any,
    pipeline_factory: Any,
    topic_factory: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same pipeline (one application id) run from two ledgers into one table: a SQLite
    ledger at a relative path on two hosts, a laptop's run beside the scheduled one. Each
    ledger planned its own ranges under the same batch ids; the second's batch 2 found the
    table's transaction at 2 and was recorded committed with nothing published: 20 records
    lost and 10 committed twice (by hand; this test's batch was ACKED before the fix).
    Here the second ledger's batch passes the check before its commit, and the first
    commits the same id just before the second's publish (the race): the publish finds the
    id held with other ranges and is refused; started again, the check before the commit
    refuses it."""
    topic = topic_factory(1)

    def config(name: str, max_records: int) -> Any:
        url = f"sqlite:///{tmp_path / name}.db"
        return pipeline_factory(1, max_records=max_records, topic=topic, ledger_url=url)

    first, second = config("first", 30), config("second", 50)
    kafka_client.produce(topic, pageviews(100), partition=0)
    one = build(first, spark_factory=lambda: spark)
    one.recover_and_commit()
    assert one.run_batch() is not None  # [0, 30)
    other = build(second, spark_factory=lambda: spark)
    other.recover_and_commit()  # takes batch 1 from the table's log
    publish = other.publisher.publish

    def first_commits_the_same_id_first(batch: Any, files: Any) -> Any:
        assert one.run_batch() is not None  # the first ledger's batch 2: [30, 60)
        return publish(batch, files)

    monkeypatch.setattr(other.publisher, "publish", first_commits_the_same_id_first)
    with pytest.raises(InconsistencyError) as refused:
        other.run_batch()  # the second ledger's batch 2: [30, 80)
    assert (
        f"holds this batch id already, committed with other ranges ({topic}-0[30,60) there, "
        f"{topic}-0[30,80) here): another ledger runs this pipeline into the same table"
    ) in str(refused.value), refused.value
    monkeypatch.undo()
    # the first ledger goes on alone: every record once
    while one.run_batch() is not None:
        pass
    assert sum(assert_exactly_once(first, kafka_client)) == 100
    # started again, the second is refused before its voted batch touches any output
    with pytest.raises(InconsistencyError, match="another ledger runs this pipeline"):
        build(second, spark_factory=lambda: spark).recover_and_commit()
    assert sum(assert_exactly_once(first, kafka_client)) == 100
