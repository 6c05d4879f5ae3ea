"""Derived outputs in Dagster without a server or Spark: their asset keys and lineage, the
judge of `<name>_matches_recomputation`, and the walk to the derived table's version that
holds the raw table's batches (on real delta-rs tables)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow as pa
import pytest
import yaml
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from jobs.derived.invariants import recompute_aggregate, recompute_latest
from ledger.core.errors import ConfigError
from orchestration.assets import derived_key
from orchestration.health.derived_checks import (
    MAX_WALK,
    check_name,
    judge_derived,
    match_version,
)
from orchestration.pipeline_definitions import pipeline_definitions
from resources.config.derived_spec import AggregateOutput, UpsertOutput, parse_output

PER_APP: dict[str, Any] = {
    "kind": "aggregate",
    "name": "views_per_app",
    "table_uri": "d/views_per_app",
    "group_by": ["app"],
    "measures": [{"name": "views", "fn": "count"}, {"name": "bytes", "fn": "sum", "column": "n"}],
}
PER_MINUTE: dict[str, Any] = {
    "kind": "aggregate",
    "name": "views_per_minute",
    "table_uri": "d/views_per_minute",
    "group_by": ["app"],
    "window": {"column": "ts", "size": "1 minute"},
    "measures": [{"name": "views", "fn": "count"}],
}
LATEST: dict[str, Any] = {
    "kind": "upsert",
    "name": "latest_per_user",
    "table_uri": "d/latest_per_user",
    "key": ["user"],
}


def write_config(tmp_path: Path, derived: list[dict[str, Any]]) -> Path:
    path = tmp_path / "orders.yaml"
    doc = {
        "pipeline": "orders",
        "kafka": {"bootstrap_servers": "127.0.0.1:9", "topic": "orders-events"},
        "delta": {"table_uri": "t", "quarantine_uri": "q"},
        "derived": derived,
    }
    path.write_text(yaml.safe_dump(doc))
    return path


DASHBOARD: dict[str, Any] = {
    "kind": "postgres",
    "name": "dashboard",
    "url": {"env": "DASHBOARD_URL"},
    "table": "views",
    "group_by": ["app"],
    "measures": [{"name": "views", "fn": "count"}],
}


PER_APP_MEASURES = {"group_by": PER_APP["group_by"], "measures": PER_APP["measures"]}


# -- keys and lineage ----------------------------------------------------------------------


def test_each_derived_output_is_an_asset_downstream_of_the_table_with_its_check(
    tmp_path: Path,
) -> None:
    # a PostgreSQL output too, of kind postgres, its URL (a secret) not shown
    jobs = pipeline_definitions(write_config(tmp_path, [PER_APP, PER_MINUTE, LATEST, DASHBOARD]))
    graph = jobs.definitions.resolve_asset_graph()
    table = dg.AssetKey("orders_table")
    keys = [dg.AssetKey(f"orders_{n}") for n in ("views_per_app", "views_per_minute")]
    keys.append(dg.AssetKey("orders_latest_per_user"))
    keys.append(dg.AssetKey("orders_dashboard"))
    assert [spec.key for spec in jobs.derived] == keys
    for key in keys:
        node = graph.get(key)
        assert node.parent_keys == {table}
        assert node.kinds == ({"postgres"} if key == keys[3] else {"delta"})
        assert node.partitions_def == graph.get(table).partitions_def
        name = key.path[0].removeprefix("orders_")
        assert node.check_keys == {dg.AssetCheckKey(key, f"{name}_matches_recomputation")}
    described = {spec.key.path[0]: spec.description or "" for spec in jobs.derived}
    assert "bytes = sum(n) by app" in described["orders_views_per_app"]
    assert "per 1 minute tumbling window of ts" in described["orders_views_per_minute"]
    assert "latest record per key (user)" in described["orders_latest_per_user"]
    assert described["orders_dashboard"].startswith("PostgreSQL table views, derived from")
    assert "views = count(*) by app" in described["orders_dashboard"]
    # the UI runs them with the table checks
    checks = jobs.definitions.resolve_asset_graph().asset_check_keys
    assert dg.AssetCheckKey(keys[2], "latest_per_user_matches_recomputation") in checks


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("table", "the pipeline's own table asset"),
        ("Quarantine", "the pipeline's own quarantine asset"),
        ("topic", "the pipeline's own topic asset"),
        ("per.app", "only letters, digits and '_'"),
        ("per-app", "only letters, digits and '_'"),
    ],
)
def test_a_name_that_would_collide_or_that_dagster_refuses_is_refused_in_one_line(
    tmp_path: Path, name: str, says: str
) -> None:
    assert derived_key("orders", "tables") == dg.AssetKey("orders_tables")
    with pytest.raises(ConfigError, match=says) as raised:
        pipeline_definitions(write_config(tmp_path, [{**PER_APP, "name": name}]))
    assert "\n" not in str(raised.value) and repr(name) in str(raised.value)


# -- the judge -----------------------------------------------------------------------------


def raw_rows() -> pa.Table:
    ts = [datetime(2026, 1, 1, 0, m, s, tzinfo=UTC) for m, s in ((0, 1), (0, 59), (1, 0), (2, 5))]
    return pa.table(
        {
            "app": ["web", "web", "ios", None],  # u3's tombstone: no event, no group
            "user": ["u1", "u2", "u1", "u3"],
            "n": [10, 20, 5, 7],
            "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
            "_kafka_partition": [0, 0, 0, 0],
            "_kafka_offset": [0, 1, 2, 3],
            "_deleted": [False, False, False, True],
        }
    )


def test_an_aggregate_passes_with_its_figures_and_fails_naming_the_first_groups() -> None:
    spec = parse_output(PER_APP)
    assert isinstance(spec, AggregateOutput)
    expected = recompute_aggregate(raw_rows(), spec)
    ok = judge_derived("orders", spec, expected, expected, raw_version=7, derived_version=9)
    assert ok.passed and ok.check == check_name(spec) == "views_per_app_matches_recomputation"
    assert ok.asset == dg.AssetKey("orders_views_per_app")
    assert "all 2 groups equal" in ok.text and "version 9" in ok.text and "version 7" in ok.text
    assert ok.metadata["recomputed_groups"] == 2 and ok.metadata["differing_groups"] == 0

    # one more view counted for web than its rows give
    apps, counts = expected["app"].to_pylist(), expected["views"].to_pylist()
    views = pa.array([v + (a == "web") for a, v in zip(apps, counts, strict=True)], pa.int64())
    tampered = expected.set_column(expected.column_names.index("views"), "views", views)
    bad = judge_derived("orders", spec, expected, tampered, raw_version=7, derived_version=9)
    assert not bad.passed and "\n" not in bad.text
    assert "1 of 2 groups differ" in bad.text
    assert "group {'app': 'web'}: views is 3, recomputed 2" in bad.text
    assert bad.metadata["differing_groups"] == 1

    tv = expected.slice(0, 1).set_column(0, "app", pa.array(["tv"]))
    extra = pa.concat_tables([expected, tv])
    assert (
        "group {'app': 'tv'}: in the derived table"
        in judge_derived("orders", spec, expected, extra, 1, 1).text
    )


def test_an_upsert_compares_live_rows_only_and_names_the_differing_key() -> None:
    spec = parse_output(LATEST)
    assert isinstance(spec, UpsertOutput)
    expected = recompute_latest(raw_rows(), spec)
    assert sorted(expected["user"].to_pylist()) == ["u1", "u2"]  # u3's last record deletes it
    # a table keeping tombstones as rows (`_deleted` true): the deleted key is not compared
    kept = pa.concat_tables(
        [
            expected.append_column("_deleted", pa.array([False] * expected.num_rows)),
            raw_rows().slice(3, 1).select([*expected.column_names, "_deleted"]),
        ]
    )
    ok = judge_derived("orders", spec, expected, kept, 4, 4)
    assert ok.passed, ok.text
    assert "all 2 keys equal" in ok.text

    users = kept["user"].to_pylist()
    n = [99 if u == "u2" else v for u, v in zip(users, kept["n"].to_pylist(), strict=True)]
    changed = kept.set_column(kept.column_names.index("n"), "n", pa.array(n, pa.int64()))
    bad = judge_derived("orders", spec, expected, changed, 4, 4)
    assert not bad.passed
    assert "key {'user': 'u2'}: n is 99, recomputed 20" in bad.text

    revived = kept.set_column(
        kept.column_names.index("_deleted"), "_deleted", pa.array([False] * kept.num_rows)
    )
    assert (
        "key {'user': 'u3'}: in the derived table, absent or deleted in the raw rows"
        in judge_derived("orders", spec, expected, revived, 4, 4).text
    )


# -- the version walk ----------------------------------------------------------------------


def commit(uri: Path, apps: dict[str, int], mode: str = "append") -> None:
    """One commit of a row, recording application transactions as the publisher does."""
    write_deltalake(
        str(uri),
        pa.table({"x": [1]}),
        mode=mode,  # type: ignore[arg-type]
        commit_properties=txns(apps),
    )


def walk(uri: Path, raw_apps: tuple[int | None, int | None]) -> tuple[int | None, str | None]:
    table = DeltaTable(str(uri))
    live, backfill = "orders.derived.d", "orders.backfill.derived.d"

    def apps_at(version: int) -> tuple[int | None, int | None]:
        table.load_as_version(version)
        return table.transaction_version(live), table.transaction_version(backfill)

    return match_version(raw_apps, table.version(), apps_at)


def test_the_walk_finds_the_version_holding_the_raw_tables_batches(tmp_path: Path) -> None:
    uri = tmp_path / "derived"
    commit(uri, {"orders.derived.d": 1})  # v0
    commit(uri, {"orders.derived.d": 2})  # v1
    commit(uri, {"orders.backfill.derived.d": 1})  # v2
    commit(uri, {})  # v3: a compaction, no transaction
    commit(uri, {"orders.derived.d": 3})  # v4: the batch in flight, not in the raw table yet
    assert walk(uri, (2, 1)) == (3, None)  # the latest version at (2, 1)
    assert walk(uri, (3, 1)) == (4, None)  # caught up
    assert walk(uri, (1, None)) == (0, None)
    version, why = walk(uri, (4, 1))  # the raw table holds live batch 4: the derived not
    assert version is None and why is not None and "invariant 12" in why
    assert "holds live batch 3 and backfill batch 1, behind the raw table's 4 and 1" in why
    version, why = walk(uri, (2, 2))
    assert version is None and why is not None and "behind" in why


def test_the_walk_gives_no_verdict_past_its_bound(tmp_path: Path) -> None:
    calls: list[int] = []

    def ahead(version: int) -> tuple[int | None, int | None]:
        calls.append(version)
        return (version + 10, None)

    assert match_version((3, None), 200, ahead) == (None, None)
    assert len(calls) == MAX_WALK


def test_an_output_ahead_of_the_raw_table_fails_only_while_nobody_finishes_the_batch() -> None:
    """Invariant 12 allows an output one batch per application id ahead of the raw table:
    the batch in flight. Its check passes while the batch's owner may be finishing it (or
    the ledger says it committed since the raw table was read), and fails, naming the
    batch and what finishes it, when its owner is gone or the ledger does not know it."""
    from ledger.core.protocol import BatchState
    from orchestration.health.derived_checks import unfinished_ahead
    from tests.fixtures.batches import a_batch

    apps = ("orders", "orders.backfill")
    fill = a_batch(2, BatchState.PREPARED, app_id="orders.backfill", pipeline="orders")
    known = {("orders.backfill", 2): fill}

    def judge(held: tuple[int | None, int | None], alive: bool, ledger: Any = known) -> Any:
        return unfinished_ahead(
            apps, (5, 1), held, lambda a, b: ledger.get((a, b)), lambda _b: alive
        )

    assert judge((5, 1), alive=False) is None  # the same batches: nothing in flight
    assert judge((5, 2), alive=True) is None  # its owner is finishing it
    stuck = judge((5, 2), alive=False)
    assert stuck is not None and "holds batch orders.backfill/2" in stuck
    assert "nobody is finishing it (PREPARED" in stuck and "exactly recover" in stuck
    lost = judge((5, 2), alive=True, ledger={})
    assert lost is not None and "the ledger does not know" in lost
    committed = {("orders.backfill", 2): a_batch(2, BatchState.COMMITTED, app_id="orders.backfill")}
    assert judge((5, 2), alive=False, ledger=committed) is None  # the raw table has it now
    # behind is the walk's to judge (invariant 12), not this
    assert judge((4, 1), alive=False) is None and judge((None, None), alive=False) is None


# -- the materializations ------------------------------------------------------------------


def test_a_batch_is_materialized_on_each_derived_asset_with_or_without_its_metrics(
    tmp_path: Path,
) -> None:
    """A run logs the batch's merge outcome; a batch the history sensor rebuilt from the
    Delta log has none, and still gets the output's version and rows from its log."""
    from types import SimpleNamespace

    from orchestration.metadata import derived_materializations
    from resources.delta.table import DeltaTarget
    from tests.fixtures.batches import a_batch

    spec = parse_output({**PER_APP, "table_uri": str(tmp_path / "per_app")})
    commit(tmp_path / "per_app", {"orders.derived.views_per_app": 1})  # v0: 1 row
    commit(tmp_path / "per_app", {"orders.derived.views_per_app": 2})  # v1: 2 rows
    pipeline: Any = SimpleNamespace(
        config=SimpleNamespace(pipeline="orders"),
        publisher=SimpleNamespace(
            derived=[(spec, DeltaTarget(spec.table_uri))],
            postgres={"derived:dashboard": SimpleNamespace(spec=parse_output(DASHBOARD))},
        ),
    )
    outcome = {"applied": True, "version": 0, "seconds": 0.25, "tries": 1}
    outcome |= {"rows_inserted": 3, "rows_updated": 1, "rows_deleted": 0}
    applied = {"applied": True, "held_batch_id": 1, "seconds": 0.5, "tries": 1}
    applied |= {"rows_upserted": 4}
    metrics = {"derived": {spec.name: outcome, "dashboard": applied}}
    ran = a_batch(1, app_id="orders", pipeline="orders", metrics=metrics)
    logged, in_postgres = derived_materializations(pipeline, ran, "1")
    meta = {k: v.value for k, v in in_postgres.metadata.items()}
    assert (in_postgres.asset_key, in_postgres.partition) == (dg.AssetKey("orders_dashboard"), "1")
    assert (meta["applied"], meta["held_batch_id"], meta["rows_upserted"]) == (True, 1, 4)
    assert meta["table"] == "views" and meta["output_app_id"] == "orders.derived.dashboard"
    meta = {k: v.value for k, v in logged.metadata.items()}
    assert (logged.asset_key, logged.partition) == (dg.AssetKey("orders_views_per_app"), "1")
    assert meta["applied"] is True and meta["merge_seconds"] == 0.25
    assert (meta["rows_inserted"], meta["rows_updated"], meta["rows_deleted"]) == (3, 1, 0)
    # as of the MERGE's version, not today's table
    assert (meta["merge_version"], meta["table_version"], meta["row_count"]) == (0, 0, 1)
    assert meta["batch"] == "orders/1" and meta["last_batch_id"] == "1"

    rebuilt = a_batch(2, app_id="orders", pipeline="orders")  # no metrics
    logged, in_postgres = derived_materializations(pipeline, rebuilt, "2")
    assert "applied" not in {k for k in in_postgres.metadata}
    meta = {k: v.value for k, v in logged.metadata.items()}
    assert "applied" not in meta and "rows_inserted" not in meta
    assert (meta["table_version"], meta["row_count"], meta["last_batch_id"]) == (1, 2, "2")


