"""Invariant 13 at the stage: every coordinate read appears exactly once across a batch's
table and quarantine, checked before the vote. Real Kafka, real Spark staging, real delta-rs.

A transform that emits a record twice (union, explode, join fan-out), or drops one record and
duplicates another (the counts agree), or relabels a record's coordinates, fails the batch
with the counts and an example coordinate; nothing is committed and the batch is abandoned.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from jobs.examples.sample_data import pageviews
from jobs.stage.coordinates import Counts, check_exactly_once
from jobs.wiring.pipeline import build
from ledger.core.errors import InconsistencyError, RefusedBatchError
from ledger.core.protocol import BatchState, OffsetRange
from ledger.store.ledger_store import LedgerStore
from tests.fixtures.pipeline import assert_exactly_once

#: transform, the records it stages out of 10 read (one malformed), an example coordinate
BROKEN = {
    "union": ("tests.transforms:pageviews_twice", 20, "@0 "),
    "explode": ("tests.transforms:pageviews_exploded", 20, "@0 "),
    "drop one, duplicate another": (
        "tests.transforms:pageviews_drop_one_duplicate_another",
        10,
        "@0 ",
    ),
    "relabelled offset": ("tests.transforms:pageviews_moved_offset", 10, "@1000001 "),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_transform_that_breaks_exactly_once_fails_before_the_vote(
    case: str, spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    transform, staged, example = BROKEN[case]
    config = pipeline_factory(1)
    topic = config.kafka.topic
    kafka_client.produce(topic, pageviews(10, malformed_every=5), partition=0)
    tpc = build(config.model_copy(update={"transform": transform}), spark_factory=lambda: spark)

    with pytest.raises(InconsistencyError) as info:
        tpc.run_batch()
    message = str(info.value)
    assert "10 records read" in message and f"{staged} staged" in message, message
    assert f"{topic}-0{example}" in message, message
    assert "invariant 13" in message, message

    assert not DeltaTable.is_deltatable(config.delta.table_uri)
    assert not DeltaTable.is_deltatable(config.delta.quarantine_uri)
    store = LedgerStore(config.ledger.url)
    (batch,) = store.batches(app_id=config.app_id)
    assert batch.state is BatchState.ABORTED and batch.prepared_at is None
    assert batch.error is not None and "invariant 13" in batch.error

    # the abandoned range is planned again, and the pipeline's own transform takes it
    fixed = build(config, spark_factory=lambda: spark)
    fixed.recover_and_commit()
    report = fixed.run_batch()
    assert report is not None and report.batch.state is BatchState.ACKED
    assert assert_exactly_once(config, kafka_client) == (8, 2)


# -- the check on staged Parquet files (pyarrow, no Spark) ---------------------------------

TOPIC = "t"
RANGES = [OffsetRange(TOPIC, 0, 0, 10), OffsetRange(TOPIC, 1, 0, 10)]


def _write(path: Path, coords: list[tuple[int, int]], **metadata: str) -> str:
    table = pa.table(
        {
            "_kafka_topic": pa.array([TOPIC] * len(coords), pa.string()),
            "_kafka_partition": pa.array([p for p, _ in coords], pa.int32()),
            "_kafka_offset": pa.array([o for _, o in coords], pa.int64()),
        }
    ).replace_schema_metadata(metadata)
    pq.write_table(table, path)
    return str(path)


def _read(coords: list[tuple[int, int]]) -> Any:
    def read() -> pa.Table:
        return pa.table(
            {
                "_kafka_topic": [TOPIC] * len(coords),
                "_kafka_partition": pa.array([p for p, _ in coords], pa.int32()),
                "_kafka_offset": pa.array([o for _, o in coords], pa.int64()),
            }
        )

    return read


def _never(*_args: Any) -> pa.Table:
    raise AssertionError("the check re-read Kafka although the staged files showed the problem")


READ = [(0, o) for o in range(5)] + [(1, o) for o in range(3)]


def _check(
    tmp_path: Path,
    table: list[tuple[int, int]],
    quarantine: list[tuple[int, int]],
    read: Any = _never,
    fingerprints: tuple[int | None, int | None] = (None, None),
) -> None:
    files = [
        _write(tmp_path / "table.parquet", table, spark="table"),
        _write(tmp_path / "quarantine.parquet", quarantine, spark="quarantine"),
    ]
    check_exactly_once(
        Counts(len(READ), len(table), len(quarantine)),
        read_fingerprint=fingerprints[0],
        staged_fingerprint=fingerprints[1],
        staged_files=files,
        ranges=RANGES,
        read_coordinates=read,
    )


def test_every_coordinate_once_across_table_and_quarantine_passes(tmp_path: Path) -> None:
    _check(tmp_path, READ[:6], READ[6:], fingerprints=(42, 42))
    # no fingerprints reported (a transform not derived from the source): files and counts
    _check(tmp_path, READ[:6], READ[6:])


def test_a_coordinate_in_both_outputs_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RefusedBatchError, match=r"staged more than once, e.g. t-1@2 \(staged 2"):
        _check(tmp_path, [*READ[:6], (1, 2)], READ[6:])


def test_a_dropped_record_is_named_from_a_second_read(tmp_path: Path) -> None:
    staged = [c for c in READ if c != (0, 3)]
    with pytest.raises(RefusedBatchError) as info:
        _check(tmp_path, staged, [], read=_read(READ))
    assert "8 records read, 7 staged (7 table + 0 quarantine)" in str(info.value)
    assert "read but not staged, e.g. t-0@3" in str(info.value)


def test_a_record_relabelled_inside_the_ranges_is_caught_by_the_fingerprint(
    tmp_path: Path,
) -> None:
    """Offset 4 relabelled as 7, an offset in the range that was never read (a transaction
    marker's, say): counts agree, no repeat, nothing outside the ranges."""
    staged = [c if c != (0, 4) else (0, 7) for c in READ]
    with pytest.raises(RefusedBatchError) as info:
        _check(tmp_path, staged, [], read=_read(READ), fingerprints=(1, 2))
    assert "read but not staged, e.g. t-0@4" in str(info.value)
    assert "staged but never read, e.g. t-0@7" in str(info.value)


def _check_files(
    tmp_path: Path, ranges: list[OffsetRange], rows: dict[str, list[Any]], read: int
) -> None:
    """Check one staged file holding `rows` (topic, partition, offset columns; None is a
    null) against `ranges`, with counts and fingerprints that agree."""
    table = pa.table(
        {
            "_kafka_topic": pa.array(rows["topic"], pa.string()),
            "_kafka_partition": pa.array(rows["partition"], pa.int32()),
            "_kafka_offset": pa.array(rows["offset"], pa.int64()),
        }
    )
    _check_table(tmp_path, ranges, table, read)


def _check_table(tmp_path: Path, ranges: list[OffsetRange], table: pa.Table, read: int) -> None:
    """Check one staged file holding `table` as it is, types included."""
    path = tmp_path / "staged.parquet"
    pq.write_table(table, path)
    check_exactly_once(
        Counts(read, table.num_rows, 0),
        read_fingerprint=7,
        staged_fingerprint=7,
        staged_files=[str(path)],
        ranges=ranges,
        read_coordinates=_never,
    )


def test_a_repeat_in_a_sparse_range_is_refused(tmp_path: Path) -> None:
    """A compacted topic's range spans far more offsets than it holds records: the check
    counts repeats by sorting there, not in an array of the range's span."""
    ranges = [OffsetRange("c", 0, 5, 4_000_000_000), OffsetRange("c", 3, 0, 10)]
    offsets = [5, 1_000_000_007, 3_999_999_999, 3_999_999_999, 9]
    rows = {"topic": ["c"] * 5, "partition": [0, 0, 0, 0, 3], "offset": offsets}
    with pytest.raises(RefusedBatchError) as info:
        _check_files(tmp_path, ranges, rows, read=5)
    assert "1 coordinate(s) staged more than once, e.g. c-0@3999999999 (staged 2 times)" in str(
        info.value
    )
    assert "outside" not in str(info.value)
    # the same rows without the repeat pass
    rows = {"topic": ["c"] * 4, "partition": [0, 0, 0, 3], "offset": [5, 1_000_000_007, 6, 9]}
    _check_files(tmp_path, ranges, rows, read=4)


def test_repeats_are_named_in_coordinate_order_across_topics(tmp_path: Path) -> None:
    ranges = [OffsetRange("b", 1, 0, 10), OffsetRange("a", 2, 100, 110), OffsetRange("a", 0, 0, 5)]
    rows = {
        "topic": ["b", "b", "a", "a", "a", "a", "a"],
        "partition": [1, 1, 2, 2, 0, 0, 0],
        "offset": [9, 9, 101, 101, 4, 4, 4],
    }
    with pytest.raises(RefusedBatchError) as info:
        _check_files(tmp_path, ranges, rows, read=3)
    assert (
        "3 coordinate(s) staged more than once, e.g. a-0@4 (staged 3 times), "
        "a-2@101 (staged 2 times), b-1@9 (staged 2 times)"
    ) in str(info.value)


def test_coordinates_the_batch_did_not_read_are_refused(tmp_path: Path) -> None:
    """Another topic, a partition the batch did not read (or beyond any it did), an offset
    before or past its range, and null parts: each is outside the batch's ranges."""
    ranges = [OffsetRange("t", 0, 10, 20), OffsetRange("t", 2, 0, 5)]
    rows = {
        "topic": ["t", "u", "t", "t", "t", "t", None, "t", "t"],
        "partition": [0, 0, 1, 7, 0, 2, 0, None, 0],
        "offset": [10, 10, 3, 3, 9, 5, 11, 12, None],
    }
    with pytest.raises(RefusedBatchError) as info:
        _check_files(tmp_path, ranges, rows, read=1)
    message = str(info.value)
    assert "8 staged coordinate(s) outside the batch's ranges" in message, message
    assert "staged more than once" not in message, message
    # a staged coordinate in range is not refused
    _check_files(tmp_path, ranges, {"topic": ["t"], "partition": [2], "offset": [4]}, read=1)


def test_coordinates_staged_as_other_than_integers_are_refused(tmp_path: Path) -> None:
    """A transform that turned the partition into a double could stage 1.5: no truncation
    may read it as partition 1."""
    table = pa.table(
        {
            "_kafka_topic": ["t", "t"],
            "_kafka_partition": pa.array([0.0, 1.5], pa.float64()),
            "_kafka_offset": pa.array([0, 1], pa.int64()),
        }
    )
    ranges = [OffsetRange("t", 0, 0, 1), OffsetRange("t", 1, 1, 2)]
    with pytest.raises(RefusedBatchError, match="_kafka_partition is double, not an integer"):
        _check_table(tmp_path, ranges, table, read=2)


def test_a_topic_staged_as_other_than_a_string_is_refused(tmp_path: Path) -> None:
    coordinates = {"_kafka_partition": pa.array([0], pa.int32()), "_kafka_offset": [0]}
    table = pa.table({"_kafka_topic": [7], **coordinates})
    with pytest.raises(RefusedBatchError, match="_kafka_topic is int64, not a string"):
        _check_table(tmp_path, [OffsetRange("7", 0, 0, 1)], table, read=1)


def test_rows_staged_by_a_batch_of_no_ranges_are_refused(tmp_path: Path) -> None:
    with pytest.raises(RefusedBatchError, match="1 staged coordinate"):
        _check_files(tmp_path, [], {"topic": ["t"], "partition": [0], "offset": [0]}, read=1)
