"""resources/config/pipeline_config.py and loading.py: the pipeline YAML, validated with errors
that name the field."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from ledger.core.errors import ConfigError
from resources.config.loading import load_config, parse_config
from resources.config.pipeline_config import PipelineConfig
from resources.config.transforms import load_transform

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "pipelines" / "pageviews.yaml"

MINIMAL: dict[str, Any] = {
    "pipeline": "orders",
    "kafka": {"bootstrap_servers": "broker-1:9092,broker-2:9093", "topic": "orders"},
    "delta": {"table_uri": "tables/orders", "quarantine_uri": "tables/orders_quarantine"},
}


def config_with(**changes: Any) -> dict[str, Any]:
    """MINIMAL with dotted keys set (value) or removed (None)."""
    data = copy.deepcopy(MINIMAL)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return data


def config_error(data: Any, base: Path | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "test.yaml", base)
    message = str(info.value)
    assert message.startswith("invalid pipeline config test.yaml: ")
    return message


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    return path


# -- the shipped config -------------------------------------------------------------------


def test_shipped_pageviews_config_loads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config(SHIPPED)
    assert config.pipeline == "pageviews"
    assert config.app_id == "pageviews"
    assert config.kafka.bootstrap_servers == "127.0.0.1:9092"
    assert config.kafka.topic == "pageviews"
    assert config.group_id == "exactly-pageviews"
    assert config.kafka.options == {}
    here = tmp_path.resolve()
    assert config.delta.table_uri == str(here / "data" / "pageviews")
    assert config.delta.quarantine_uri == str(here / "data" / "pageviews_quarantine")
    assert config.ledger.url == f"sqlite:///{here / 'data' / 'ledger.db'}"
    assert config.spark.master == "local[2]"
    assert config.batch.max_records_per_partition == 100_000
    assert config.schedule.cron == "*/5 * * * *"
    assert config.transform == "jobs.examples.pageviews:transform"


def test_defaults_fill_optional_sections(tmp_path: Path) -> None:
    config = parse_config(MINIMAL, "test.yaml", tmp_path)
    assert isinstance(config, PipelineConfig)
    assert config.group_id == "exactly-orders"
    assert config.batch.max_records_per_partition == 100_000
    assert config.batch.lease_seconds == 120.0
    assert config.schedule.timezone == "UTC"
    assert config.ledger.url == f"sqlite:///{(tmp_path / 'data' / 'ledger.db').resolve()}"


# -- unknown, missing and bad keys --------------------------------------------------------


@pytest.mark.parametrize(
    ("dotted", "named"),
    [
        ("kafka__topik", "kafka.topik: unknown key"),
        ("piepline", "piepline: unknown key"),
        ("delta__table_url", "delta.table_url: unknown key"),
        ("batch__max_records", "batch.max_records: unknown key"),
        ("schedule__crontab", "schedule.crontab: unknown key"),
        ("ledger__uri", "ledger.uri: unknown key"),
    ],
)
def test_unknown_keys_are_errors_naming_the_field(dotted: str, named: str) -> None:
    assert named in config_error(config_with(**{dotted: "x"}))


@pytest.mark.parametrize(
    ("dotted", "named"),
    [
        ("pipeline", "pipeline: required key is missing"),
        ("kafka__topic", "kafka.topic: required key is missing"),
        ("kafka__bootstrap_servers", "kafka.bootstrap_servers: required key is missing"),
        ("delta__quarantine_uri", "delta.quarantine_uri: required key is missing"),
        ("delta", "delta: required key is missing"),
    ],
)
def test_missing_required_keys_are_named(dotted: str, named: str) -> None:
    assert named in config_error(config_with(**{dotted: None}))


@pytest.mark.parametrize(
    ("dotted", "value", "named"),
    [
        ("batch__max_records_per_partition", 0, "batch.max_records_per_partition: "),
        ("batch__max_records_per_partition", -5, "batch.max_records_per_partition: "),
        ("batch__max_records_per_partition", "many", "batch.max_records_per_partition: "),
        ("batch__lease_seconds", 0, "batch.lease_seconds: "),
        ("kafka__bootstrap_servers", "nohostport", "'nohostport' is not host:port"),
        ("kafka__bootstrap_servers", "a:1,b:port", "'b:port' is not host:port"),
        ("kafka__bootstrap_servers", ":9092", "':9092' is not host:port"),
        ("kafka__topic", "", "kafka.topic: "),
        ("pipeline", "has space", "pipeline: Value error, must be letters"),
        ("pipeline", "x" * 129, "pipeline: Value error, must be letters"),
        ("transform", "module_without_function", "transform: Value error, must be"),
        ("kafka", "not-a-mapping", "kafka: "),
    ],
)
def test_bad_values_are_named(dotted: str, value: Any, named: str) -> None:
    message = config_error(config_with(**{dotted: value}))
    assert named in message
    field = dotted.replace("__", ".")
    assert f"{field}: " in message


@pytest.mark.parametrize("name", ["orders.backfill", "backfill.backfill", "a.b.backfill"])
def test_a_pipeline_name_that_ends_like_a_backfill_app_id_is_refused(name: str) -> None:
    """Pipeline X's backfills commit under the application id `X.backfill`: a pipeline
    named `X.backfill` would share their Delta transaction versions and ledger rows, so
    each could take the other's commit for its own (invariants 1 and 2)."""
    message = config_error(config_with(pipeline=name))
    assert "pipeline: Value error, must not end in '.backfill'" in message
    assert f"backfills of pipeline {name.removesuffix('.backfill')!r}" in message


