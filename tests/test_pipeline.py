"""The exactly-once pipeline against the real broker, Spark and Delta (in-process runs).

Crash tests, which kill real child processes, are in test_crash.py.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable

from jobs.examples.sample_data import MALFORMED, pageviews
from jobs.wiring.pipeline import Pipeline, build
from ledger.core.errors import DataLossError, FencedError
from ledger.core.protocol import BatchState
from ledger.store.ledger_store import LedgerStore
from tests.fixtures.pipeline import (
    assert_exactly_once,
    config_path,
    coordinates,
    run_until_caught_up,
)

EXACTLY = [sys.executable, "-m", "exactly_cli"]


@pytest.mark.parametrize(
    "ledger_url",
    # the PostgreSQL ledger's own cases are test_store*.py's and test_service_restarts.py's
    ["sqlite", pytest.param("postgresql", marks=pytest.mark.wide)],
    indirect=True,
)
def test_end_to_end_while_a_producer_keeps_writing(
    spark: Any, kafka_client: Any, pipeline_factory: Any, ledger_url: str
) -> None:
    config = pipeline_factory(3, max_records=250, ledger_url=ledger_url)
    topic = config.kafka.topic
    stop = threading.Event()

    def produce() -> None:
        for start in range(0, 3000, 150):
            if stop.is_set():
                return
            kafka_client.produce(topic, pageviews(150, start=start, malformed_every=97))
            time.sleep(0.3)

    producer = threading.Thread(target=produce)
    producer.start()
    tpc = build(config, spark_factory=lambda: spark)
    tpc.recover_and_commit()
    reports = []
    try:
        for _ in range(4):
            report = tpc.run_batch()
            if report is not None:
                reports.append(report)
            time.sleep(0.5)
    finally:
        producer.join()
    reports += run_until_caught_up(tpc)

    assert len(reports) >= 3
    table_rows, quarantined = assert_exactly_once(config, kafka_client)
    assert table_rows + quarantined == 3000
    assert quarantined == len([i for i in range(3000) if i % 97 == 96])
    store = LedgerStore(config.ledger.url)
    batches = sorted(store.batches(app_id=config.app_id), key=lambda b: b.batch_id)
    assert [b.state for b in batches] == [BatchState.ACKED] * len(batches)
    for before, after in itertools.pairwise(batches):
        assert {r.partition: r.end for r in before.ranges} == {
            r.partition: r.start for r in after.ranges
        }
    ends = {p: o.last_stable for p, o in kafka_client.offsets(topic).items()}
    assert kafka_client.group_offsets(config.group_id, topic) == ends


def test_table_reads_the_same_through_delta_rs_and_delta_spark(
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    config = pipeline_factory(2, max_records=300)
    kafka_client.produce(config.kafka.topic, pageviews(900))
    run_until_caught_up(build(config, spark_factory=lambda: spark))
    cols = ["_kafka_partition", "_kafka_offset", "event_id", "app", "user", "url", "ts"]
    via_rs = sorted(
        tuple(row[c] for c in cols)
        for row in DeltaTable(config.delta.table_uri).to_pyarrow_table(columns=cols).to_pylist()
    )
    # Spark hands back naive datetimes in the session time zone, which is UTC
    via_spark = sorted(
        (*(row[c] for c in cols[:-1]), row["ts"].replace(tzinfo=UTC))
        for row in spark.read.format("delta").load(config.delta.table_uri).select(*cols).collect()
    )
    assert len(via_rs) == 900
    assert via_rs == via_spark
    # DESCRIBE HISTORY shows each batch's commit with its batch id and ranges
    history = spark.sql(f"DESCRIBE HISTORY delta.`{config.delta.table_uri}`").collect()
    shown = sorted(h["userMetadata"] for h in history if h["userMetadata"])
    store = LedgerStore(config.ledger.url)
    try:
        batches = store.batches(app_id=config.app_id)
    finally:
        store.dispose()
    expected = sorted(
        f"exactly pageviews/{b.batch_id} live: "
        + " ".join(f"{r.topic}-{r.partition}[{r.start},{r.end})" for r in b.ranges)
        for b in batches
    )
    assert len(expected) >= 2 and shown == expected


def test_malformed_records_land_in_quarantine_with_their_coordinates(
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    config = pipeline_factory(1)
    values = [*pageviews(5), MALFORMED[0], b'{"event_id": "e", "user": "u"}', b"[1, 2]", b"{bad"]
    kafka_client.produce(config.kafka.topic, values, partition=0)
    run_until_caught_up(build(config, spark_factory=lambda: spark))

    quarantine = DeltaTable(config.delta.quarantine_uri).to_pyarrow_table().to_pylist()
    got = sorted((q["_kafka_offset"], q["_raw_value"], q["_error"]) for q in quarantine)
    assert got == [
        (5, MALFORMED[0], "value is not a JSON object"),
        (6, b'{"event_id": "e", "user": "u"}', "missing field: app"),
        (7, b"[1, 2]", "value is not a JSON object"),
        (8, b"{bad", "value is not valid JSON"),
    ]
    assert {q["_kafka_topic"] for q in quarantine} == {config.kafka.topic}
    assert {q["_batch_id"] for q in quarantine} == {1}
    table, quarantined = assert_exactly_once(config, kafka_client)
    assert (table, quarantined) == (5, 4)
    # the quarantine's commit names its batch and ranges in DESCRIBE HISTORY too
    history = spark.sql(f"DESCRIBE HISTORY delta.`{config.delta.quarantine_uri}`").collect()
    assert [h["userMetadata"] for h in history if h["userMetadata"]] == [
        f"exactly pageviews/1 live: {config.kafka.topic}-0[0,9)"
    ]


def test_redriving_a_committed_batch_publishes_nothing(
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    config = pipeline_factory(2)
    kafka_client.produce(config.kafka.topic, pageviews(200))
    tpc = build(config, spark_factory=lambda: spark)
    (report,) = run_until_caught_up(tpc)
    version = DeltaTable(config.delta.table_uri).version()
    files = tpc.store.files(config.app_id, report.batch.batch_id)
    again = tpc.publisher.publish(report.batch, files)
    assert again.published is False
    assert DeltaTable(config.delta.table_uri).version() == version
    assert sum(coordinates(config.delta.table_uri).values()) == 200


def test_a_stale_attempt_can_neither_prepare_nor_commit(
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    config = pipeline_factory(2)
    kafka_client.produce(config.kafka.topic, pageviews(300))
    zombie = build(config, spark_factory=lambda: spark)
    staged, output = zombie.invoke(zombie.begin())

    rescuer = build(config, spark_factory=lambda: spark)
    (aborted,) = rescuer.recover_and_commit()
    assert aborted.state is BatchState.ABORTED
    with pytest.raises(FencedError, match="ABORTED"):
        zombie.pre_commit(staged, output)

    # past the vote: a takeover fences the old attempt's commit
    planned = zombie.begin()
    staged2, output2 = zombie.invoke(planned)
    prepared = zombie.pre_commit(staged2, output2)
    taken = rescuer.store.takeover(prepared)
    assert not DeltaTable.is_deltatable(config.delta.table_uri)
    with pytest.raises(FencedError, match="attempt 2"):
        zombie.commit(prepared)
    assert not DeltaTable.is_deltatable(config.delta.table_uri)
    rescuer.ack(rescuer.commit(taken))

    assert_exactly_once(config, kafka_client)
    published = DeltaTable(config.delta.table_uri).file_uris()
    aborted_folder = f"batch-{aborted.batch_id:012d}-attempt-1"
    assert not [u for u in published if aborted_folder in u]


def test_two_runs_started_at_once_never_duplicate(kafka_client: Any, pipeline_factory: Any) -> None:
    config = pipeline_factory(3, max_records=400)
    kafka_client.produce(config.kafka.topic, pageviews(3000, malformed_every=50))
    cmd = [*EXACTLY, "run", "-c", str(config_path(config)), "--until-caught-up"]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    # the product's own lines (Spark's warnings left out), whole, so a failure says why
    said = ["\n".join(x for x in out.splitlines() if "WARN" not in x) for out in outputs]
    assert [p.returncode for p in procs] == [0, 0], "\n----\n".join(said)
    table, quarantined = assert_exactly_once(config, kafka_client)
    assert table + quarantined == 3000
    committed = [
        b
        for b in LedgerStore(config.ledger.url).batches(app_id=config.app_id)
        if b.state is BatchState.ACKED
    ]
    assert sum(b.metrics["records_read"] for b in committed if "records_read" in b.metrics) == 3000


def test_a_deleted_ledger_is_rebuilt_from_the_delta_log(
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    config = pipeline_factory(3, max_records=200)
    kafka_client.produce(config.kafka.topic, pageviews(1500, malformed_every=40))
    first = run_until_caught_up(build(config, spark_factory=lambda: spark))
    ledger_file = Path(config.ledger.url.removeprefix("sqlite:///"))
    for suffix in ("", "-wal", "-shm"):
        Path(f"{ledger_file}{suffix}").unlink(missing_ok=True)

    kafka_client.produce(config.kafka.topic, pageviews(600, start=1500))
    tpc = build(config, spark_factory=lambda: spark)
    assert tpc.rebuild_from_log() == len(first)
    more = run_until_caught_up(tpc)
    assert more and more[0].batch.batch_id == len(first) + 1
    table, quarantined = assert_exactly_once(config, kafka_client)
    assert table + quarantined == 2100


def test_offsets_deleted_from_kafka_fail_loudly_and_commit_nothing(
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    config = pipeline_factory(2, max_records=50)
    kafka_client.produce_to_partitions(
        config.kafka.topic, {p: list(pageviews(200, start=200 * p)) for p in (0, 1)}
    )
    tpc = build(config, spark_factory=lambda: spark)
    tpc.run_batch()
    version = DeltaTable(config.delta.table_uri).version()
    admin = AdminClient({"bootstrap.servers": config.kafka.bootstrap_servers})
    futures = admin.delete_records([TopicPartition(config.kafka.topic, 0, 120)])
    for future in futures.values():
        future.result(timeout=30)
    with pytest.raises(DataLossError, match=rf"{config.kafka.topic}-0: offsets \[50, 120\)"):
        tpc.run_batch()
    assert DeltaTable(config.delta.table_uri).version() == version
    result = subprocess.run(
        [*EXACTLY, "run", "-c", str(config_path(config))],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "offsets [50, 120) are no longer in Kafka" in lines[0], lines
    assert DeltaTable(config.delta.table_uri).version() == version


def test_an_unreachable_postgres_output_stops_the_start_in_one_line(
    kafka_client: Any, pipeline_factory: Any
) -> None:
    """A PostgreSQL output whose server does not answer fails `exactly run` before anything
    is planned: one line naming the output, exit code 2 (a refused password says so the
    same way: tests/test_derived_postgres.py)."""
    from resources.jvm.process import free_port
    from tests.fixtures.derived import postgres_output

    url = f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere"
    config = pipeline_factory(1, derived=[postgres_output(url, "views")])
    kafka_client.produce(config.kafka.topic, pageviews(10))
    result = subprocess.run(
        [*EXACTLY, "run", "-c", str(config_path(config)), "--until-caught-up"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "postgres output views_dashboard (views at postgresql" in lines[0], lines
    assert LedgerStore(config.ledger.url).batches(app_id=config.app_id) == []


def test_each_output_s_files_hold_its_own_columns_and_statistics(
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    """The stage writes both outputs in one routed write (jobs/stage/staging.py): the quarantine's
    files must end up in the quarantine's folder with its columns only, nothing may stay
    behind in the table's folder, and no reader or statistic may see the columns the
    table's files carry for the route (`_error`, `_raw_value`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ledger.core.layout import ROUTE

    config = pipeline_factory(2, max_records=500)
    kafka_client.produce(config.kafka.topic, pageviews(400, malformed_every=9))
    assert run_until_caught_up(build(config, spark_factory=lambda: spark))
    table_rows, quarantined = assert_exactly_once(config, kafka_client)
    assert quarantined > 0 and table_rows + quarantined == 400

    table, quarantine = DeltaTable(config.delta.table_uri), DeltaTable(config.delta.quarantine_uri)
    assert "_raw_value" not in table.schema().to_arrow().names
    assert "_error" not in table.schema().to_arrow().names
    quarantine_columns = set(quarantine.schema().to_arrow().names)
    for add in pa.table(quarantine.get_add_actions(flatten=True)).to_pylist():
        path = Path(config.delta.quarantine_uri, add["path"])
        assert set(pq.read_schema(path).names) == quarantine_columns, path
        assert ROUTE not in add["path"]
    adds = [
        json.loads(line)["add"]
        for entry in sorted(Path(config.delta.table_uri, "_delta_log").glob("*.json"))
        for line in entry.read_text().splitlines()
        if '"add"' in line
    ]
    assert adds
    for add in adds:
        assert f"{ROUTE}=table/" in add["path"]
        stats = json.loads(add["stats"])
        assert set(stats["nullCount"]) <= set(table.schema().to_arrow().names), stats
        assert "app" in stats["nullCount"]
    left = [p for p in Path(config.delta.table_uri).rglob(f"{ROUTE}=quarantine/*") if p.is_file()]
    assert left == []
    # delta-spark reads the table's columns, not the files'
    columns = spark.read.format("delta").load(config.delta.table_uri).columns
    assert columns == table.schema().to_arrow().names
    assert spark.read.format("delta").load(config.delta.table_uri).count() == table_rows


