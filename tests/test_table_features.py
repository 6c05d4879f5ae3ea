"""Table features delta-spark can turn on under a live pipeline's tables.

delta-spark reads and maintains the tables exactly commits (README), so an operator may set
a table property there that changes how the table must be written. delta-rs refuses most
of them itself at the commit, in ways the commit loop took for lost races or a failing
store; not column mapping: it commits a batch's files as they are, and once a column was
renamed their values read as nulls through delta-spark (its physical name is the old one)
while delta-rs reads the table's older rows as nulls. Nor are a table's CHECK constraints
checked against a batch's rows. Each case must stop the pipeline in one line naming what to
turn off, before anything of the batch is committed: before the vote (the batch is
abandoned, its offsets read again once the table is fixed) and at the commit for a batch
that voted before the change (it waits, voted). resources/delta/features.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from jobs.examples.sample_data import pageviews
from ledger.core.backfill import BackfillError
from ledger.core.errors import ConfigError, InconsistencyError, RefusedBatchError
from ledger.core.protocol import BatchState, OffsetRange
from ledger.store.ledger_store import LedgerStore
from resources.config.partitioning import PartitionColumn
from resources.delta.table import DeltaTarget
from tests.fixtures.derived import TRANSFORM, assert_derived_match, derived_outputs, user_events
from tests.fixtures.pipeline import assert_exactly_once, config_path, crash_env, crash_run
from tests.test_backfill import V2, apps_by_coordinate, backfill, cli, live_until_caught_up
from tests.test_crash import live_restart
from tests.test_crash_backfill import plain_run
from tests.test_delta_commit import SCHEMA, TOPIC, publish, publish_batches


def run_on(spark: Any, root: Path, *statements: str) -> None:
    """delta-spark's SQL on the table at `root` (`{table}` in each statement)."""
    for statement in statements:
        spark.sql(statement.format(table=f"delta.`{root}`"))


def altered(spark: Any, tmp_path: Path, *statements: str) -> tuple[Path, DeltaTarget]:
    """A table of exactly's with one batch, then `statements` run on it by delta-spark."""
    root = tmp_path / "table"
    target = DeltaTarget(str(root))
    publish_batches(target, root, [1])
    run_on(spark, root, *statements)
    return root, target


def test_column_mapping_is_refused_before_the_vote_and_at_the_commit(
    spark: Any, tmp_path: Path
) -> None:
    root, target = altered(
        spark,
        tmp_path,
        "ALTER TABLE {table} SET TBLPROPERTIES ('delta.columnMapping.mode' = 'name', "
        "'delta.minReaderVersion' = '2', 'delta.minWriterVersion' = '5')",
        "ALTER TABLE {table} RENAME COLUMN value TO payload",
    )
    version = DeltaTable(str(root)).version()

    with pytest.raises(RefusedBatchError, match=r"column mapping \(delta.columnMapping.mode"):
        target.check_schema(SCHEMA)
    with pytest.raises(InconsistencyError, match="column mapping") as failure:
        publish(target, root, 2, 1, OffsetRange(TOPIC, 0, 20, 30))
    assert "\n" not in str(failure.value)
    assert DeltaTable(str(root)).version() == version  # nothing of batch 2 committed


def test_a_feature_delta_rs_cannot_write_is_one_line_not_fifty_lost_races(
    spark: Any, tmp_path: Path
) -> None:
    """delta-rs refuses type widening at the commit as a CommitFailedError, which the commit
    loop took for a lost race, fifty times over."""
    root, target = altered(
        spark,
        tmp_path,
        "ALTER TABLE {table} SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')",
    )

    with pytest.raises(RefusedBatchError, match="typeWidening"):
        target.check_schema(SCHEMA)
    with pytest.raises(InconsistencyError) as failure:
        publish(target, root, 2, 1, OffsetRange(TOPIC, 0, 20, 30))
    said = str(failure.value)
    assert "typeWidening" in said and "commit races" not in said and "\n" not in said


def test_deletion_vectors_are_one_line_naming_the_feature(spark: Any, tmp_path: Path) -> None:
    """delta-rs refuses a table with deletion vectors at the commit with a DeltaError, which
    the commit loop took for the store failing."""
    root, target = altered(
        spark,
        tmp_path,
        "ALTER TABLE {table} SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')",
        "DELETE FROM {table} WHERE _kafka_offset = 3",
    )
    version = DeltaTable(str(root)).version()

    with pytest.raises(RefusedBatchError, match="deletionVectors"):
        target.check_schema(SCHEMA)
    with pytest.raises(InconsistencyError, match="deletionVectors") as failure:
        publish(target, root, 2, 1, OffsetRange(TOPIC, 0, 20, 30))
    assert "\n" not in str(failure.value)
    assert DeltaTable(str(root)).version() == version


