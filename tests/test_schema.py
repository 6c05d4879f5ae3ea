"""Schema changes (invariant 14): an additive change is committed with the batch that brings
it, in the same Delta commit; an incompatible one fails before the vote and commits nothing.

The pipeline tests stage with real Spark and read back through delta-rs and delta-spark; the
publisher tests build real delta-rs tables from Parquet files written here.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from jobs.examples.sample_data import pageviews
from jobs.publish.delta_publisher import DeltaPublisher
from jobs.stage import parquet_files
from jobs.wiring.pipeline import build
from ledger.core.errors import InconsistencyError
from ledger.core.protocol import BatchState, OffsetRange
from ledger.store.ledger_store import LedgerStore
from resources.delta.schema import encode_schema
from resources.delta.table import DeltaTarget
from tests.fixtures.pipeline import assert_exactly_once, save_config
from tests.test_backfill import cli

NORMAL = "jobs.examples.pageviews:transform"
ADDS_A_COLUMN = "tests.transforms:pageviews_with_referrer"
CHANGES_A_TYPE = "tests.transforms:pageviews_ts_as_string"


def _run(config: Any, transform: str, spark: Any) -> Any:
    """One batch of `config`'s pipeline with `transform`, after recovery."""
    tpc = build(config.model_copy(update={"transform": transform}), spark_factory=lambda: spark)
    tpc.recover_and_commit()
    return tpc, tpc.run_batch()


def _log_actions(table_uri: str, version: int) -> list[str]:
    """The kinds of action in one Delta commit file, in order (commitInfo, metaData, add...)."""
    path = Path(table_uri, "_delta_log", f"{version:020d}.json")
    return [next(iter(json.loads(line))) for line in path.read_text().splitlines() if line]


def _referrers_by_offset(rows: list[dict[str, Any]]) -> dict[int, Any]:
    return {r["_kafka_offset"]: r["referrer"] for r in rows}