@pytest.mark.parametrize("name", ["orders.backfills", "orders-backfill", "backfill", "a.Backfill"])
def test_names_that_merely_look_like_backfills_are_fine(name: str) -> None:
    assert parse_config(config_with(pipeline=name)).pipeline == name


def test_one_code_location_cannot_serve_a_pipeline_and_its_backfills_name(
    tmp_path: Path,
) -> None:
    """Two configs in one folder (one code location, one ledger): `a` and `a.backfill`."""
    from orchestration.pipelines import config_files

    for name in ("a", "a.backfill"):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(config_with(pipeline=name)))
    with pytest.raises(ConfigError) as info:
        config_files(tmp_path)
    message = str(info.value)
    assert message.startswith(f"invalid pipeline config {tmp_path / 'a.backfill.yaml'}: ")
    assert "pipeline: Value error, must not end in '.backfill'" in message


def test_one_code_location_cannot_serve_two_pipelines_dagster_spells_alike(
    tmp_path: Path,
) -> None:
    from orchestration.pipelines import config_files

    for name in ("orders-eu", "orders_eu"):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(config_with(pipeline=name)))
    with pytest.raises(ConfigError) as info:
        config_files(tmp_path)
    assert str(info.value) == (
        f"pipelines ['orders-eu', 'orders_eu'] in {tmp_path} have one Dagster name "
        "(orders_eu: Dagster spells '.' and '-' as '_'); rename one of them"
    )


def test_every_problem_is_reported_at_once() -> None:
    data = config_with(
        kafka__topik="x",
        kafka__bootstrap_servers="nohostport",
        batch__max_records_per_partition=0,
        delta__table_uri=None,
    )
    message = config_error(data)
    for named in (
        "kafka.topik: unknown key",
        "kafka.bootstrap_servers: ",
        "batch.max_records_per_partition: ",
        "delta.table_uri: required key is missing",
    ):
        assert named in message


def test_valid_bootstrap_lists_pass(tmp_path: Path) -> None:
    for servers in ("h:1", "h1:9092, h2:9093", "[::1]:9092"):
        config = parse_config(config_with(kafka__bootstrap_servers=servers), "t", tmp_path)
        assert config.kafka.bootstrap_servers == servers


# -- the file itself ----------------------------------------------------------------------


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n", ""])
def test_non_mapping_yaml_is_config_error(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)
    assert "expected a mapping at the top" in str(info.value)