def test_the_check_reads_the_derived_table_at_the_raw_tables_batches(tmp_path: Path) -> None:
    """On real tables: a derived table ahead by the batch in flight is read at the version
    that holds the raw table's batches (passes); one behind the raw table fails (invariant
    12); no verdict until both tables exist."""

    from orchestration.health.derived_checks import derived_verdict
    from resources.delta.table import DeltaTarget

    raw_uri, out_uri = tmp_path / "raw", tmp_path / "per_app"
    spec = parse_output({**PER_APP, "table_uri": str(out_uri)})
    assert isinstance(spec, AggregateOutput)
    pipeline: Any = in_flight_pipeline(raw_uri)
    target = DeltaTarget(spec.table_uri)
    assert derived_verdict(pipeline, spec, target) is None  # no table yet

    txn = "orders.derived.views_per_app"
    rows = raw_rows()
    write_deltalake(str(out_uri), recompute_aggregate(rows, spec), commit_properties=txns({txn: 1}))
    assert derived_verdict(pipeline, spec, target) is None  # the raw table not yet
    write_deltalake(str(raw_uri), rows, commit_properties=txns({"orders": 1}))
    # batch 2 in flight: in the derived table, not yet in the raw table
    more = rows.slice(0, 1)
    ahead = recompute_aggregate(pa.concat_tables([rows, more]), spec)
    write_deltalake(str(out_uri), ahead, mode="overwrite", commit_properties=txns({txn: 2}))
    verdict = derived_verdict(pipeline, spec, target)
    assert verdict is not None and verdict.passed, verdict
    assert verdict.metadata["derived_version"] == 0 and verdict.metadata["raw_version"] == 0
    pipeline.live.may_be_alive = lambda _batch: False  # its owner died: nobody finishes it
    verdict = derived_verdict(pipeline, spec, target)
    assert verdict is not None and not verdict.passed and "holds batch orders/2" in verdict.text
    pipeline.live.may_be_alive = lambda _batch: True

    write_deltalake(str(raw_uri), more, mode="append", commit_properties=txns({"orders": 2}))
    verdict = derived_verdict(pipeline, spec, target)
    assert verdict is not None and verdict.passed and verdict.metadata["derived_version"] == 1

    write_deltalake(str(raw_uri), more, mode="append", commit_properties=txns({"orders": 3}))
    verdict = derived_verdict(pipeline, spec, target)
    assert verdict is not None and not verdict.passed
    assert "behind the raw table's 3 and None" in verdict.text and "invariant 12" in verdict.text


