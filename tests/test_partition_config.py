"""`delta.partition_by`: partition columns generated from a timestamp, validated with one line
naming the field (resources/config/partitioning.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from ledger.core.errors import ConfigError
from resources.config.loading import parse_config
from resources.config.partitioning import PartitionColumn, generation_expression, partition_values

MINIMAL: dict[str, Any] = {
    "pipeline": "orders",
    "kafka": {"bootstrap_servers": "broker:9092", "topic": "orders"},
    "delta": {"table_uri": "/t/orders", "quarantine_uri": "/t/orders_quarantine"},
}


def with_partitions(partition_by: Any) -> dict[str, Any]:
    data = copy.deepcopy(MINIMAL)
    data["delta"]["partition_by"] = partition_by
    return data


def error_of(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "test.yaml")
    message = str(info.value)
    assert "\n" not in message
    return message


def test_a_table_is_unpartitioned_unless_given() -> None:
    assert parse_config(copy.deepcopy(MINIMAL)).delta.partition_by == []


def test_a_date_partition_loads_with_its_time_zone() -> None:
    config = parse_config(
        with_partitions([{"name": "event_date", "date_of": "ts", "time_zone": "Europe/Paris"}])
    )
    (column,) = config.delta.partition_by
    assert (column.name, column.date_of, column.time_zone) == ("event_date", "ts", "Europe/Paris")
    kafka = parse_config(with_partitions([{"name": "day", "date_of": "_kafka_timestamp"}]))
    assert kafka.delta.partition_by[0].time_zone == "UTC"


@pytest.mark.parametrize(
    ("partition_by", "named"),
    [
        (
            [{"name": "d", "date_of": "ts", "time_zone": "Europe/Pariss"}],
            "partition_by.0.time_zone",
        ),
        ([{"name": "d", "date_of": "ts", "tz": "UTC"}], "partition_by.0.tz: unknown key"),
        ([{"name": "d"}], "partition_by.0.date_of: required key is missing"),
        ([{"name": "event date", "date_of": "ts"}], "partition_by.0.name"),
        # a folder named `_d=...` is hidden: the stage's listing would leave its files out
        ([{"name": "_d", "date_of": "ts"}], "partition_by.0.name"),
        ([{"name": "exactly_output", "date_of": "ts"}], "partition_by.0.name"),
        ([{"name": "d", "date_of": "ts; DROP"}], "partition_by.0.date_of"),
        ([{"name": "d", "date_of": "d"}], "partition_by.0"),
        (
            [{"name": "d", "date_of": "ts"}, {"name": "D", "date_of": "ts"}],
            "two partition columns are named 'D'",
        ),
        ("event_date", "delta.partition_by"),
    ],
)
def test_a_bad_partition_column_is_one_line_naming_the_field(partition_by: Any, named: str) -> None:
    message = error_of(with_partitions(partition_by))
    assert named in message, message


def test_the_generation_expression_is_the_declared_zones_date_whatever_the_session() -> None:
    column = PartitionColumn(name="event_date", date_of="ts", time_zone="Europe/Paris")
    expression = generation_expression(column)
    assert "`ts`" in expression and "'Europe/Paris'" in expression
    # no cast of a timestamp to a date: that would take the session's time zone
    assert "AS DATE" not in expression.upper()


def test_partition_values_come_from_the_files_hive_folders() -> None:
    path = "staged/app/batch-1/exactly_output=table/event_date=2026-03-01/part-0.parquet"
    assert partition_values(path, ["event_date"]) == {"event_date": "2026-03-01"}
    null = "staged/app/b/exactly_output=table/event_date=__HIVE_DEFAULT_PARTITION__/p.parquet"
    assert partition_values(null, ["event_date"]) == {"event_date": None}
    assert partition_values("staged/app/b/p.parquet", []) == {}


def test_a_file_outside_its_partition_folder_is_refused() -> None:
    from ledger.core.errors import InconsistencyError

    with pytest.raises(InconsistencyError, match="event_date"):
        partition_values("staged/app/b/exactly_output=table/p.parquet", ["event_date"])


@pytest.mark.parametrize(
    ("path", "columns"),
    [
        # staged partitioned, the table not (a config changed between the vote and the
        # first commit): its files do not hold the column, so its rows would read null
        ("staged/app/b/exactly_output=table/event_date=2026-03-01/p.parquet", []),
        # a folder for a column the table is not partitioned by
        (
            "staged/app/b/exactly_output=table/day=2026-03-01/event_date=2026-03-01/p.parquet",
            ["event_date"],
        ),
    ],
)
def test_a_file_staged_for_another_layout_is_refused(path: str, columns: list[str]) -> None:
    from ledger.core.errors import InconsistencyError

    with pytest.raises(InconsistencyError, match="another layout"):
        partition_values(path, columns)