def test_check_constraints_are_refused_and_allowed_again_once_dropped(
    spark: Any, tmp_path: Path
) -> None:
    """A batch's rows are added as staged, never checked against a CHECK constraint that
    every reader trusts; once the constraint is dropped the table takes batches again
    (its protocol keeps naming the feature: features are never removed)."""
    root, target = altered(
        spark, tmp_path, "ALTER TABLE {table} ADD CONSTRAINT small CHECK (_kafka_offset < 25)"
    )

    with pytest.raises(InconsistencyError, match=r"CHECK constraints \(delta.constraints.small"):
        publish(target, root, 2, 1, OffsetRange(TOPIC, 0, 20, 30))
    run_on(spark, root, "ALTER TABLE {table} DROP CONSTRAINT small")
    assert publish(target, root, 2, 1, OffsetRange(TOPIC, 0, 20, 30)).published


def aggregate_voted_behind(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> tuple[Any, Path]:
    """A pipeline with the views_per_app aggregate: batch 1 committed everywhere, batch 2
    voted and killed before its commit. The config and the aggregate's table."""
    (per_app,) = [o for o in derived_outputs(tmp_path / "derived") if o["name"] == "views_per_app"]
    config = pipeline_factory(2, transform=TRANSFORM, derived=[per_app])
    topic = config.kafka.topic
    kafka_client.produce_records(topic, user_events(0, 200, 2, malformed_every=20))
    live_restart(config, spark)  # batch 1: every table exists
    kafka_client.produce_records(topic, user_events(200, 100, 2, malformed_every=20))
    crash_run(config, "after_prepare")
    return config, Path(per_app["table_uri"])


def test_a_derived_output_given_a_check_constraint_after_the_vote_holds_its_batch(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    """The same guard at a derived output's MERGE: batch 2 voted, then an operator adds a
    CHECK constraint to the aggregate's table. Recovery refuses in one line naming it and
    commits nothing (the raw table is published after every derived output), the batch
    waits voted; once the constraint is dropped the next start finishes it, once."""
    config, aggregate = aggregate_voted_behind(spark, kafka_client, pipeline_factory, tmp_path)
    version = DeltaTable(str(aggregate)).version()
    run_on(spark, aggregate, "ALTER TABLE {table} ADD CONSTRAINT counted CHECK (views > 0)")

    with pytest.raises(InconsistencyError, match=r"CHECK constraints \(delta.constraints.counted"):
        live_restart(config, spark)
    store = LedgerStore(config.ledger.url)
    try:
        held = store.get(config.app_id, 2)
    finally:
        store.dispose()
    assert held is not None and held.state is BatchState.PREPARED
    assert DeltaTable(str(aggregate)).version() == version + 1  # the ALTER, nothing else
    assert DeltaTarget(config.delta.table_uri).transaction_version(config.app_id) == 1

    run_on(spark, aggregate, "ALTER TABLE {table} DROP CONSTRAINT counted")
    live_restart(config, spark)
    table, quarantined = assert_exactly_once(config, kafka_client)
    assert table + quarantined == 300
    assert_derived_match(config)


@pytest.mark.wide  # the wiring is the CHECK-constraint case's above; the rule, unit, below
def test_an_append_only_derived_output_is_refused_at_the_commit_and_before_the_vote(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    """An aggregate's MERGE updates the rows of the keys a batch counts again, and delta-rs
    refuses those removes in an append-only table (`delta.appendOnly`): the commit took that
    for lost races, twenty tries at a time, and the batch waited voted behind an error that
    read like the store's. Refused in one line naming the property: at the commit of a
    batch that voted before it was set (it waits, voted), and before the vote after it."""
    config, aggregate = aggregate_voted_behind(spark, kafka_client, pipeline_factory, tmp_path)
    change_feed(spark, aggregate, True, "delta.appendOnly")
    version = DeltaTable(str(aggregate)).version()

    with pytest.raises(InconsistencyError, match=r"append-only \(delta.appendOnly") as waits:
        live_restart(config, spark)
    assert "\n" not in str(waits.value) and not isinstance(waits.value, RefusedBatchError)
    assert DeltaTable(str(aggregate)).version() == version
    assert DeltaTarget(config.delta.table_uri).transaction_version(config.app_id) == 1

    change_feed(spark, aggregate, False, "delta.appendOnly")
    live_restart(config, spark)  # batch 2 commits
    change_feed(spark, aggregate, True, "delta.appendOnly")
    kafka_client.produce_records(config.kafka.topic, user_events(300, 100, 2, malformed_every=20))
    with pytest.raises(RefusedBatchError, match=r"append-only \(delta.appendOnly"):
        live_restart(config, spark)
    change_feed(spark, aggregate, False, "delta.appendOnly")
    live_restart(config, spark)
    table, quarantined = assert_exactly_once(config, kafka_client)
    assert table + quarantined == 400
    assert_derived_match(config)


def test_a_derived_output_with_a_generated_column_is_refused_before_the_vote(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    """delta-rs's MERGE computes a generated column on an insert but refuses every update
    of its source ("rows failed validation check"): the aggregate's second batch would wait
    voted behind a store-like error, twenty tries at a time. Refused at the first, in one
    line naming the column, before anything is committed anywhere."""
    (per_app,) = [o for o in derived_outputs(tmp_path / "derived") if o["name"] == "views_per_app"]
    aggregate = Path(per_app["table_uri"])
    run_on(
        spark,
        aggregate,
        "CREATE TABLE {table} (app STRING, views BIGINT, "
        "doubled BIGINT GENERATED ALWAYS AS (views * 2)) USING DELTA",
    )
    config = pipeline_factory(2, transform=TRANSFORM, derived=[per_app])
    kafka_client.produce_records(config.kafka.topic, user_events(0, 200, 2, malformed_every=20))

    with pytest.raises(RefusedBatchError, match=r"generated column\(s\) doubled") as failure:
        live_restart(config, spark)
    assert "\n" not in str(failure.value)
    assert DeltaTable(str(aggregate)).version() == 0  # the CREATE, nothing else
    assert DeltaTarget(config.delta.table_uri).transaction_version(config.app_id) is None


def change_feed(spark: Any, root: Path, on: bool, key: str = "delta.enableChangeDataFeed") -> None:
    flag = "true" if on else "false"
    run_on(spark, root, f"ALTER TABLE {{table}} SET TBLPROPERTIES ('{key}' = '{flag}')")


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("delta.enableChangeDataFeed", r"change data feed on \(delta.enableChangeDataFeed"),
        # the same two refusals (replace_refusal); the property itself below, in make test
        pytest.param("delta.appendOnly", r"append-only \(delta.appendOnly", marks=pytest.mark.wide),
    ],
)
def test_a_replace_into_a_table_with_change_data_feed_is_refused_before_and_after_its_vote(
    spark: Any, kafka_client: Any, pipeline_factory: Any, key: str, words: str
) -> None:
    """A replace rewrites each file holding a replaced row without it, and delta-rs writes no
    change data for that commit: a change-feed reader (delta-spark's readChangeFeed) derives
    the commit's changes from its files, so every other row of a rewritten file reads as
    deleted and inserted again, a second copy for anyone who applies the inserts. Appends
    (live batches, fills) stay right under it. So a replace is refused in one line naming
    it: when it is planned, and, for one that voted before the feed was turned on, at its
    commit (it waits, voted, until the feed is off). An append-only table
    (`delta.appendOnly`) the same: delta-rs refused the replace's removes at the commit,
    which the commit took for twenty lost races, and a voted replace failed every start
    with an error that read like the store's."""
    config = pipeline_factory(1, max_records=100)
    topic, path = config.kafka.topic, str(config_path(config))
    kafka_client.produce(topic, pageviews(100), partition=0)
    live_until_caught_up(config, spark)  # batch 1: one file holding offsets [0, 100)
    root = Path(config.delta.table_uri)
    change_feed(spark, root, True, key)
    version = DeltaTable(str(root)).version()

    with pytest.raises(BackfillError, match=words):
        backfill(config, spark, "replace", OffsetRange(topic, 0, 10, 20))
    assert DeltaTable(str(root)).version() == version

    change_feed(spark, root, False, key)
    args = ["--partition", "0", "--from", "10", "--to", "20", "--mode", "replace"]
    crashed = cli("backfill", "-c", path, *args, "--transform", V2, env=crash_env("after_prepare"))
    assert crashed.returncode == 137, crashed.stdout + crashed.stderr
    change_feed(spark, root, True, key)
    version = DeltaTable(str(root)).version()
    with pytest.raises(InconsistencyError, match=words) as refused:
        plain_run(config, spark)
    assert "\n" not in str(refused.value)
    assert DeltaTable(str(root)).version() == version

    change_feed(spark, root, False, key)
    plain_run(config, spark)
    replaced = {o for (_p, o), app in apps_by_coordinate(config).items() if app != app.lower()}
    assert replaced == set(range(10, 20))
    assert sum(assert_exactly_once(config, kafka_client)) == 100


@pytest.mark.parametrize(
    ("configuration", "refused"),
    [
        ({}, None),
        ({"delta.appendOnly": "false"}, None),
        ({"delta.appendOnly": "true"}, "is append-only (delta.appendOnly)"),
        ({"delta.appendOnly": "TRUE"}, "is append-only (delta.appendOnly)"),
        ({"delta.enableChangeDataFeed": "true"}, "has change data feed on"),
    ],
)
def test_a_replace_is_refused_by_the_table_s_properties(
    tmp_path: Path, configuration: dict[str, str], refused: str | None
) -> None:
    """What a replace cannot commit into, read from the table's own properties as any
    writer may have set them (here delta-rs, at the table's creation)."""
    from deltalake import write_deltalake

    root = str(tmp_path / "table")
    rows = pa.table({"a": pa.array([1], pa.int64())})
    write_deltalake(root, rows, configuration=configuration or None)
    said = DeltaTarget(root).replace_refusal()
    if refused is None:
        assert said is None
    else:
        assert said is not None and refused in said and "\n" not in said


@pytest.mark.parametrize("merged", [True, False])
def test_an_append_only_table_is_refused_to_a_merge_and_taken_by_appends(
    tmp_path: Path, merged: bool
) -> None:
    """delta-rs refuses a MERGE's updates in an append-only table at the commit (the commit
    loop took that for lost races): a derived output's table, which a MERGE writes, is
    refused in one line before the vote and at the commit; the raw table and the quarantine
    only append, and take it."""
    from deltalake import write_deltalake

    from resources.delta.features import refuse_unwritable

    root = str(tmp_path / "table")
    write_deltalake(root, pa.table({"a": [1]}), configuration={"delta.appendOnly": "true"})
    table = DeltaTable(root)
    if not merged:
        refuse_unwritable(table, root, voted=False, generated={}, merged=False)
        return
    with pytest.raises(RefusedBatchError, match=r"append-only \(delta.appendOnly") as before:
        refuse_unwritable(table, root, voted=False, generated={}, merged=True)
    with pytest.raises(InconsistencyError, match="waits, voted") as after:
        refuse_unwritable(table, root, voted=True, generated={}, merged=True)
    assert not isinstance(after.value, RefusedBatchError)
    assert "\n" not in str(before.value) + str(after.value)


TIMED = pa.schema([*SCHEMA, ("ts", pa.timestamp("us", tz="UTC")), ("day", pa.date32())])


def test_a_generated_column_exactly_does_not_compute_is_refused_before_the_vote_and_at_the_commit(
    spark: Any, tmp_path: Path
) -> None:
    """exactly adds the files Spark staged as they are: a generated column the stage does not
    compute would be null in every row of a batch, against the table's own expression, which
    delta-spark enforces for its own writes (a reader filtering on it would miss the rows)."""
    root = tmp_path / "table"
    run_on(
        spark,
        root,
        "CREATE TABLE {table} (_kafka_topic STRING, _kafka_partition INT, _kafka_offset BIGINT, "
        "value STRING, value_length INT GENERATED ALWAYS AS (LENGTH(value))) USING DELTA",
    )
    target = DeltaTarget(str(root))
    version = DeltaTable(str(root)).version()

    with pytest.raises(RefusedBatchError, match=r"generated column\(s\) value_length") as before:
        target.check_schema(SCHEMA)
    with pytest.raises(InconsistencyError, match="value_length") as failure:
        publish(target, root, 1, 1, OffsetRange(TOPIC, 0, 0, 10))
    assert "\n" not in str(before.value) and "\n" not in str(failure.value)
    assert DeltaTable(str(root)).version() == version  # nothing of batch 1 committed


def test_a_partition_column_the_table_generates_otherwise_is_refused(
    spark: Any, tmp_path: Path
) -> None:
    """The stage computes a partition column by the config's expression; a table that
    generates it by another (delta-spark's CAST, in the session's zone, or exactly's own
    with another time zone) would hold rows breaking its expression. The table's own
    expression, as exactly created it, is taken."""
    theirs = tmp_path / "theirs"
    run_on(
        spark,
        theirs,
        "CREATE TABLE {table} (_kafka_topic STRING, _kafka_partition INT, _kafka_offset BIGINT, "
        "value STRING, ts TIMESTAMP, day DATE GENERATED ALWAYS AS (CAST(ts AS DATE))) "
        "USING DELTA PARTITIONED BY (day)",
    )
    utc = [PartitionColumn(name="day", date_of="ts")]
    with pytest.raises(RefusedBatchError, match="partition column day") as failure:
        DeltaTarget(str(theirs), partition_by=utc).check_schema(TIMED)
    assert "CAST(ts AS DATE)" in str(failure.value) and "\n" not in str(failure.value)

    ours = tmp_path / "ours"
    DeltaTarget(str(ours), partition_by=utc).ensure_table(TIMED)
    assert DeltaTarget(str(ours), partition_by=utc).check_schema(TIMED) is None
    paris = [PartitionColumn(name="day", date_of="ts", time_zone="Europe/Paris")]
    with pytest.raises(RefusedBatchError, match="Europe/Paris"):
        DeltaTarget(str(ours), partition_by=paris).check_schema(TIMED)


def voted_batches(config: Any) -> list[tuple[int, BatchState]]:
    return [
        (b.batch_id, b.state) for b in LedgerStore(config.ledger.url).batches(app_id=config.app_id)
    ]


def test_a_quarantine_partitioned_by_another_writer_is_refused_before_the_vote(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    """exactly creates the quarantine unpartitioned and stages its files so; one created
    partitioned by someone else took them until the first batch with a bad record, whose
    commit then refused the file as staged for another layout, the batch held voted for a
    layout no config can give. Refused at the first batch, before the vote, naming the
    field to change; with another quarantine_uri the same records are taken once."""
    config = pipeline_factory(2, transform=TRANSFORM)
    run_on(
        spark,
        Path(config.delta.quarantine_uri),
        "CREATE TABLE {table} (_kafka_topic STRING, _kafka_partition INT, "
        "_kafka_offset BIGINT, _kafka_timestamp TIMESTAMP, _batch_id BIGINT, _error STRING, "
        "_raw_value BINARY) USING DELTA PARTITIONED BY (_kafka_partition)",
    )
    kafka_client.produce_records(config.kafka.topic, user_events(0, 200, 2, malformed_every=20))

    with pytest.raises(ConfigError, match=r"delta.quarantine_uri: .* \['_kafka_partition'\]") as e:
        live_restart(config, spark)
    assert "\n" not in str(e.value)
    assert DeltaTable(config.delta.quarantine_uri).version() == 0  # the CREATE, nothing else
    assert DeltaTarget(config.delta.table_uri).transaction_version(config.app_id) is None
    assert BatchState.PREPARED not in {state for _, state in voted_batches(config)}

    moved = config.delta.model_copy(update={"quarantine_uri": str(tmp_path / "quarantine2")})
    live_restart(config.model_copy(update={"delta": moved}), spark)
    table, quarantined = assert_exactly_once(
        config.model_copy(update={"delta": moved}), kafka_client
    )
    assert quarantined > 0 and table + quarantined == 200


def test_an_aggregate_whose_table_has_another_layout_is_refused_before_the_vote(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    """An aggregate's MERGE refuses a table partitioned otherwise than its config says
    (rows would land in the null partition); that check ran only at the commit, after the
    vote, where the batch then waited voted. It runs before the vote too."""
    (per_app,) = [o for o in derived_outputs(tmp_path / "derived") if o["name"] == "views_per_app"]
    aggregate = Path(per_app["table_uri"])
    run_on(
        spark,
        aggregate,
        "CREATE TABLE {table} (app STRING, views BIGINT) USING DELTA PARTITIONED BY (app)",
    )
    config = pipeline_factory(2, transform=TRANSFORM, derived=[per_app])
    kafka_client.produce_records(config.kafka.topic, user_events(0, 200, 2, malformed_every=20))

    with pytest.raises(ConfigError, match=r"derived.views_per_app.partition_by: .*\['app'\]") as e:
        live_restart(config, spark)
    assert "\n" not in str(e.value)
    assert DeltaTable(str(aggregate)).version() == 0
    assert DeltaTarget(config.delta.table_uri).transaction_version(config.app_id) is None
    assert BatchState.PREPARED not in {state for _, state in voted_batches(config)}