def test_an_added_column_is_committed_with_its_batch_and_old_rows_read_null(
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    config = pipeline_factory(1)
    topic, uri = config.kafka.topic, config.delta.table_uri
    kafka_client.produce(topic, pageviews(20, malformed_every=7), partition=0)
    _run(config, NORMAL, spark)
    before = DeltaTable(uri).version()

    kafka_client.produce(topic, pageviews(20, start=20, malformed_every=7), partition=0)
    _, report = _run(config, ADDS_A_COLUMN, spark)
    assert report.batch.state is BatchState.ACKED

    table = DeltaTable(uri)
    # one commit holds the new schema, the batch's files and its app transaction
    assert table.version() == before + 1
    actions = _log_actions(uri, before + 1)
    assert "metaData" in actions and "add" in actions and "txn" in actions, actions
    field = next((f for f in table.schema().fields if f.name == "referrer"), None)
    assert field is not None, f"referrer is not in the table's schema: {table.schema()}"
    assert field.nullable and field.type.type == "string"

    good_old = [o for o in range(20) if o % 7 != 6]
    good_new = [o for o in range(20, 40) if o % 7 != 6]
    via_rs = _referrers_by_offset(
        table.to_pyarrow_table(columns=["_kafka_offset", "referrer", "app"]).to_pylist()
    )
    assert sorted(via_rs) == good_old + good_new
    assert all(via_rs[o] is None for o in good_old)
    assert all(via_rs[o] is not None and via_rs[o].startswith("ref-") for o in good_new)
    rows = spark.read.format("delta").load(uri).select("_kafka_offset", "referrer").collect()
    assert _referrers_by_offset([r.asDict() for r in rows]) == via_rs
    assert_exactly_once(config, kafka_client)


def test_a_changed_column_type_fails_before_the_vote_and_commits_nothing(
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    config = pipeline_factory(1)
    topic, uri = config.kafka.topic, config.delta.table_uri
    kafka_client.produce(topic, pageviews(20, malformed_every=7), partition=0)
    _run(config, NORMAL, spark)
    versions = (DeltaTable(uri).version(), DeltaTable(config.delta.quarantine_uri).version())
    rows_before = DeltaTable(uri).to_pyarrow_table().num_rows

    kafka_client.produce(topic, pageviews(20, start=20), partition=0)
    # as an operator sees it: `exactly run` (staging on the worker's shared Spark server)
    changed = config.model_copy(update={"transform": CHANGES_A_TYPE})
    path = save_config(changed, Path(uri).parent / "changes-a-type.yaml")
    result = cli("run", "-c", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    (message,) = result.stderr.strip().splitlines()
    assert message.startswith("exactly: error: "), message
    assert "column ts" in message and "timestamp" in message and "string" in message, message
    assert "invariant 14" in message, message
    # said once: not also as the log's line about the abandoned batch on stdout
    said = message.removeprefix("exactly: error: ")
    assert (result.stdout + result.stderr).count(said) == 1, result.stdout

    # nothing committed, nothing voted: the batch is abandoned with the error
    assert (DeltaTable(uri).version(), DeltaTable(config.delta.quarantine_uri).version()) == (
        versions
    )
    store = LedgerStore(config.ledger.url)
    refused = max(store.batches(app_id=config.app_id), key=lambda b: b.batch_id)
    assert refused.state is BatchState.ABORTED
    assert refused.prepared_at is None and not store.files(config.app_id, refused.batch_id)
    assert refused.error is not None and "column ts" in refused.error

    # the table still reads, through both readers, as it was
    assert DeltaTable(uri).to_pyarrow_table().num_rows == rows_before
    assert spark.read.format("delta").load(uri).count() == rows_before

    # the refused range is planned again; the fixed transform takes it
    _, report = _run(config, NORMAL, spark)
    assert report.batch.state is BatchState.ACKED
    table_rows, quarantined = assert_exactly_once(config, kafka_client)
    assert table_rows + quarantined == 40


# -- the publisher against real delta-rs tables (no Spark) ---------------------------------

BASE = pa.schema(
    [
        pa.field("event_id", pa.string()),
        pa.field("_kafka_topic", pa.string()),
        pa.field("_kafka_partition", pa.int32()),
        pa.field("_kafka_offset", pa.int64()),
        pa.field("_batch_id", pa.int64(), nullable=False),
    ]
)
QUARANTINE = pa.schema(
    [
        pa.field("_kafka_topic", pa.string()),
        pa.field("_kafka_partition", pa.int32()),
        pa.field("_kafka_offset", pa.int64()),
        pa.field("_error", pa.string()),
    ]
)


def _stage(root: Path, folder: str, data: pa.Table, target: str) -> list[Any]:
    """Write `data` as one staged Parquet file under `root` and describe it for the vote."""
    staged = root / "staged" / folder
    staged.mkdir(parents=True)
    pq.write_table(data, staged / "part-00000.parquet")
    return parquet_files.describe(str(staged), str(root), target)


def _rows(schema: pa.Schema, offsets: range, batch_id: int, **extra: list[Any]) -> pa.Table:
    columns: dict[str, list[Any]] = {
        "event_id": [f"ev-{o}" for o in offsets],
        "_kafka_topic": ["t" for _ in offsets],
        "_kafka_partition": [0 for _ in offsets],
        "_kafka_offset": list(offsets),
        "_batch_id": [batch_id for _ in offsets],
        "_error": ["bad" for _ in offsets],
        **extra,
    }
    return pa.table({f.name: columns[f.name] for f in schema}, schema=schema)


def _publish(target: DeltaTarget, root: Path, batch_id: int, data: pa.Table) -> Any:
    files = _stage(root, f"batch-{batch_id}", data, "table")
    return target.publish(
        app_id="app",
        batch_id=batch_id,
        files=files,
        schema=data.schema,
        metadata={"app_id": "app", "batch_id": batch_id},
    )


def test_the_widened_schema_is_in_the_same_delta_commit_as_the_files(tmp_path: Path) -> None:
    root = tmp_path / "table"
    target = DeltaTarget(str(root))
    _publish(target, root, 1, _rows(BASE, range(0, 3), 1))
    before = DeltaTable(str(root)).version()
    identity = DeltaTable(str(root)).metadata().id
    wider = BASE.append(pa.field("referrer", pa.string()))
    outcome = _publish(target, root, 2, _rows(wider, range(3, 5), 2, referrer=["a", "b"]))

    assert outcome.published and outcome.table_version == before + 1
    assert sorted(_log_actions(str(root), before + 1)) == ["add", "commitInfo", "metaData", "txn"]
    table = DeltaTable(str(root))
    assert table.transaction_version("app") == 2
    assert [f.name for f in table.schema().fields] == [*BASE.names, "referrer"]
    got = table.to_pyarrow_table().sort_by("_kafka_offset").to_pylist()
    assert [(r["_kafka_offset"], r["referrer"]) for r in got] == [
        (0, None),
        (1, None),
        (2, None),
        (3, "a"),
        (4, "b"),
    ]
    # the table kept its identity and its NOT NULL column
    assert table.metadata().id == identity
    field = next(f for f in table.schema().fields if f.name == "_batch_id")
    assert not field.nullable
    # a batch without the new (nullable) column still commits, with no schema change
    _publish(target, root, 3, _rows(BASE, range(5, 6), 3))
    assert "metaData" not in _log_actions(str(root), before + 2)
    assert DeltaTable(str(root)).to_pyarrow_table().num_rows == 6


def test_widening_removes_no_file_even_one_without_statistics(tmp_path: Path) -> None:
    """The widening commit is a delta-rs overwrite whose filter must match no file; a file
    without column statistics is the one a statistics-based filter could not rule out."""
    root = tmp_path / "table"
    target = DeltaTarget(str(root))
    files = _stage(root, "batch-1", _rows(BASE, range(0, 3), 1), "table")
    bare = [dataclasses.replace(f, stats=json.dumps({"numRecords": f.records})) for f in files]
    target.publish(app_id="app", batch_id=1, files=bare, schema=BASE, metadata={})
    wider = BASE.append(pa.field("referrer", pa.string()))
    _publish(target, root, 2, _rows(wider, range(3, 4), 2, referrer=["a"]))
    table = DeltaTable(str(root))
    assert "remove" not in _log_actions(str(root), table.version())
    assert sorted(table.to_pyarrow_table().column("_kafka_offset").to_pylist()) == [0, 1, 2, 3]


def test_a_replace_that_widens_the_schema_adds_the_columns_then_swaps_the_rows(
    tmp_path: Path,
) -> None:
    """delta-rs takes remove actions only in mode append, which cannot change the schema: the
    new nullable columns come in a commit of their own, then the replace as usual."""
    root = tmp_path / "table"
    target = DeltaTarget(str(root))
    _publish(target, root, 1, _rows(BASE, range(0, 3), 1))
    before = DeltaTable(str(root)).version()
    wider = BASE.append(pa.field("referrer", pa.string()))
    files = _stage(
        root, "replace-2", _rows(wider, range(0, 3), 2, referrer=["a", "b", "c"]), "table"
    )
    outcome = target.replace(
        app_id="app.backfill",
        batch_id=2,
        files=files,
        schema=wider,
        metadata={},
        ranges=[OffsetRange("t", 0, 0, 3)],
        rewrite_dir=str(root / "rewrites"),
    )
    assert outcome.published and outcome.table_version == before + 2
    assert _log_actions(str(root), before + 1) == ["commitInfo", "metaData"]
    assert sorted(_log_actions(str(root), before + 2)) == ["add", "commitInfo", "remove", "txn"]
    got = DeltaTable(str(root)).to_pyarrow_table().sort_by("_kafka_offset").to_pylist()
    assert [(r["_kafka_offset"], r["referrer"]) for r in got] == [(0, "a"), (1, "b"), (2, "c")]


def _publisher(tmp_path: Path) -> DeltaPublisher:
    table, quarantine = tmp_path / "table", tmp_path / "quarantine"
    publisher = DeltaPublisher(DeltaTarget(str(table)), DeltaTarget(str(quarantine)))
    _publish(publisher.table, table, 1, _rows(BASE, range(0, 3), 1))
    _publish(publisher.quarantine, quarantine, 1, _rows(QUARANTINE, range(3, 4), 1))
    return publisher


def _schemas(table: pa.Schema, quarantine: pa.Schema) -> dict[str, str]:
    return {"table": encode_schema(table), "quarantine": encode_schema(quarantine)}


def test_the_check_accepts_new_nullable_and_missing_nullable_columns(tmp_path: Path) -> None:
    publisher = _publisher(tmp_path)
    wider = BASE.append(pa.field("referrer", pa.string()))
    publisher.check_schemas(_schemas(wider, QUARANTINE))
    without_event_id = BASE.remove(BASE.get_field_index("event_id"))
    publisher.check_schemas(_schemas(without_event_id, QUARANTINE))


def test_the_check_refuses_a_type_change_naming_column_and_both_types(tmp_path: Path) -> None:
    publisher = _publisher(tmp_path)
    changed = BASE.set(
        BASE.get_field_index("_kafka_offset"), pa.field("_kafka_offset", pa.string())
    )
    with pytest.raises(InconsistencyError) as info:
        publisher.check_schemas(_schemas(changed, QUARANTINE))
    message = str(info.value)
    assert "column _kafka_offset" in message and "long" in message and "string" in message
    assert str(tmp_path / "table") in message


def test_the_check_refuses_a_dropped_not_null_column(tmp_path: Path) -> None:
    publisher = _publisher(tmp_path)
    dropped = BASE.remove(BASE.get_field_index("_batch_id"))
    with pytest.raises(InconsistencyError) as info:
        publisher.check_schemas(_schemas(dropped, QUARANTINE))
    assert "column _batch_id" in str(info.value) and "NOT NULL" in str(info.value)


def test_the_check_refuses_a_case_only_rename_and_a_type_the_table_lacks_a_feature_for(
    tmp_path: Path,
) -> None:
    publisher = _publisher(tmp_path)
    renamed = BASE.set(BASE.get_field_index("event_id"), pa.field("Event_ID", pa.string()))
    with pytest.raises(InconsistencyError, match="column Event_ID: the table has event_id"):
        publisher.check_schemas(_schemas(renamed, QUARANTINE))
    twice = BASE.append(pa.field("Event_ID", pa.string()))
    with pytest.raises(InconsistencyError, match=r"not a valid Delta schema.*Event_ID"):
        publisher.check_schemas(_schemas(twice, QUARANTINE))
    naive = BASE.append(pa.field("seen", pa.timestamp("us")))
    with pytest.raises(InconsistencyError, match=r"column seen: new timestamp_ntz .*timestampNtz"):
        publisher.check_schemas(_schemas(naive, QUARANTINE))


def test_the_quarantine_table_gets_the_same_rules(tmp_path: Path) -> None:
    publisher = _publisher(tmp_path)
    changed = QUARANTINE.set(
        QUARANTINE.get_field_index("_error"), pa.field("_error", pa.list_(pa.string()))
    )
    with pytest.raises(InconsistencyError) as info:
        publisher.check_schemas(_schemas(BASE, changed))
    message = str(info.value)
    assert str(tmp_path / "quarantine") in message and "column _error" in message
    assert "string" in message and "array<string>" in message

    # an additive quarantine change lands with the quarantine's files, in one commit
    root = tmp_path / "quarantine"
    before = DeltaTable(str(root)).version()
    wider = QUARANTINE.append(pa.field("_error_code", pa.int32()))
    _publish(publisher.quarantine, root, 2, _rows(wider, range(4, 5), 2, _error_code=[7]))
    assert sorted(_log_actions(str(root), before + 1)) == ["add", "commitInfo", "metaData", "txn"]
    got = DeltaTable(str(root)).to_pyarrow_table().sort_by("_kafka_offset").to_pylist()
    assert [(r["_kafka_offset"], r["_error_code"]) for r in got] == [(3, None), (4, 7)]