def test_a_transform_may_not_return_the_columns_the_stage_adds(spark: Any) -> None:
    from jobs.stage.routing import check_output
    from ledger.core.errors import ConfigError

    frame = spark.createDataFrame(
        [("t", 0, 0, None, 1, b"v", None, b"x")],
        "_kafka_topic string, _kafka_partition int, _kafka_offset long, "
        "_kafka_timestamp timestamp, _batch_id long, value binary, _error string, "
        "_raw_value binary",
    )
    with pytest.raises(ConfigError, match=r"returned column\(s\) \['_raw_value'\]"):
        check_output(frame, "t")


# -- derived outputs (docs/derived-tables.md) -------------------------------------------------


def test_derived_outputs_equal_their_recomputation_batch_after_batch(
    spark: Any, kafka_client: Any, pipeline_factory: Any, postgres_url: str, tmp_path: Path
) -> None:
    """An aggregate per app, one per app and minute, the latest record per user, and an
    aggregate per app in PostgreSQL, kept in the same two-phase commit as the raw table over
    several batches, with tombstones, keys updated in batch after batch in no order, and
    quarantined records: after every run each output equals its recomputation over the raw
    table, and each batch records what each output's commit did. A committed batch published
    again (a re-drive) changes no output."""
    from jobs.publish.delta_publisher import DERIVED_METRICS
    from resources.config.derived_spec import DELETED, PostgresOutput
    from tests.fixtures.derived import (
        TRANSFORM,
        assert_derived_match,
        derived_outputs,
        postgres_output,
        postgres_rows,
        user_events,
    )

    dashboard = postgres_output(postgres_url, f"views_{uuid.uuid4().hex[:12]}")
    config = pipeline_factory(
        3,
        max_records=40,
        transform=TRANSFORM,
        derived=[*derived_outputs(tmp_path / "derived"), dashboard],
    )
    topic = config.kafka.topic
    kafka_client.produce_records(topic, user_events(0, 240, 3, malformed_every=25))
    first = run_until_caught_up(build(config, spark_factory=lambda: spark))
    assert len(first) >= 2
    assert_derived_match(config)
    kafka_client.produce_records(topic, user_events(240, 150, 3, malformed_every=25))
    second = run_until_caught_up(build(config, spark_factory=lambda: spark))
    assert len(second) >= 2

    table, quarantined = assert_exactly_once(config, kafka_client)
    assert (table + quarantined, quarantined > 0) == (390, True)
    sizes = assert_derived_match(config)
    raw = DeltaTable(config.delta.table_uri).to_pyarrow_table()
    tombstones = sum(raw[DELETED].to_pylist())
    assert tombstones == 390 // 9
    # the tombstones deleted users, and users live again after one
    assert 0 < sizes["latest_per_user"] < 15
    for report in (*first, *second):
        outcomes = report.batch.metrics[DERIVED_METRICS]
        assert list(outcomes) == [
            "views_per_app",
            "views_per_minute",
            "latest_per_user",
            "views_dashboard",
        ]
        assert all(o["applied"] for o in outcomes.values()), outcomes
    assert outcomes["views_dashboard"]["held_batch_id"] == report.batch.batch_id

    # a re-drive of a committed batch (all its outputs hold it) applies nothing again
    pg = next(s for s in config.derived if isinstance(s, PostgresOutput))
    before = postgres_rows(pg).sort_by("app")
    tpc = build(config, spark_factory=lambda: spark)
    last = report.batch
    again = tpc.publisher.publish(last, tpc.store.files(last.app_id, last.batch_id))
    assert not any(o["applied"] for o in again.metrics[DERIVED_METRICS].values())
    assert postgres_rows(pg).sort_by("app") == before
    assert_derived_match(config)

    # every derived commit carries the batch's commit info (invariant 7)
    for spec in config.derived:
        if isinstance(spec, PostgresOutput):
            continue
        infos = DeltaTable(spec.table_uri).history()
        batch_ids = sorted(
            json.loads(i["exactly"])["batch_id"]
            if isinstance(i["exactly"], str)
            else i["exactly"]["batch_id"]
            for i in infos
            if "exactly" in i
        )
        assert batch_ids == [r.batch.batch_id for r in (*first, *second)], spec.name

    # the output's state row lost behind the pipeline's back: the next batch is refused
    # before its vote, loudly, never skipped; nothing is applied or held (the state row
    # lost after a vote is the compare-and-set's refusal at the commit, test_derived_postgres)
    import sqlalchemy as sa

    from ledger.core.errors import RefusedBatchError
    from resources.postgres.tables import STATE_TABLE

    engine = sa.create_engine(postgres_url)
    with engine.begin() as conn:
        conn.execute(sa.text(f'DELETE FROM "{STATE_TABLE}" WHERE output = :t'), {"t": pg.table})
    engine.dispose()
    kafka_client.produce_records(topic, user_events(390, 30, 3))
    tpc = build(config, spark_factory=lambda: spark)
    with pytest.raises(RefusedBatchError, match=r"views_dashboard .* holds no batch of"):
        tpc.run_batch()
    (refused,) = tpc.store.batches(app_id=config.app_id, limit=1)
    assert refused.state is BatchState.ABORTED
    assert postgres_rows(pg).sort_by("app") == before