def test_invalid_yaml_is_config_error(tmp_path: Path) -> None:
    path = write(tmp_path, "pipeline: [unclosed\nkafka: {\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"pipeline config {path} is not valid YAML" in str(info.value)


def test_missing_file_is_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="cannot read pipeline config") as info:
        load_config(missing)
    assert str(missing) in str(info.value)


def test_load_config_names_the_file_in_validation_errors(tmp_path: Path) -> None:
    path = write(tmp_path, yaml.safe_dump(config_with(kafka__topik="x")))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"invalid pipeline config {path}: kafka.topik")


# -- locations ----------------------------------------------------------------------------


def test_relative_paths_become_absolute(tmp_path: Path) -> None:
    data = config_with(
        delta__table_uri="./t/orders",
        delta__quarantine_uri="../q/orders",
        ledger__url="sqlite:///state/ledger.db",
    )
    base = tmp_path / "project"
    config = parse_config(data, "test.yaml", base)
    assert config.delta.table_uri == str((base / "t" / "orders").resolve())
    assert config.delta.quarantine_uri == str((tmp_path / "q" / "orders").resolve())
    assert config.ledger.url == f"sqlite:///{(base / 'state' / 'ledger.db').resolve()}"
    assert os.path.isabs(config.delta.table_uri)


def test_load_config_resolves_against_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    path = write(tmp_path, yaml.safe_dump(MINIMAL))
    monkeypatch.chdir(elsewhere)
    config = load_config(path)
    assert config.delta.table_uri == str(elsewhere.resolve() / "tables" / "orders")


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:////var/lib/exactly/ledger.db",
        "sqlite:///:memory:",
        "postgresql://exactly@db:5432/ledger",
    ],
)
def test_absolute_and_remote_ledger_urls_unchanged(tmp_path: Path, url: str) -> None:
    assert parse_config(config_with(ledger__url=url), "t", tmp_path).ledger.url == url


def test_remote_table_uris_unchanged(tmp_path: Path) -> None:
    data = config_with(
        delta__table_uri="s3://bucket/tables/orders/", delta__quarantine_uri="s3://bucket/q"
    )
    config = parse_config(data, "t", tmp_path)
    assert config.delta.table_uri == "s3://bucket/tables/orders"
    assert config.delta.quarantine_uri == "s3://bucket/q"


@pytest.mark.parametrize(
    ("table", "quarantine"),
    [
        ("tables/orders", "tables/orders"),
        ("./tables/orders", "tables/orders/"),
        ("tables/x/../orders", "tables/orders"),
        ("s3://b/orders", "s3://b/orders/"),
        # one bucket under both of S3's schemes: delta-rs and Spark read either as the same
        ("s3://b/orders", "s3a://b/orders"),
        ("s3a://b/orders", "s3://b/orders/quarantine"),
        ("S3://b/orders", "s3://b/orders"),
        ("tables/orders", "tables/orders/quarantine"),
        ("tables/orders/inner", "tables/orders"),
    ],
)
def test_table_and_quarantine_must_differ(tmp_path: Path, table: str, quarantine: str) -> None:
    message = config_error(
        config_with(delta__table_uri=table, delta__quarantine_uri=quarantine), tmp_path
    )
    assert "delta.quarantine_uri and delta.table_uri must be separate locations" in message


# -- the transform ------------------------------------------------------------------------


def test_transform_that_cannot_be_imported() -> None:
    with pytest.raises(ConfigError) as info:
        load_transform("no_such_pkg_for_exactly.transforms:clean")
    message = str(info.value)
    assert message.startswith("transform: cannot import module ")
    assert "'no_such_pkg_for_exactly.transforms'" in message
    assert "No module named 'no_such_pkg_for_exactly'" in message


def test_transform_missing_function_is_named() -> None:
    with pytest.raises(ConfigError, match=r"'os\.path' has no function 'no_such_function'"):
        load_transform("os.path:no_such_function")
    with pytest.raises(ConfigError, match="'os' has no function 'sep'"):
        load_transform("os:sep")  # exists, but is not callable


