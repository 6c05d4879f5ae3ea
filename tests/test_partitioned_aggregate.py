"""An aggregate with a window, partitioned by its window's date in a declared time zone
(`partition_by` of a derived aggregate output): config validation, and a pipeline against
the real broker, Spark and Delta whose aggregate table is partitioned that way."""

from __future__ import annotations

import copy
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable

from jobs.derived.invariants import aggregate_differences, recompute_aggregate
from ledger.core.errors import ConfigError
from resources.config.loading import load_config, parse_config
from tests.fixtures.partitioned import paris_day, produce, run_until_caught_up
from tests.fixtures.pipeline import config_path

WINDOW_DATE = [{"name": "window_date", "date_of": "window_start", "time_zone": "Europe/Paris"}]


def hourly(root: str, partition_by: Any = None) -> dict[str, Any]:
    output: dict[str, Any] = {
        "kind": "aggregate",
        "name": "views_per_hour",
        "table_uri": f"{root}/views_per_hour",
        "group_by": ["app"],
        "window": {"column": "ts", "size": "1 hour"},
        "measures": [{"name": "views", "fn": "count"}],
    }
    if partition_by is not None:
        output["partition_by"] = partition_by
    return output


BASE: dict[str, Any] = {
    "pipeline": "orders",
    "kafka": {"bootstrap_servers": "broker:9092", "topic": "orders"},
    "delta": {"table_uri": "/t/orders", "quarantine_uri": "/t/orders_quarantine"},
}


def error_of(output: dict[str, Any]) -> str:
    data = copy.deepcopy(BASE)
    data["derived"] = [output]
    with pytest.raises(ConfigError) as info:
        parse_config(data, "test.yaml")
    assert "\n" not in str(info.value)
    return str(info.value)


def test_an_aggregate_partitioned_by_its_window_date_loads() -> None:
    data = copy.deepcopy(BASE)
    data["derived"] = [hourly("/t", WINDOW_DATE)]
    (output,) = parse_config(data).derived
    assert [c.name for c in output.partition_by] == ["window_date"]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"partition_by": [{"name": "d", "date_of": "ts"}]}, "date_of must be window_start"),
        ({"window": None, "partition_by": WINDOW_DATE}, "needs a window"),
        (
            {"partition_by": [{"name": "app", "date_of": "window_start"}]},
            "column app appears twice",
        ),
        (
            {"partition_by": [{"name": "d", "date_of": "window_start", "time_zone": "Mars/X"}]},
            "derived.0.partition_by.0.time_zone",
        ),
    ],
)
def test_a_bad_aggregate_partition_is_one_line_naming_the_field(
    change: dict[str, Any], named: str
) -> None:
    output = {**hourly("/t"), **change}
    output = {k: v for k, v in output.items() if v is not None}
    message = error_of(output)
    assert named in message and "derived.0" in message, message


def test_an_hourly_aggregate_is_partitioned_by_its_windows_paris_day(
    spark: Any, kafka_client: Any, partitioned_factory: Any, tmp_path: Path
) -> None:
    config = partitioned_factory(2, max_records=30)
    path = config_path(config)
    doc = yaml.safe_load(path.read_text())
    doc["derived"] = [hourly(str(tmp_path), WINDOW_DATE)]
    path.write_text(yaml.safe_dump(doc))
    config = load_config(path)
    object.__setattr__(config, "_path", path)
    instants = produce(kafka_client, config, 90)
    run_until_caught_up(config, spark)

    uri = config.derived[0].table_uri
    table = DeltaTable(uri)
    assert table.metadata().partition_columns == ["window_date"]
    for add in pa.table(table.get_add_actions(flatten=True)).to_pylist():
        value = add["partition.window_date"]
        rows = pa.parquet.read_table(Path(uri) / add["path"], columns=["window_start"])
        for start in rows.column("window_start").to_pylist():
            assert paris_day(start) == value, (start, add["path"])
    # the aggregate is what a recount over the raw table gives
    raw = DeltaTable(config.delta.table_uri).to_pyarrow_table()
    held = table.to_pyarrow_table()
    assert (
        aggregate_differences(recompute_aggregate(raw, config.derived[0]), held, config.derived[0])
        == []
    )
    assert sum(held.column("views").to_pylist()) == len(instants)
    # the 23:00 UTC window of March 1st is March 2nd in Paris: in that partition, for
    # delta-spark too (which hands back naive UTC times: the session is in UTC)
    frame = spark.read.format("delta").load(uri)
    edge = frame.where("window_date = DATE'2026-03-02'").select("window_start").collect()
    starts = {r["window_start"].replace(tzinfo=UTC) for r in edge}
    assert datetime(2026, 3, 1, 23, 0, tzinfo=UTC) in starts
    assert {paris_day(s) for s in starts} == {date(2026, 3, 2)}
    assert frame.count() == held.num_rows


def test_a_derived_output_of_a_partitioned_pipeline_sees_each_rows_partition_value(
    spark: Any, kafka_client: Any, partitioned_factory: Any, tmp_path: Path
) -> None:
    """The partials are computed from the table's staged files, which do not hold the
    partition column (its folder does): a latest-per-key output keeps whole rows, so it
    must get the value, not a null."""
    config = partitioned_factory(2, max_records=30)
    path = config_path(config)
    doc = yaml.safe_load(path.read_text())
    latest = {"kind": "upsert", "name": "latest", "table_uri": f"{tmp_path}/latest"}
    doc["derived"] = [{**latest, "key": ["event_id"]}]
    path.write_text(yaml.safe_dump(doc))
    config = load_config(path)
    object.__setattr__(config, "_path", path)
    instants = produce(kafka_client, config, 40)
    run_until_caught_up(config, spark)

    rows = DeltaTable(config.derived[0].table_uri).to_pyarrow_table(
        columns=["event_id", "event_date"]
    )
    held = zip(rows["event_id"].to_pylist(), rows["event_date"].to_pylist(), strict=True)
    assert sorted(held) == sorted((e, paris_day(t)) for e, t in instants.items())


def test_a_partitioned_aggregate_added_later_is_rebuilt_partitioned_then_kept(
    spark: Any, kafka_client: Any, partitioned_factory: Any, tmp_path: Path
) -> None:
    """`exactly derived rebuild` writes the output from the raw table: partitioned by the
    window's date like the MERGEs after it, or the next batch's MERGE meets another layout."""
    import subprocess
    import sys

    config = partitioned_factory(2, max_records=30)
    instants = produce(kafka_client, config, 40)
    run_until_caught_up(config, spark)
    path = config_path(config)
    doc = yaml.safe_load(path.read_text())
    doc["derived"] = [hourly(str(tmp_path), WINDOW_DATE)]
    path.write_text(yaml.safe_dump(doc))
    config = load_config(path)
    object.__setattr__(config, "_path", path)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "exactly_cli"),
            "derived",
            "rebuild",
            "-c",
            str(path),
            "views_per_hour",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    instants.update(produce(kafka_client, config, 30, first=40))
    run_until_caught_up(config, spark)

    spec = config.derived[0]
    table = DeltaTable(spec.table_uri)
    assert table.metadata().partition_columns == ["window_date"]
    held = table.to_pyarrow_table()
    for row in held.to_pylist():
        assert row["window_date"] == paris_day(row["window_start"]), row
    raw = DeltaTable(config.delta.table_uri).to_pyarrow_table()
    assert aggregate_differences(recompute_aggregate(raw, spec), held, spec) == []
    assert sum(held.column("views").to_pylist()) == len(instants)
