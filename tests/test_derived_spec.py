"""resources/config/derived_spec.py: derived output specs, validated with one-line errors naming
the field, and
which outputs a replace backfill can keep right."""

from __future__ import annotations

from typing import Any

import pytest

from ledger.core.errors import ConfigError
from resources.config.derived_spec import (
    AggregateOutput,
    PostgresOutput,
    UpsertOutput,
    parse_output,
    replace_refusal,
)

AGGREGATE: dict[str, Any] = {
    "kind": "aggregate",
    "name": "views_per_app",
    "table_uri": "tables/views_per_app",
    "group_by": ["app"],
    "measures": [
        {"name": "views", "fn": "count"},
        {"name": "bytes", "fn": "sum", "column": "size"},
    ],
}
POSTGRES: dict[str, Any] = {
    "kind": "postgres",
    "name": "views_dashboard",
    "url": {"env": "DASHBOARD_DB_URL"},
    "table": "dash.views_per_app",
    "group_by": ["app"],
    "measures": [
        {"name": "views", "fn": "count"},
        {"name": "bytes", "fn": "sum", "column": "size"},
    ],
}
UPSERT: dict[str, Any] = {
    "kind": "upsert",
    "name": "users",
    "table_uri": "tables/users",
    "key": ["user"],
}


def refused(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_output(data)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_an_aggregate_and_an_upsert_parse() -> None:
    aggregate = parse_output({**AGGREGATE, "window": {"column": "ts", "size": " 1 minute "}})
    assert isinstance(aggregate, AggregateOutput)
    assert aggregate.window is not None and aggregate.window.size == "1 minute"
    assert aggregate.key_columns == ["app", "window_start", "window_end"]
    upsert = parse_output(UPSERT)
    assert isinstance(upsert, UpsertOutput)
    assert upsert.key_columns == ["user"]
    assert upsert.app_id("pageviews") == "pageviews.derived.users"
    assert upsert.app_id("pageviews.backfill") == "pageviews.backfill.derived.users"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"kind": "rollup"}, "derived.kind: Input tag 'rollup' found using 'kind'"),
        ({"colour": "red"}, "derived.colour: unknown key"),
        ({"table_uri": None}, "derived.table_uri: required key is missing"),
        ({"group_by": []}, "derived.group_by: List should have at least 1 item"),
        ({"name": "no spaces"}, "derived.name: must be letters, digits"),
        ({"group_by": ["app; drop"]}, "derived.group_by: 'app; drop' is not a plain column"),
        (
            {"measures": [{"name": "n", "fn": "count", "column": "x"}]},
            "derived.measures.0: measure n: count counts rows, give it no column",
        ),
        (
            {"measures": [{"name": "s", "fn": "sum"}]},
            "derived.measures.0: measure s: sum needs a column",
        ),
        (
            {"measures": [{"name": "m", "fn": "avg", "column": "x"}]},
            "derived.measures.0.fn: Input should be 'count', 'sum', 'min' or 'max'",
        ),
        (
            {"measures": [{"name": "App", "fn": "count"}]},
            "column App appears twice in the output",
        ),
        (
            {"window": {"column": "ts", "size": "1 fortnight"}},
            "derived.window.size: '1 fortnight' is not a duration",
        ),
        (
            {
                "window": {"column": "ts", "size": "1 minute"},
                "measures": [{"name": "window_start", "fn": "count"}],
            },
            "column window_start appears twice",
        ),
    ],
)
def test_a_bad_aggregate_is_named_in_one_line(change: dict[str, Any], expected: str) -> None:
    data = {**AGGREGATE, **change}
    data = {k: v for k, v in data.items() if v is not None}
    message = refused(data)
    assert message.startswith("invalid derived output: ")
    assert expected in message


def test_a_bad_upsert_is_named_in_one_line() -> None:
    assert "derived.key: a key column appears twice" in refused({**UPSERT, "key": ["u", "u"]})
    assert "derived.key: List should have at least 1 item" in refused({**UPSERT, "key": []})
    assert "derived.group_by: unknown key" in refused({**UPSERT, "group_by": ["u"]})
    without_kind = {k: v for k, v in UPSERT.items() if k != "kind"}
    assert "derived.kind: Unable to extract tag" in refused(without_kind)


def test_replace_is_refused_for_min_and_max_and_without_a_count() -> None:
    assert replace_refusal(parse_output(AGGREGATE)) is None
    assert replace_refusal(parse_output(UPSERT)) is None
    lossy = parse_output(
        {
            **AGGREGATE,
            "measures": [*AGGREGATE["measures"], {"name": "first", "fn": "min", "column": "ts"}],
        }
    )
    reason = replace_refusal(lossy)
    assert reason is not None
    assert "views_per_app" in reason and "first" in reason
    assert "min and max cannot be subtracted" in reason
    sums_only = parse_output({**AGGREGATE, "measures": AGGREGATE["measures"][1:]})
    reason = replace_refusal(sums_only)
    assert reason is not None
    assert "views_per_app" in reason and "without a count measure" in reason


def test_a_postgres_output_parses_with_the_aggregates_measures() -> None:
    spec = parse_output({**POSTGRES, "window": {"column": "ts", "size": "1 hour"}})
    assert isinstance(spec, PostgresOutput)
    assert spec.key_columns == ["app", "window_start", "window_end"]
    assert spec.app_id("pageviews") == "pageviews.derived.views_dashboard"
    plain = parse_output({**POSTGRES, "url": "postgresql+psycopg://dash@db:5432/metrics"})
    assert isinstance(plain, PostgresOutput)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"url": "postgresql://dash:s3cret@db/metrics"},
            "derived.url: holds a password: give the URL as {env: NAME}",
        ),
        ({"url": "sqlite:///x.db"}, "derived.url: is a sqlite URL, not a postgresql one"),
        ({"url": "not a url"}, "derived.url: is not a database URL"),
        ({"table": "a.b.c"}, "derived.table: 'a.b.c' is not a plain table name"),
        ({"table_uri": "tables/x"}, "derived.table_uri: unknown key"),
        (
            {"group_by": ["k" * 64]},
            f"column {'k' * 64} is longer than PostgreSQL's 63 characters",
        ),
        ({"measures": [{"name": "App", "fn": "count"}]}, "column App appears twice"),
    ],
)
def test_a_bad_postgres_output_is_named_in_one_line(change: dict[str, Any], expected: str) -> None:
    message = refused({**POSTGRES, **change})
    assert expected in message
    assert "s3cret" not in message


def test_replace_is_refused_for_every_postgres_output() -> None:
    reason = replace_refusal(parse_output(POSTGRES))
    assert reason is not None
    assert "views_dashboard" in reason and "dash.views_per_app" in reason
    lossy = parse_output({**POSTGRES, "measures": [{"name": "last", "fn": "max", "column": "ts"}]})
    assert "min and max cannot be subtracted" in (replace_refusal(lossy) or "")