def test_transform_loads_through_config(tmp_path: Path) -> None:
    config = parse_config(config_with(transform="os.path:join"), "t", tmp_path)
    assert config.load_transform() is os.path.join
    broken = parse_config(config_with(transform="no_such_module_xyz:f"), "t", tmp_path)
    with pytest.raises(ConfigError, match="'no_such_module_xyz'"):
        broken.load_transform()


@pytest.mark.parametrize(
    ("dotted", "value", "named"),
    [
        ("alerts__max_consumer_lag", -1, "greater than or equal to 0"),
        ("alerts__max_consumer_lag", "lots", "valid integer"),
        ("alerts__max_quarantine_ratio", 1.5, "less than or equal to 1"),
        ("alerts__max_quarantine_ratio", -0.1, "greater than or equal to 0"),
    ],
)
def test_bad_check_bounds_are_one_line_naming_the_field(
    dotted: str, value: Any, named: str
) -> None:
    message = config_error(config_with(**{dotted: value}))
    field = dotted.replace("__", ".")
    assert f"{field}: " in message and named in message
    assert "\n" not in message


def test_check_bounds_are_optional_and_load(tmp_path: Path) -> None:
    unset = parse_config(config_with(), "test.yaml", tmp_path)
    assert (unset.alerts.max_consumer_lag, unset.alerts.max_quarantine_ratio) == (None, None)
    bounded = parse_config(
        config_with(alerts__max_consumer_lag=5000, alerts__max_quarantine_ratio=0.01),
        "test.yaml",
        tmp_path,
    )
    assert (bounded.alerts.max_consumer_lag, bounded.alerts.max_quarantine_ratio) == (5000, 0.01)


# -- derived outputs (docs/derived-tables.md) -------------------------------------------------

COUNTS: dict[str, Any] = {
    "kind": "aggregate",
    "name": "views_per_app",
    "table_uri": "tables/views_per_app",
    "group_by": ["app"],
    "measures": [{"name": "views", "fn": "count"}],
}
LATEST: dict[str, Any] = {
    "kind": "upsert",
    "name": "users",
    "table_uri": "tables/users",
    "key": ["user"],
}


def test_derived_outputs_parse_in_order_with_their_locations_resolved(tmp_path: Path) -> None:
    config = parse_config(config_with(derived=[COUNTS, LATEST]), "test.yaml", tmp_path)
    assert [d.name for d in config.derived] == ["views_per_app", "users"]
    assert [d.kind for d in config.derived] == ["aggregate", "upsert"]
    assert config.derived[0].table_uri == str(tmp_path / "tables" / "views_per_app")
    assert config.derived[1].table_uri == str(tmp_path / "tables" / "users")


def test_a_pipeline_has_no_derived_outputs_unless_given() -> None:
    assert parse_config(config_with(), "test.yaml").derived == []


def test_two_derived_outputs_of_one_name_are_refused() -> None:
    message = config_error(config_with(derived=[COUNTS, {**LATEST, "name": "views_per_app"}]))
    assert "derived: Value error, two derived outputs are named 'views_per_app'" in message
    assert "\n" not in message


def test_a_bad_derived_output_is_named_by_its_field_without_the_kind_tag() -> None:
    bad = {**COUNTS, "measures": [{"name": "views", "fn": "median"}]}
    message = config_error(config_with(derived=[bad]))
    assert "derived.0.measures.0.fn:" in message
    assert "aggregate" not in message.split(":")[1]


@pytest.mark.parametrize(
    ("uri", "other"),
    [
        ("tables/orders", "delta.table_uri"),
        ("tables/orders/views", "delta.table_uri"),
        ("tables/orders_quarantine", "delta.quarantine_uri"),
        ("tables", "delta.table_uri"),
    ],
)
def test_a_derived_output_inside_another_table_is_refused(uri: str, other: str) -> None:
    message = config_error(config_with(derived=[{**COUNTS, "table_uri": uri}]))
    assert f"derived.views_per_app.table_uri and {other} must be separate locations" in message


