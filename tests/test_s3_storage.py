"""resources/object_storage/storage.py on S3, and what reads and writes through it: the staged
files' descriptions for the vote, the commit's existence and size checks, Parquet read for the
replace backfill's rewrites, and delta-rs commits, all against the loopback S3 server with
nothing but the standard AWS variables set."""

from __future__ import annotations

from collections import Counter

import pytest
from deltalake import DeltaTable

from jobs.stage.parquet_files import describe
from ledger.core.batch import StagedFile
from ledger.core.protocol import OffsetRange
from resources.delta.table import DeltaTarget
from resources.object_storage import storage
from tests.fixtures.race_publisher import SCHEMA, parquet_of
from tests.fixtures.s3 import put_object

TOPIC = "pageviews"
APP = "pageviews"


def stage(root: str, batch_id: int, attempt: int, rng: OffsetRange) -> list[StagedFile]:
    """One attempt's staged file of `rng` on S3, described as the vote describes it."""
    folder = storage.join(root, "staged", APP, f"batch-{batch_id}-attempt-{attempt}")
    put_object(storage.join(folder, "part-0.parquet"), parquet_of(rng, f"{batch_id}/{attempt}"))
    return describe(folder, root, "table")


def rows(root: str) -> Counter[tuple[int, int, str]]:
    table = DeltaTable(root, storage_options=DeltaTarget(root).storage_options)
    data = table.to_pyarrow_table()
    return Counter(
        zip(
            data.column("_kafka_partition").to_pylist(),
            data.column("_kafka_offset").to_pylist(),
            data.column("value").to_pylist(),
            strict=True,
        )
    )


def test_listing_finds_data_files_not_markers(s3_env: dict[str, str], s3_bucket: str) -> None:
    folder = f"s3://{s3_bucket}/t/staged/app/batch-1"
    data = parquet_of(OffsetRange(TOPIC, 0, 0, 5), "x")
    for name in ("part-0.parquet", "sub/part-1.parquet", "_temporary/0/part-9.parquet"):
        put_object(storage.join(folder, name), data)
    put_object(storage.join(folder, "_SUCCESS"), b"")
    put_object(storage.join(folder, ".part-0.parquet.crc"), b"crc")
    put_object(f"s3://{s3_bucket}/t/staged/app/batch-10/part-0.parquet", data)  # a sibling prefix

    found = storage.list_data_files(folder)

    assert [f.uri for f in found] == [
        storage.join(folder, "part-0.parquet"),
        storage.join(folder, "sub/part-1.parquet"),
    ]
    assert all(f.size == len(data) and f.modification_time_ms > 0 for f in found)
    everything = [f.uri.removeprefix(folder + "/") for f in storage.list_files(folder)]
    assert everything == [
        ".part-0.parquet.crc",
        "_SUCCESS",
        "_temporary/0/part-9.parquet",
        "part-0.parquet",
        "sub/part-1.parquet",
    ]
    assert storage.list_data_files(f"s3://{s3_bucket}/nothing-here") == []


def test_sizes_existence_and_deletes(s3_env: dict[str, str], s3_bucket: str) -> None:
    uri = f"s3://{s3_bucket}/t/staged/app/batch-1/part-0.parquet"
    put_object(uri, b"12345")

    assert storage.exists(uri)
    assert storage.file_size(uri) == 5
    assert storage.file_info(uri).size == 5
    assert storage.delete_file(uri)
    assert not storage.exists(uri)
    assert storage.file_size(uri) is None
    assert not storage.delete_file(uri)  # already gone: another cleaner, or a VACUUM
    with pytest.raises(FileNotFoundError):
        storage.file_info(uri)