def test_a_fill_updates_derived_outputs_like_a_live_batch(
    spark: Any, kafka_client: Any, pipeline_factory: Any, postgres_url: str, tmp_path: Path
) -> None:
    """A fill of offsets older than the live start is a batch like a live one, under the
    backfills' own app id in each output: aggregates add it, the upsert keeps the newer
    records the live batches wrote (its tombstones are older than them). Fill records
    tombstoned again after the live start are the open fill-after-tombstone case
    (docs/derived-tables.md) and are not produced here."""
    from jobs.wiring.pipeline import build_backfill
    from ledger.coordinator.backfill import plan_backfill
    from ledger.core.backfill import BackfillMode
    from ledger.core.protocol import OffsetRange
    from resources.config.derived_spec import PostgresOutput
    from tests.fixtures.derived import (
        TRANSFORM,
        assert_derived_match,
        derived_outputs,
        postgres_held,
        postgres_output,
        user_events,
    )

    dashboard = postgres_output(postgres_url, f"views_{uuid.uuid4().hex[:12]}")
    config = pipeline_factory(
        1,
        starting_offsets="latest",
        transform=TRANSFORM,
        derived=[*derived_outputs(tmp_path / "derived"), dashboard],
    )
    topic = config.kafka.topic
    kafka_client.produce_records(topic, user_events(0, 120, 1, tombstone_every=5))
    run_until_caught_up(build(config, spark_factory=lambda: spark))  # pins offset 120
    kafka_client.produce_records(topic, user_events(120, 90, 1, tombstone_every=0))
    assert len(run_until_caught_up(build(config, spark_factory=lambda: spark))) == 1
    assert_derived_match(config)

    fills = build_backfill(config, transform=TRANSFORM, spark_factory=lambda: spark)
    batch, planned = plan_backfill(
        fills,
        live_app_id=config.app_id,
        mode=BackfillMode.FILL,
        ranges=[OffsetRange(topic, 0, 0, 120)],
        transform=TRANSFORM,
        replace_refusals=config.replace_refusals(),
    )
    assert planned
    assert fills.finish(batch).batch.state is BatchState.ACKED
    assert assert_exactly_once(config, kafka_client) == (210, 0)
    assert_derived_match(config)
    for spec in config.derived:
        if isinstance(spec, PostgresOutput):
            # its own state row for the backfills' app id, beside the live one's
            assert postgres_held(spec, f"{config.pipeline}.backfill") == batch.batch_id
            continue
        held = DeltaTable(spec.table_uri).transaction_version(f"{config.pipeline}.backfill")
        assert held is None  # each output records the fill under its own app id ...
        assert (
            DeltaTable(spec.table_uri).transaction_version(
                spec.app_id(f"{config.pipeline}.backfill")
            )
            == batch.batch_id
        )  # ... derived from the backfills'


