"""The asset checks of a pipeline writing a date-partitioned table and a partitioned
aggregate (real broker, Spark, Delta): they pass on what exactly wrote, and fail once a
whole partition is deleted outside exactly (delta-spark DELETE by partition)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from jobs.wiring.pipeline import Pipeline, last_committed
from ledger.core.layout import QUARANTINE, TABLE
from orchestration.health.derived_checks import derived_verdicts
from orchestration.health.table_checks import judge_rows
from resources.config.loading import load_config
from tests.fixtures.partitioned import produce, run_until_caught_up
from tests.fixtures.pipeline import config_path


def verdicts(config: Any, spark: Any) -> list[Any]:
    """The last-batch-complete and derived checks' verdicts, as the checks sensor gives them."""
    logged: list[str] = []
    with Pipeline(config, spark_factory=lambda: spark) as pipeline:
        batch = last_committed(pipeline)
        assert batch is not None
        rows = [pipeline.publisher.rows_held(batch, t) for t in (TABLE, QUARANTINE)]
        found = [
            judge_rows(config.pipeline, batch, *rows),
            *derived_verdicts(pipeline, logged.append),
        ]
    assert not logged, logged
    return found


def test_the_checks_pass_on_partitions_and_fail_once_one_is_deleted_outside_exactly(
    spark: Any, kafka_client: Any, partitioned_factory: Any, tmp_path: Path
) -> None:
    config = partitioned_factory(1)
    path = config_path(config)
    doc = yaml.safe_load(path.read_text())
    doc["derived"] = [
        {
            "kind": "aggregate",
            "name": "per_hour",
            "table_uri": f"{tmp_path}/per_hour",
            "group_by": ["app"],
            "window": {"column": "ts", "size": "1 hour"},
            "measures": [{"name": "views", "fn": "count"}],
            "partition_by": [
                {"name": "window_date", "date_of": "window_start", "time_zone": "Europe/Paris"}
            ],
        }
    ]
    path.write_text(yaml.safe_dump(doc))
    config = load_config(path)
    object.__setattr__(config, "_path", path)
    produce(kafka_client, config, 40)
    run_until_caught_up(config, spark)
    before = verdicts(config, spark)
    assert len(before) == 2 and all(v.passed for v in before), before

    uri = config.delta.table_uri
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE event_date = DATE'2026-03-02'").collect()

    after = verdicts(config, spark)
    assert [v.passed for v in after] == [False, False], after