def in_flight_pipeline(raw_uri: Path) -> Any:
    """What the checks read of a Pipeline: its raw table, and a ledger in which every batch
    an output holds ahead of the raw table is PREPARED by an owner that may be alive (the
    batch in flight)."""
    from types import SimpleNamespace

    from ledger.core.protocol import BatchState
    from resources.delta.table import DeltaTarget
    from tests.fixtures.batches import a_batch

    return SimpleNamespace(
        config=SimpleNamespace(pipeline="orders", app_id="orders"),
        publisher=SimpleNamespace(table=DeltaTarget(str(raw_uri))),
        store=SimpleNamespace(
            get=lambda app, batch_id: a_batch(batch_id, BatchState.PREPARED, app_id=app)
        ),
        live=SimpleNamespace(may_be_alive=lambda _batch: True),
    )


def txns(apps: dict[str, int]) -> CommitProperties:
    return CommitProperties(
        app_transactions=[Transaction(app_id=a, version=v) for a, v in apps.items()]
    )


def test_the_postgres_check_compares_when_the_state_holds_the_raw_tables_batches(
    tmp_path: Path, postgres_url: str
) -> None:
    """On the suite's PostgreSQL and a real raw table: no verdict until both exist, nor
    while the output holds the batch in flight (it is published before the raw table);
    equal when its state holds the raw table's batches; behind the raw table fails
    (invariant 12); a row changed behind the pipeline's back fails naming the group."""
    import uuid

    import sqlalchemy as sa

    from orchestration.health.derived_checks import postgres_verdict
    from resources.config.derived_spec import PostgresOutput
    from resources.postgres.apply import apply_partial
    from resources.postgres.target import PostgresTarget

    raw_uri = tmp_path / "raw"
    table = f"per_app_{uuid.uuid4().hex[:12]}"
    spec = parse_output({**DASHBOARD, "url": postgres_url, "table": table, **PER_APP_MEASURES})
    assert isinstance(spec, PostgresOutput)
    pg = PostgresTarget(spec, str(raw_uri))
    pipeline: Any = in_flight_pipeline(raw_uri)
    app = spec.app_id("orders")
    try:
        assert postgres_verdict(pipeline, pg) is None  # no raw table yet
        rows = raw_rows()
        apply_partial(pg.engine, spec, app, 1, None, recompute_aggregate(rows, spec))  # type: ignore[arg-type]
        write_deltalake(str(raw_uri), rows, commit_properties=txns({"orders": 1}))
        verdict = postgres_verdict(pipeline, pg)
        assert verdict is not None and verdict.passed, verdict
        assert verdict.metadata["recomputed_groups"] == 2

        more = rows.slice(0, 1)
        apply_partial(pg.engine, spec, app, 2, 1, recompute_aggregate(more, spec))  # type: ignore[arg-type]
        assert postgres_verdict(pipeline, pg) is None  # batch 2 in flight
        write_deltalake(str(raw_uri), more, mode="append", commit_properties=txns({"orders": 2}))
        verdict = postgres_verdict(pipeline, pg)
        assert verdict is not None and verdict.passed, verdict

        with pg.engine.begin() as conn:
            conn.execute(sa.text(f"UPDATE \"{table}\" SET views = views + 1 WHERE app = 'ios'"))
        verdict = postgres_verdict(pipeline, pg)
        assert verdict is not None and not verdict.passed and "ios" in verdict.text, verdict

        write_deltalake(str(raw_uri), more, mode="append", commit_properties=txns({"orders": 3}))
        verdict = postgres_verdict(pipeline, pg)
        assert verdict is not None and not verdict.passed
        assert "behind the raw table's [3, None]" in verdict.text, verdict.text
        assert "invariant 12" in verdict.text
    finally:
        pg.dispose()