def test_an_output_added_to_a_pipeline_with_history_waits_for_its_rebuild(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    """A derived output added to a pipeline that already committed batches would start
    empty and stay short of its recomputation for ever (a MERGE into a missing table
    creates it). The first batch after is refused before the vote, naming the command;
    `exactly derived rebuild` builds each output from the raw table in one commit; the
    pipeline then goes on, and every output equals its recomputation. A rebuild over an
    output that holds batches is refused (exit 2), as is the same output's table deleted
    under a running pipeline."""
    import shutil

    from ledger.core.errors import RefusedBatchError
    from resources.config.loading import load_config
    from tests.fixtures.derived import (
        TRANSFORM,
        assert_derived_match,
        derived_outputs,
        user_events,
    )
    from tests.fixtures.pipeline import save_config

    plain = pipeline_factory(2, max_records=60, transform=TRANSFORM)
    topic = plain.kafka.topic
    kafka_client.produce_records(topic, user_events(0, 150, 2, tombstone_every=0))
    assert len(run_until_caught_up(build(plain, spark_factory=lambda: spark))) >= 2

    doc = plain.model_dump(mode="json")
    doc["derived"] = derived_outputs(tmp_path / "derived")
    path = save_config(plain, tmp_path / "with-derived.yaml")
    path.write_text(json.dumps(doc))
    config = load_config(path)
    kafka_client.produce_records(topic, user_events(150, 90, 2, tombstone_every=7))
    with pytest.raises(RefusedBatchError, match="exactly derived rebuild"):
        run_until_caught_up(build(config, spark_factory=lambda: spark))
    assert not any(DeltaTable.is_deltatable(spec.table_uri) for spec in config.derived)

    def rebuild(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*EXACTLY, "derived", "rebuild", "-c", str(path), name],
            capture_output=True,
            text=True,
            timeout=300,
        )

    for spec in config.derived:
        done = rebuild(spec.name)
        assert done.returncode == 0, done.stderr
        assert f"rebuilt derived output {spec.name}" in done.stdout
    assert_derived_match(config)
    again = rebuild("views_per_app")
    assert again.returncode == 2
    assert "already holds batches" in again.stderr and len(again.stderr.splitlines()) == 1
    unknown = rebuild("no_such_output")
    assert (unknown.returncode, "no_such_output" in unknown.stderr) == (2, True)

    assert len(run_until_caught_up(build(config, spark_factory=lambda: spark))) >= 1
    assert assert_exactly_once(config, kafka_client)[0] == 240
    assert_derived_match(config)

    # an output's table deleted under the pipeline: refused again, rebuilt, right again
    shutil.rmtree(config.derived[0].table_uri)
    kafka_client.produce_records(topic, user_events(240, 60, 2, tombstone_every=7))
    with pytest.raises(RefusedBatchError, match=config.derived[0].name):
        run_until_caught_up(build(config, spark_factory=lambda: spark))
    assert rebuild(config.derived[0].name).returncode == 0
    run_until_caught_up(build(config, spark_factory=lambda: spark))
    assert assert_exactly_once(config, kafka_client)[0] == 300
    assert_derived_match(config)


