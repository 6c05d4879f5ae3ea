"""The publisher's view of its two real Delta tables (delta-rs, no Spark): which tables hold a
batch, a batch the quarantine holds and the data table not (invariant 12), the sizes of
staged files (invariant 11), and the rows an output holds in a batch's ranges."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from jobs import parquet_files
from jobs.delta_publisher import DeltaPublisher, commit_metadata
from jobs.stage import QUARANTINE, TABLE, attempt_folder
from ledger.batch import Batch, StagedFile, this_owner
from ledger.protocol import BatchState, OffsetRange
from resources.delta import DeltaTarget, encode_schema
from tests.fixtures.batches import a_batch

APP = "pageviews"
TOPIC = "pv-" + "x" * 80  # longer than the 64 characters kept in statistics


def batch(batch_id: int, ranges: list[OffsetRange], token: str = "t0ken") -> Batch:
    return a_batch(
        batch_id,
        BatchState.PREPARED,
        app_id=APP,
        token=token,
        owner=this_owner(),
        ranges=tuple(ranges),
    )


def stage(root: Path, target: str, b: Batch, offsets: list[int]) -> list[StagedFile]:
    """One Parquet file of rows with these offsets of partition 0, in the attempt's folder."""
    folder = attempt_folder(str(root), b.app_id, b.batch_id, b.attempt, b.token)
    Path(folder).mkdir(parents=True)
    rows = pa.table(
        {
            "_kafka_topic": [TOPIC] * len(offsets),
            "_kafka_partition": pa.array([0] * len(offsets), pa.int32()),
            "_kafka_offset": pa.array(offsets, pa.int64()),
        }
    )
    pq.write_table(rows, f"{folder}/part-0.parquet")
    return parquet_files.describe(folder, str(root), target)


def test_a_batch_in_the_quarantine_only_is_reported_unfinished(tmp_path: Path) -> None:
    publisher = DeltaPublisher(
        DeltaTarget(str(tmp_path / "table")), DeltaTarget(str(tmp_path / "quarantine"))
    )
    first = batch(1, [OffsetRange(TOPIC, 0, 0, 10)])
    files = [
        *stage(tmp_path / "table", TABLE, first, list(range(8))),
        *stage(tmp_path / "quarantine", QUARANTINE, first, [8, 9]),
    ]
    schema = pa.schema(
        [
            ("_kafka_topic", pa.string()),
            ("_kafka_partition", pa.int32()),
            ("_kafka_offset", pa.int64()),
        ]
    )
    first = Batch(
        **{
            **first.__dict__,
            "schemas": {TABLE: encode_schema(schema), QUARANTINE: encode_schema(schema)},
        }
    )
    assert publisher.publish(first, files).published
    assert publisher.outputs_holding(first) == {TABLE, QUARANTINE}

    # batch 2 reaches the quarantine, and the process dies before the data table
    second = Batch(**{**first.__dict__, "batch_id": 2, "ranges": (OffsetRange(TOPIC, 0, 10, 13),)})
    quarantined = stage(tmp_path / "quarantine", QUARANTINE, second, [11])
    publisher.quarantine.publish(
        app_id=APP,
        batch_id=2,
        files=quarantined,
        schema=schema,
        metadata=commit_metadata(second),
    )
    assert publisher.committed_version(APP) == 2  # the newest either table holds
    assert publisher.outputs_holding(second) == {QUARANTINE}
    entries = publisher.committed_batches(APP)
    assert [(e["batch_id"], e["outputs"], e["complete"]) for e in entries] == [
        (1, [QUARANTINE, TABLE], True),
        (2, [QUARANTINE], False),
    ]
    assert [OffsetRange.from_dict(r) for r in entries[1]["ranges"]] == list(second.ranges)
    # the rows each table holds in a batch's ranges
    assert publisher.rows_held(second, QUARANTINE) == 1
    assert publisher.rows_held(second, TABLE) == 0
    assert publisher.rows_held(first, TABLE) == 8

    # staged files as storage has them now
    (kept,) = quarantined
    assert publisher.file_size(QUARANTINE, kept.path) == kept.size
    Path(tmp_path / "quarantine" / kept.path).unlink()
    assert publisher.file_size(QUARANTINE, kept.path) is None

    # publishing batch 2 again adds nothing to the quarantine, and the data table gets it
    version = publisher.quarantine.load().version()  # type: ignore[union-attr]
    table_files = stage(
        tmp_path / "table", TABLE, Batch(**{**second.__dict__, "token": "n3w"}), [10, 12]
    )
    assert publisher.publish(second, [*table_files, *quarantined]).published
    assert publisher.quarantine.load().version() == version  # type: ignore[union-attr]
    assert publisher.committed_batches(APP)[1]["complete"] is True


def test_attempt_folders_differ_by_token_alone() -> None:
    one = attempt_folder("/t", APP, 7, 1, "aaaa")
    other = attempt_folder("/t", APP, 7, 1, "bbbb")
    assert one != other and one.startswith("/t/staged/pageviews/batch-000000000007-attempt-1-")
