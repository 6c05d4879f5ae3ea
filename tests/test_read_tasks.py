"""How many Spark tasks read a batch (jobs/stage/kafka_read.py `read_tasks`): the records
and the cores decide, not the topic's partition count. Spark's Kafka source gives every
partition a task of its own; at 256 partitions a 100k-record batch ran 256 tasks of a few
hundred records and wrote as many files per output (issue 31)."""

from __future__ import annotations

from typing import Any

from deltalake import DeltaTable

from jobs.examples.sample_data import pageviews
from jobs.stage.kafka_read import RECORDS_PER_TASK, read_tasks
from jobs.wiring.pipeline import build
from ledger.core.protocol import OffsetRange
from tests.fixtures.pipeline import assert_exactly_once


def ranges(*spans: int) -> list[OffsetRange]:
    return [OffsetRange("t", p, 10, 10 + span) for p, span in enumerate(spans)]


def test_tasks_follow_the_records_and_the_cores_not_the_partitions() -> None:
    assert read_tasks(ranges(*[400] * 256), parallelism=2) == 2
    assert read_tasks(ranges(*[400] * 64), parallelism=8) == 8
    # a large batch gets a task per RECORDS_PER_TASK records, up to a task per partition
    big = RECORDS_PER_TASK // 8
    assert read_tasks(ranges(*[big] * 80), parallelism=2) == 10
    assert read_tasks(ranges(*[RECORDS_PER_TASK] * 8), parallelism=2) == 8
    # never more tasks than partitions that hold records: an empty range reads nothing
    assert read_tasks(ranges(5, 0, 0, 7), parallelism=4) == 2
    assert read_tasks(ranges(0, 0), parallelism=2) == 1
    # a session that cannot say its cores (Spark Connect) keeps a task per partition
    assert read_tasks(ranges(*[400] * 64), parallelism=None) == 64


def test_a_batch_over_many_partitions_is_staged_by_as_many_tasks_as_cores(
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    """Twelve partitions of 20 records, in local[2]: the batch's table version adds two
    files (one per task), not twelve, and every record is there once."""
    config = pipeline_factory(12)
    kafka_client.produce_to_partitions(
        config.kafka.topic, {p: list(pageviews(20, start=20 * p)) for p in range(12)}
    )
    tpc = build(config, spark_factory=lambda: spark)
    report = tpc.run_batch()
    assert report is not None
    files = DeltaTable(config.delta.table_uri).file_uris()
    assert len(files) == 2, files
    assert assert_exactly_once(config, kafka_client) == (240, 0)