def test_two_derived_outputs_in_one_location_are_refused() -> None:
    message = config_error(
        config_with(derived=[COUNTS, {**LATEST, "table_uri": "tables/views_per_app/users"}])
    )
    assert "derived.users.table_uri and derived.views_per_app.table_uri must be separate" in message


def test_a_postgres_output_loads_among_the_others_in_config_order(tmp_path: Path) -> None:
    # published by jobs/publish/delta_publisher.py in config order with the Delta outputs; it has
    # no location on storage, so none is resolved or checked for overlaps
    dashboard = {
        "kind": "postgres",
        "name": "views_dashboard",
        "url": {"env": "DASHBOARD_URL"},
        "table": "views_per_app",
        "group_by": ["app"],
        "measures": [{"name": "views", "fn": "count"}],
    }
    config = parse_config(config_with(derived=[dashboard, COUNTS]), "test.yaml", tmp_path)
    assert [d.name for d in config.derived] == ["views_dashboard", "views_per_app"]
    assert not hasattr(config.derived[0], "table_uri")
    assert config.derived[1].table_uri == str(tmp_path / "tables/views_per_app")
    # two outputs on one table of one database would share one state row
    message = config_error(config_with(derived=[dashboard, {**dashboard, "name": "again"}]))
    assert "derived output again: another postgres output keeps table views_per_app" in message


@pytest.mark.parametrize("first", ["views_per_app", "public.views_per_app"])
def test_a_postgres_table_named_with_and_without_its_schema_is_refused(first: str) -> None:
    """`views_per_app` resolves through the search_path, to `public.views_per_app` as a
    rule: the same table under two spellings would take every batch twice."""
    dashboard = {
        "kind": "postgres",
        "name": "views_dashboard",
        "url": "postgresql://exactly@db.example/dash",
        "table": first,
        "group_by": ["app"],
        "measures": [{"name": "views", "fn": "count"}],
    }
    other = "views_per_app" if "." in first else "public.views_per_app"
    message = config_error(
        config_with(derived=[dashboard, {**dashboard, "name": "again", "table": other}])
    )
    assert (
        f"derived output again: table {other} may be table {first} of output views_dashboard"
        in message
    )
    assert "name both with their schema" in message
    # two schemas, both named: two tables
    apart = [{**dashboard, "table": "analytics.views"}, {**dashboard, "name": "again",
             "table": "reporting.views"}]  # fmt: skip
    assert len(parse_config(config_with(derived=apart), "t", None).derived) == 2


@pytest.mark.parametrize(
    ("ledger", "table"),
    [
        ("sqlite:///tables/orders/ledger.db", "delta.table_uri"),
        ("sqlite:///tables/orders_quarantine/state/ledger.db", "delta.quarantine_uri"),
        ("sqlite:///tables/views/ledger.db?timeout=5", "derived.views_per_app.table_uri"),
    ],
)
def test_a_sqlite_ledger_inside_a_table_is_refused(tmp_path: Path, ledger: str, table: str) -> None:
    """A Delta VACUUM (delta-spark's, any Delta tool's) deletes the files under a table that
    its log does not name: a ledger kept there would be lost with its votes."""
    data = config_with(
        ledger__url=ledger,
        delta__table_uri="tables/orders",
        delta__quarantine_uri="tables/orders_quarantine",
        derived=[{**COUNTS, "table_uri": "tables/views"}],
    )
    message = config_error(data, tmp_path)
    assert f"ledger.url's file {tmp_path.resolve()}/tables/" in message
    assert f"is inside {table}" in message
    assert "\n" not in message


def test_a_sqlite_ledger_beside_the_tables_is_taken(tmp_path: Path) -> None:
    data = config_with(
        ledger__url="sqlite:///tables/ledger.db",
        delta__table_uri="tables/orders",
        delta__quarantine_uri="tables/orders_quarantine",
    )
    config = parse_config(data, "test.yaml", tmp_path)
    assert config.ledger.url == f"sqlite:///{tmp_path.resolve()}/tables/ledger.db"