def test_a_staged_file_is_described_from_its_footer_on_s3(
    s3_env: dict[str, str], s3_bucket: str
) -> None:
    root = f"s3://{s3_bucket}/tables/pageviews"

    [described] = stage(root, 1, 1, OffsetRange(TOPIC, 2, 100, 130))

    assert described.path == "staged/pageviews/batch-1-attempt-1/part-0.parquet"
    assert described.records == 30
    assert '"minValues":{' in described.stats and '"_kafka_offset":100' in described.stats
    assert described.size == storage.file_size(storage.join(root, described.path))


def test_batches_commit_and_replace_on_s3(s3_env: dict[str, str], s3_bucket: str) -> None:
    root = f"s3://{s3_bucket}/tables/pageviews"
    target = DeltaTarget(root)

    first = stage(root, 1, 1, OffsetRange(TOPIC, 0, 0, 40))
    meta = {"app_id": APP, "batch_id": 1}
    assert target.publish(app_id=APP, batch_id=1, files=first, schema=SCHEMA, metadata=meta)
    again = target.publish(app_id=APP, batch_id=1, files=first, schema=SCHEMA, metadata=meta)
    assert not again.published
    assert target.offset_reach(TOPIC) == {0: 40}

    # a replace of [10, 20) rewrites the batch's file without those rows, on S3
    backfill = f"{APP}.backfill"
    rng = OffsetRange(TOPIC, 0, 10, 20)
    folder = storage.join(root, "staged", backfill, "batch-1-attempt-1")
    put_object(storage.join(folder, "part-0.parquet"), parquet_of(rng, "replaced"))
    outcome = target.replace(
        app_id=backfill,
        batch_id=1,
        files=describe(folder, root, "table"),
        schema=SCHEMA,
        metadata={"app_id": backfill, "batch_id": 1},
        ranges=[rng],
        rewrite_dir=f"{folder}-rewrites",
    )

    assert outcome.published
    expected = {(0, o, "1/1"): 1 for o in range(40) if not 10 <= o < 20}
    expected.update({(0, o, "replaced"): 1 for o in range(10, 20)})
    assert rows(root) == Counter(expected)
    rewrites = storage.list_data_files(f"{folder}-rewrites")
    assert len(rewrites) == 1 and rewrites[0].uri.startswith("s3://")


def test_a_kept_table_on_s3_is_read_afresh_once_re_created(
    s3_env: dict[str, str], s3_bucket: str
) -> None:
    """The table kept open between batches vouches for itself by the HEAD of a log entry
    it read: deleted and created again with as many versions, the table is another one."""
    root = f"s3://{s3_bucket}/tables/recreated"

    def publish(target: DeltaTarget, batch_id: int) -> None:
        files = stage(root, batch_id, 1, OffsetRange(TOPIC, 0, 10 * batch_id, 10 * batch_id + 10))
        meta = {"app_id": APP, "batch_id": batch_id}
        outcome = target.publish(
            app_id=APP, batch_id=batch_id, files=files, schema=SCHEMA, metadata=meta
        )
        assert outcome.published

    target = DeltaTarget(root)
    for batch_id in (1, 2):
        publish(target, batch_id)
    kept = target.load()
    assert kept is not None and kept.version() == 2 and target.load() is kept
    entry = storage.join(root, "_delta_log", f"{2:020d}.json")
    first = storage.fingerprint(entry)
    assert first is not None and storage.fingerprint(entry) == first

    for info in storage.list_files(root):
        assert storage.delete_file(info.uri)
    assert storage.fingerprint(entry) is None
    other = DeltaTarget(root)
    for batch_id in (7, 8):
        publish(other, batch_id)
    assert storage.fingerprint(entry) not in (None, first)

    assert target.transaction_version(APP) == 8
    table = target.load()
    fresh = DeltaTable(root, storage_options=target.storage_options)
    assert table is not None and table is not kept and table.version() == fresh.version() == 2
    assert sorted(table.file_uris()) == sorted(fresh.file_uris())
    assert rows(root) == Counter(
        {(0, o, f"{b}/1"): 1 for b in (7, 8) for o in range(10 * b, 10 * b + 10)}
    )