def with_derived(config: Any, outputs: list[dict[str, Any]], path: Path) -> Any:
    """`config` with `outputs` as its derived outputs, saved at `path` and loaded back."""
    from resources.config.loading import load_config
    from tests.fixtures.pipeline import save_config

    doc = config.model_dump(mode="json")
    doc["derived"] = outputs
    save_config(config, path)
    path.write_text(json.dumps(doc))
    return load_config(path)


def test_an_output_taken_out_of_the_config_and_put_back_is_refused_until_rebuilt(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    """An output out of the config misses the batches committed meanwhile; put back, it
    held batches, so the check for an output with no batch let it merge on, every count
    short for ever by what it missed. Refused before the vote while it holds fewer batches
    than the raw table, naming both and the way out; deleted and rebuilt, it is right."""
    import shutil

    from ledger.core.errors import RefusedBatchError
    from tests.fixtures.derived import TRANSFORM, assert_derived_match, derived_outputs, user_events

    (per_app,) = [o for o in derived_outputs(tmp_path / "derived") if o["name"] == "views_per_app"]
    plain = pipeline_factory(2, max_records=60, transform=TRANSFORM)
    topic = plain.kafka.topic
    config = with_derived(plain, [per_app], tmp_path / "with-output.yaml")
    kafka_client.produce_records(topic, user_events(0, 100, 2, tombstone_every=0))
    run_until_caught_up(build(config, spark_factory=lambda: spark))
    assert_derived_match(config)
    held = DeltaTable(per_app["table_uri"]).version()

    kafka_client.produce_records(topic, user_events(100, 60, 2, tombstone_every=0))
    assert len(run_until_caught_up(build(plain, spark_factory=lambda: spark))) >= 1
    kafka_client.produce_records(topic, user_events(160, 40, 2, tombstone_every=0))
    with pytest.raises(RefusedBatchError, match=r"views_per_app .* holds batches of") as e:
        run_until_caught_up(build(config, spark_factory=lambda: spark))
    assert "exactly derived rebuild" in str(e.value) and "\n" not in str(e.value)
    assert DeltaTable(per_app["table_uri"]).version() == held  # nothing merged
    store = LedgerStore(config.ledger.url)
    assert not store.batches(app_id=config.app_id, states=[BatchState.PREPARED])

    shutil.rmtree(per_app["table_uri"])
    Pipeline(config, spark_factory=lambda: spark).rebuild_derived("views_per_app")
    run_until_caught_up(build(config, spark_factory=lambda: spark))
    assert assert_exactly_once(config, kafka_client)[0] == 200
    assert_derived_match(config)


def test_a_postgres_output_added_to_a_pipeline_with_history_is_refused_then_rebuilt(
    spark: Any, kafka_client: Any, pipeline_factory: Any, postgres_url: str, tmp_path: Path
) -> None:
    """A PostgreSQL output added to a pipeline with history was refused only at the commit,
    by its compare-and-set ("out of order"), the batch then held voted behind a refusal
    that named no way out. Refused before the vote, like a Delta output's, naming the
    rebuild; rebuilt from the raw table (rows and state rows in one transaction, typed as
    the stage's partials so the next batch's schema check passes), the next batches apply
    on top and the output equals its recomputation. A second rebuild is refused, and so is
    one into a table that holds rows another writer put there."""
    import sqlalchemy as sa

    from ledger.core.errors import DecisionError, RefusedBatchError
    from resources.config.derived_spec import PostgresOutput
    from resources.postgres.state import held_batch
    from tests.fixtures.derived import TRANSFORM, assert_derived_match, postgres_output, user_events

    plain = pipeline_factory(2, max_records=60, transform=TRANSFORM)
    topic = plain.kafka.topic
    kafka_client.produce_records(topic, user_events(0, 100, 2, tombstone_every=0))
    run_until_caught_up(build(plain, spark_factory=lambda: spark))
    dashboard = postgres_output(postgres_url, f"views_{uuid.uuid4().hex[:12]}")
    # a window too: its timestamps, like the count and the min, must be typed as a partial's
    dashboard["window"] = {"column": "ts", "size": "1 minute"}
    config = with_derived(plain, [dashboard], tmp_path / "with-postgres.yaml")
    kafka_client.produce_records(topic, user_events(100, 50, 2, tombstone_every=0))

    with pytest.raises(RefusedBatchError, match=r"views_dashboard .* holds no batch of") as e:
        run_until_caught_up(build(config, spark_factory=lambda: spark))
    assert "\n" not in str(e.value) and "exactly derived rebuild" in str(e.value)
    store = LedgerStore(config.ledger.url)
    assert not store.batches(app_id=config.app_id, states=[BatchState.PREPARED])
    spec = next(d for d in config.derived if isinstance(d, PostgresOutput))
    pipeline = Pipeline(config, spark_factory=lambda: spark)
    engine = pipeline.publisher.postgres[f"derived:{spec.name}"].engine
    assert held_batch(engine, spec, spec.app_id(config.app_id)) is None

    done = pipeline.rebuild_derived(spec.name, who="tester", reason="added later")
    raw_holds = pipeline.publisher.table.transaction_version(config.app_id)
    assert done.holds == {config.app_id: raw_holds} and done.rows > 0
    assert held_batch(engine, spec, spec.app_id(config.app_id)) == raw_holds
    assert_derived_match(config)  # equal to its recomputation before any batch merged
    with pytest.raises(DecisionError, match=r"already holds batches"):
        pipeline.rebuild_derived(spec.name, who="tester", reason="twice")

    # its state rows lost (a copy restored without them): the rows are never added to
    with engine.begin() as conn:
        conn.execute(
            sa.text("DELETE FROM exactly_output_state WHERE output = :o"), {"o": spec.table}
        )
    with pytest.raises(DecisionError, match=r"holds rows but no batch"):
        pipeline.rebuild_derived(spec.name, who="tester", reason="state lost")
    with engine.begin() as conn:
        conn.execute(sa.text(f'DELETE FROM "{spec.table}"'))
    again = pipeline.rebuild_derived(spec.name, who="tester", reason="emptied")
    assert (again.holds, again.rows) == (done.holds, done.rows)

    run_until_caught_up(build(config, spark_factory=lambda: spark))
    assert assert_exactly_once(config, kafka_client)[0] == 150
    assert held_batch(engine, spec, spec.app_id(config.app_id)) > raw_holds
    assert_derived_match(config)


def test_partitions_added_to_a_topic_read_from_latest_lose_no_record(
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    """`starting_offsets: latest` skips what the topic held when the pipeline started, and
    nothing else: partitions added to the topic while one process keeps the pipeline (as
    `run --continuous` does) are read from their first record, not from wherever their end
    was when a plan first saw them. Real broker, real Spark, the partitions added by Kafka's
    own admin API between batches."""
    from confluent_kafka.admin import NewPartitions

    from tests.fixtures.pipeline import produced_coordinates

    config = pipeline_factory(2, starting_offsets="latest")
    topic = config.kafka.topic
    kafka_client.produce_to_partitions(topic, {0: pageviews(10)})  # before the start
    tpc = build(config, spark_factory=lambda: spark)
    run_until_caught_up(tpc)  # pins the start: partition 0 at 10, 1 at 0
    kafka_client.produce(topic, pageviews(20, start=10))

    admin = AdminClient({"bootstrap.servers": config.kafka.bootstrap_servers})
    admin.create_partitions([NewPartitions(topic, 4)])[topic].result(timeout=60)
    deadline = time.monotonic() + 60
    while len(kafka_client.offsets(topic)) < 4:  # the broker's metadata reaches every client
        assert time.monotonic() < deadline, "the added partitions never showed"
        time.sleep(0.2)
    kafka_client.produce_to_partitions(
        topic, {2: pageviews(15, start=30), 3: pageviews(15, start=45), 0: pageviews(5, start=60)}
    )
    run_until_caught_up(tpc)

    before_start = {(0, offset) for offset in range(10)}
    expected = produced_coordinates(kafka_client, topic) - before_start
    assert len(expected) == 55
    assert coordinates(config.delta.table_uri) == Counter(dict.fromkeys(expected, 1))
