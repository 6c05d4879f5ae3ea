"""pandas transforms (jobs/stage/pandas_transform.py): the example's logic on its own, then both
example transforms against the real broker, Spark and Delta, and contract breaches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from deltalake import DeltaTable

from jobs.examples.pageviews_pandas import parse
from jobs.examples.sample_data import MALFORMED, pageviews
from jobs.stage.pandas_transform import column_names, pandas_transform
from jobs.wiring.pipeline import build
from ledger.core.errors import RefusedBatchError
from ledger.core.protocol import BatchState
from ledger.store.ledger_store import LedgerStore
from resources.config.pipeline_config import PipelineConfig
from tests.fixtures.pipeline import assert_exactly_once


def test_column_names_of_a_ddl_list_with_nested_types() -> None:
    ddl = "a string, `b c` map<string, int>, d struct<x: int, y: array<string>>, e decimal(10, 2)"
    assert column_names(ddl) == ["a", "b c", "d", "e"]


def test_a_transform_may_not_declare_the_contract_columns() -> None:
    with pytest.raises(ValueError, match=r"\['_error'\]"):
        pandas_transform("app string, _error string")


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (None, "record has no value"),
        (MALFORMED[0], "value is not a JSON object"),
        (MALFORMED[1], "missing field: app"),
        (MALFORMED[2], "value is not valid JSON"),
        (b"[1, 2]", "value is not a JSON object"),
        (b'{"app": "web", "ts": "2026-01-01T00:00:01Z"}', None),
    ],
)
def test_the_example_gives_each_record_the_spark_transforms_error(
    value: bytes | None, error: str | None
) -> None:
    assert parse(value)[1] == error


def _variant(config: PipelineConfig, root: Path, transform: str, name: str) -> PipelineConfig:
    """The same topic through another transform, into tables and a ledger of its own."""
    delta = config.delta.model_copy(
        update={"table_uri": str(root / "table"), "quarantine_uri": str(root / "quarantine")}
    )
    ledger = config.ledger.model_copy(update={"url": f"sqlite:///{root / 'ledger.db'}"})
    return config.model_copy(
        update={"pipeline": name, "transform": transform, "delta": delta, "ledger": ledger}
    )


def _rows(uri: str) -> pd.DataFrame:
    frame = DeltaTable(uri).to_pandas()
    return frame.sort_values(["_kafka_partition", "_kafka_offset"]).reset_index(drop=True)


def test_the_pandas_example_lands_exactly_what_the_spark_example_lands(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    with_spark = pipeline_factory(3, max_records=150)
    kafka_client.produce(with_spark.kafka.topic, pageviews(600, malformed_every=37))
    with_pandas = _variant(
        with_spark, tmp_path / "pandas", "jobs.examples.pageviews_pandas:transform", "pv_pandas"
    )
    for config in (with_spark, with_pandas):
        tpc = build(config, spark_factory=lambda: spark)
        while tpc.run_batch() is not None:
            pass
        assert assert_exactly_once(config, kafka_client) == (584, 16)

    table, table_pd = _rows(with_spark.delta.table_uri), _rows(with_pandas.delta.table_uri)
    assert list(table_pd.columns) == list(table.columns)
    pd.testing.assert_frame_equal(table_pd, table)
    quarantine = _rows(with_spark.delta.quarantine_uri)
    pd.testing.assert_frame_equal(_rows(with_pandas.delta.quarantine_uri), quarantine)
    assert set(quarantine["_error"]) == {
        "value is not a JSON object",
        "missing field: app",
        "value is not valid JSON",
    }


@pytest.mark.parametrize(
    ("transform", "refused"),
    [
        ("tests.pandas_transforms:drops_errors", RefusedBatchError),
        ("tests.pandas_transforms:forgets_error_column", Exception),
    ],
)
def test_a_pandas_transform_that_breaks_the_contract_commits_nothing(
    spark: Any,
    kafka_client: Any,
    pipeline_factory: Any,
    tmp_path: Path,
    transform: str,
    refused: type[Exception],
) -> None:
    base = pipeline_factory(2)
    kafka_client.produce(base.kafka.topic, pageviews(200, malformed_every=20))
    config = _variant(base, tmp_path / "bad", transform, "pv_bad")
    with pytest.raises(refused) as raised:
        build(config, spark_factory=lambda: spark).run_batch()
    if transform.endswith("forgets_error_column"):
        assert "returned no column(s) ['_error']" in str(raised.value)
    assert not DeltaTable.is_deltatable(config.delta.table_uri)
    batches = LedgerStore(config.ledger.url).batches(pipeline=config.pipeline, limit=10)
    assert [b.state for b in batches] != [BatchState.ACKED]
    assert all(b.state not in (BatchState.COMMITTED, BatchState.ACKED) for b in batches)
