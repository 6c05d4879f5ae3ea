"""The orphan cleaner (jobs/maintenance/cleaner.py) on S3: it lists an aborted attempt's objects
with boto3 and deletes them, Spark's markers included, and leaves a committed batch's files,
which its table reads, alone."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable

from jobs.stage import parquet_files
from jobs.stage.staging import attempt_folder
from ledger.core.batch import Batch, StagedFile
from ledger.core.layout import QUARANTINE, TABLE
from ledger.core.protocol import BatchState
from ledger.store.ledger_store import LedgerStore
from resources.config.loading import load_config
from resources.config.pipeline_config import PipelineConfig
from resources.delta.table import DeltaTarget
from resources.object_storage import storage
from tests.fixtures.s3 import put_object
from tests.test_clean import SCHEMA, SCHEMAS, TOPIC, clean, commit, plan

S = BatchState


@pytest.fixture
def config(tmp_path: Path, s3_env: dict[str, str], s3_bucket: str) -> PipelineConfig:
    doc = {
        "pipeline": "pv",
        "kafka": {"bootstrap_servers": "127.0.0.1:9", "topic": TOPIC},
        "delta": {
            "table_uri": f"s3://{s3_bucket}/tables/pv",
            "quarantine_uri": f"s3://{s3_bucket}/tables/pv_quarantine",
        },
        "ledger": {"url": f"sqlite:///{tmp_path / 'ledger.db'}"},
    }
    path = tmp_path / "pv.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_config(path)


@pytest.fixture
def store(config: PipelineConfig) -> Iterator[LedgerStore]:
    ledger = LedgerStore(config.ledger.url)
    try:
        yield ledger
    finally:
        ledger.dispose()


def roots(config: PipelineConfig) -> dict[str, str]:
    return {TABLE: config.delta.table_uri, QUARANTINE: config.delta.quarantine_uri}


def folder_of(config: PipelineConfig, batch: Batch, target: str) -> str:
    root = roots(config)[target]
    return attempt_folder(root, batch.app_id, batch.batch_id, batch.attempt, batch.token)


def stage(
    config: PipelineConfig, batch: Batch, targets: Iterable[str] = (TABLE, QUARANTINE)
) -> list[StagedFile]:
    """What the stage job leaves on S3 for `batch`: a Parquet part and Spark's _SUCCESS in
    each target's attempt folder, described as the vote would."""
    files: list[StagedFile] = []
    rng = batch.ranges[0]
    for target in targets:
        folder = folder_of(config, batch, target)
        offsets = list(range(rng.start, rng.end))
        data = pa.table(
            {
                "_kafka_topic": [rng.topic] * len(offsets),
                "_kafka_partition": pa.array([rng.partition] * len(offsets), pa.int32()),
                "_kafka_offset": offsets,
                "value": [f"{target}-{o}" for o in offsets],
            },
            schema=SCHEMA,
        )
        storage.write_parquet(data, storage.join(folder, "part-00000.snappy.parquet"))
        put_object(storage.join(folder, "_SUCCESS"), b"")
        files += parquet_files.describe(folder, roots(config)[target], target)
    return files


def test_the_cleaner_deletes_an_aborted_attempts_objects_and_keeps_committed_ones(
    store: LedgerStore, config: PipelineConfig
) -> None:
    done = plan(store, config)
    files = stage(config, done)
    done = store.transition(done, S.STAGED)
    done = commit(store, config, store.transition(done, S.PREPARED, files=files, schemas=SCHEMAS))
    gone = plan(store, config)
    stage(config, gone)
    gone = store.transition(store.transition(gone, S.STAGED), S.ABORTED, error="test")

    report = clean(config, older_than="0s")

    for target in (TABLE, QUARANTINE):
        assert storage.list_files(folder_of(config, gone, target)) == []
        kept = storage.list_files(folder_of(config, done, target))
        assert [f.uri.rsplit("/", 1)[1] for f in kept] == ["_SUCCESS", "part-00000.snappy.parquet"]
    assert report.files_deleted == 4 and report.bytes_deleted > 0
    assert {v.entry.target for v in report.deleted} == {TABLE, QUARANTINE}
    table_uri = config.delta.table_uri
    options = DeltaTarget(table_uri).storage_options
    assert DeltaTable(table_uri, storage_options=options).to_pyarrow_table().num_rows == 3
