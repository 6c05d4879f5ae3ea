"""A compacted topic (`cleanup.policy=compact`: change-data-capture topics, Kafka Streams'
changelogs, any keyed state): Kafka's log cleaner removes every record but the newest of
its key, so a range's offsets have gaps that appear while the pipeline runs. A range
planned before the cleaner ran may hold far fewer records, or none, when it is staged;
records already committed may vanish from the topic afterwards.

Against the real broker (its cleaner made quick for the test), Spark and Delta: batches of
a few offsets, some committed before the cleaner runs and the rest after it; then a replace
over offsets the cleaner emptied, which would delete committed rows and put nothing in
their place (refused before its vote), and one over offsets whose records all survived.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)
from deltalake import DeltaTable

from jobs.examples.sample_data import MALFORMED, pageviews
from jobs.wiring.pipeline import build
from ledger.core.errors import RefusedBatchError
from ledger.core.protocol import BatchState, OffsetRange
from ledger.store.ledger_store import LedgerStore
from tests.fixtures.pipeline import (
    coordinates,
    produced_coordinates,
    run_until_caught_up,
)
from tests.test_backfill import backfill

pytestmark = pytest.mark.integration

#: Segments roll after 100 ms and any dirt makes a log cleanable, so the cleaner compacts
#: whatever is behind the active segment within a second or two.
COMPACTED = {
    "cleanup.policy": "compact",
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": "0.001",
    "min.compaction.lag.ms": "0",
}
KEYS = 6
PARTITIONS = 2


@pytest.fixture
def quick_cleaner(kafka_broker: str) -> Iterator[None]:
    """The broker's cleaner wakes every 0.5 s instead of 15 s (a dynamic broker setting,
    set back afterwards)."""
    admin = AdminClient({"bootstrap.servers": kafka_broker})

    def alter(operation: AlterConfigOpType, value: str | None) -> None:
        entry = ConfigEntry("log.cleaner.backoff.ms", value, incremental_operation=operation)
        resource = ConfigResource("broker", "1", incremental_configs=[entry])
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(60)

    alter(AlterConfigOpType.SET, "500")
    yield
    alter(AlterConfigOpType.DELETE, None)


def keyed(values: list[bytes], start: int) -> list[tuple[int, bytes, bytes]]:
    """(partition, key, value): record i goes to partition i % 2 with key k(i % KEYS)."""
    return [
        ((start + i) % PARTITIONS, f"k{(start + i) % KEYS}".encode(), value)
        for i, value in enumerate(values)
    ]


def roll_and_compact(kafka_client: Any, topic: str, survivors_below: int) -> None:
    """Roll every partition's segment (a record after segment.ms) until the cleaner has
    left fewer than `survivors_below` committed records, then wait until it is done: the
    survivors the same over a second (two of the cleaner's wake-ups) with nothing produced
    (only the active segment, which nothing rolls any more, is left dirty)."""
    for _ in range(120):
        time.sleep(0.5)
        kafka_client.produce_records(
            topic, [(p, b"roll", json.dumps({"roll": p}).encode()) for p in range(PARTITIONS)]
        )
        if len(produced_coordinates(kafka_client, topic)) < survivors_below:
            break
    else:
        raise AssertionError(f"the log cleaner did not compact {topic} within a minute")
    survivors = produced_coordinates(kafka_client, topic)
    for _ in range(60):
        time.sleep(1)
        if survivors == (survivors := produced_coordinates(kafka_client, topic)):
            return
    raise AssertionError(f"the log cleaner did not settle on {topic} within a minute")


def produced_at(batches: list[list[bytes]]) -> dict[tuple[int, int], bytes]:
    """The value produced at each (partition, offset): `keyed` spreads each list in order
    and a plain producer's offsets are dense, so the coordinates follow from the lists."""
    at: dict[tuple[int, int], bytes] = {}
    start = 0
    for values in batches:
        for partition, _, value in keyed(values, start):
            at[(partition, sum(1 for p, _ in at if p == partition))] = value
        start += len(values)
    return at


def stored_values(config: Any) -> dict[tuple[int, int], str]:
    """Each stored row's (partition, offset): its event id (table) or raw value (quarantine)."""
    found: dict[tuple[int, int], str] = {}
    for uri, column in ((config.delta.table_uri, "event_id"), (config.delta.quarantine_uri, None)):
        if not DeltaTable.is_deltatable(uri):
            continue
        rows = DeltaTable(uri).to_pyarrow_table().to_pylist()
        for row in rows:
            value = row[column] if column else bytes(row["_raw_value"]).decode()
            found[(row["_kafka_partition"], row["_kafka_offset"])] = value
    return found


def test_a_compacted_topic_lands_every_survivor_once_and_replaces_only_what_survived(
    spark: Any, kafka_client: Any, pipeline_factory: Any, quick_cleaner: None
) -> None:
    topic = f"compacted-{uuid.uuid4().hex[:8]}"
    kafka_client.create_topic(topic, PARTITIONS, config=COMPACTED)
    config = pipeline_factory(PARTITIONS, topic=topic, max_records=6)
    first = list(pageviews(36, malformed_every=9))
    kafka_client.produce_records(topic, keyed(first, 0))

    # two batches before the cleaner can run (the first records' segment is still active)
    pipeline = build(config, spark_factory=lambda: spark)
    pipeline.recover_and_commit()
    assert pipeline.run_batch() is not None and pipeline.run_batch() is not None

    later = [*pageviews(36, start=36), MALFORMED[0]]
    kafka_client.produce_records(topic, keyed(later, len(first)))
    roll_and_compact(kafka_client, topic, survivors_below=(len(first) + len(later)) // 2)
    run_until_caught_up(pipeline)

    table = coordinates(config.delta.table_uri)
    quarantine = coordinates(config.delta.quarantine_uri)
    stored = table + quarantine
    assert max(stored.values()) == 1, {c: n for c, n in stored.items() if n > 1}
    assert not set(table) & set(quarantine)
    # every record the cleaner left is stored ...
    survivors = produced_coordinates(kafka_client, topic)
    assert survivors <= set(stored), sorted(survivors - set(stored))[:10]
    # ... and every stored row is the record produced at its coordinate (those the
    # cleaner removed later were read before it did): nothing shifted, nothing invented
    produced = produced_at([first, later])
    rolls = {c for c in stored if c not in produced}
    assert all(c[1] >= len(first) // PARTITIONS + len(later) // PARTITIONS for c in rolls)
    before_replace = stored_values(config)
    for coordinate, value in before_replace.items():
        if coordinate in rolls:
            continue
        raw = produced[coordinate]
        expected = raw.decode() if raw in MALFORMED else json.loads(raw)["event_id"]
        assert value == expected, (coordinate, value, expected)

    # every offset of every partition is covered by exactly one committed batch, the
    # ranges the cleaner emptied too; some ranges were read across compacted gaps
    store = LedgerStore(config.ledger.url)
    try:
        batches = store.batches(app_id=config.app_id)
    finally:
        store.dispose()
    assert Counter(b.state for b in batches) == {BatchState.ACKED: len(batches)}
    ends = {p: off.last_stable for p, off in kafka_client.offsets(topic).items()}
    for partition, end in ends.items():
        covered = Counter(
            o
            for b in batches
            for r in b.ranges
            if r.partition == partition
            for o in range(r.start, r.end)
        )
        assert set(covered) == set(range(end)) and set(covered.values()) == {1}, covered
    assert len(stored) < sum(ends.values()), "the cleaner removed nothing before the reads"

    # a replace over offsets whose records the cleaner removed would delete their rows and
    # put nothing in their place: refused before its vote, both tables as they were
    gone = sorted(o for p, o in set(stored) - survivors if p == 0)
    assert gone, "every committed record of partition 0 survived the cleaner"
    versions = [
        DeltaTable(u).version() for u in (config.delta.table_uri, config.delta.quarantine_uri)
    ]
    with pytest.raises(RefusedBatchError) as refused:
        backfill(config, spark, "replace", OffsetRange(topic, 0, 0, ends[0]))
    assert (
        f"the replace would delete {len(gone)} row(s) whose records Kafka no longer holds, "
        f"e.g. {topic}-0@{gone[0]}"
    ) in str(refused.value), refused.value
    assert [
        DeltaTable(u).version() for u in (config.delta.table_uri, config.delta.quarantine_uri)
    ] == versions
    assert stored_values(config) == before_replace

    # a range whose records all survived is replaced as any other
    kept = max(o for p, o in survivors & set(table) if p == 0 and (p, o) in produced)
    backfill(config, spark, "replace", OffsetRange(topic, 0, kept, kept + 1))
    apps = {
        (r["_kafka_partition"], r["_kafka_offset"]): r["app"]
        for r in DeltaTable(config.delta.table_uri).to_pyarrow_table().to_pylist()
    }
    assert apps[(0, kept)] == apps[(0, kept)].upper() and set(apps) == set(table)
