"""A crash at the protocol's crash points of a pipeline that writes a date-partitioned table
with an aggregate partitioned by its window's date: the next start finishes or abandons the
batch, and every row is once in its day's partition, the aggregate equal to its recount
(with the ledger kept, and lost then rebuilt from the logs). Real `exactly run` children
killed at each point, the real broker, Spark and Delta."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from deltalake import DeltaTable

from jobs.derived.invariants import aggregate_differences, recompute_aggregate
from resources.config.loading import load_config
from tests.fixtures.partitioned import check_partitions, paris_day, produce, run_until_caught_up
from tests.fixtures.pipeline import assert_exactly_once, config_path, crash_run

HOURLY = {
    "kind": "aggregate",
    "name": "views_per_hour",
    "group_by": ["app"],
    "window": {"column": "ts", "size": "1 hour"},
    "measures": [{"name": "views", "fn": "count"}],
    "partition_by": [
        {"name": "window_date", "date_of": "window_start", "time_zone": "Europe/Paris"}
    ],
}


@pytest.mark.parametrize(
    ("point", "lose_ledger"),
    # `make test`: before the vote, between the derived outputs' commits, and between the
    # two tables' commits with the ledger lost (each ledger once); `make test-wide` the rest
    # (their points are tests/test_crash.py's in `make test` on an unpartitioned table)
    [
        ("during_stage", False),
        pytest.param("after_prepare", False, marks=pytest.mark.wide),
        ("between_derived_commits", False),
        pytest.param("between_table_commits", False, marks=pytest.mark.wide),
        ("between_table_commits", True),
        pytest.param("after_delta_commit", True, marks=pytest.mark.wide),
    ],
)
def test_a_crash_leaves_each_row_once_in_its_partition_and_the_aggregate_right(
    spark: Any,
    kafka_client: Any,
    partitioned_factory: Any,
    tmp_path: Path,
    point: str,
    lose_ledger: bool,
) -> None:
    config = partitioned_factory(2, max_records=25)
    path = config_path(config)
    doc = yaml.safe_load(path.read_text())
    doc["derived"] = [{**HOURLY, "table_uri": str(tmp_path / "views_per_hour")}]
    path.write_text(yaml.safe_dump(doc))
    config = load_config(path)
    object.__setattr__(config, "_path", path)
    instants = produce(kafka_client, config, 30)
    run_until_caught_up(config, spark)
    instants.update(produce(kafka_client, config, 30, first=30))

    crash_run(config, point)
    if lose_ledger:
        Path(config.ledger.url.removeprefix("sqlite:///")).unlink()
    run_until_caught_up(config, spark)

    assert assert_exactly_once(config, kafka_client)[0] == len(instants)
    check_partitions(config.delta.table_uri, instants)
    spec = config.derived[0]
    held = DeltaTable(spec.table_uri).to_pyarrow_table()
    raw = DeltaTable(config.delta.table_uri).to_pyarrow_table()
    assert aggregate_differences(recompute_aggregate(raw, spec), held, spec) == []
    for row in held.to_pylist():
        assert row["window_date"] == paris_day(row["window_start"]), row
