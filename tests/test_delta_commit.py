"""The commit half of the protocol on real Delta tables (delta-rs, resources/delta.py).

Invariant 2 lives here, not in the coordinator: after a crash between the Delta commit and
the ledger's COMMITTED (crash point `after_delta_commit`), recovery publishes the voted
batch again, and a takeover can race the attempt it replaced to the table. Only the table's
application transaction version, read and committed as a compare-and-set by `DeltaTarget`,
keeps the second publish from adding a second copy. These tests publish one batch twice,
and from several threads at once, and count the rows by coordinates.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from ledger.batch import StagedFile
from ledger.protocol import OffsetRange
from resources import storage
from resources.delta import CommitOutcome, DeltaTarget, delta_stats

TOPIC = "pageviews"
APP = "pageviews"
SCHEMA = pa.schema(
    [
        ("_kafka_topic", pa.string()),
        ("_kafka_partition", pa.int32()),
        ("_kafka_offset", pa.int64()),
        ("value", pa.string()),
    ]
)


def staged(root: Path, app_id: str, batch_id: int, attempt: int, rng: OffsetRange) -> StagedFile:
    """One attempt's staged file of `rng`, in a folder of its own under the table, described
    as the vote records it; `value` tells which attempt wrote the row."""
    folder = root / "_staged" / app_id / f"batch-{batch_id}-attempt-{attempt}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"part-{rng.partition}.parquet"
    offsets = list(range(rng.start, rng.end))
    pq.write_table(
        pa.table(
            {
                "_kafka_topic": [rng.topic] * len(offsets),
                "_kafka_partition": [rng.partition] * len(offsets),
                "_kafka_offset": offsets,
                "value": [f"{app_id}/{batch_id} attempt {attempt}"] * len(offsets),
            },
            schema=SCHEMA,
        ),
        path,
    )
    info = storage.file_info(str(path))
    return StagedFile(
        "table",
        storage.relative(str(path), str(root)),
        info.size,
        len(offsets),
        info.modification_time_ms,
        json.dumps(delta_stats(pq.read_metadata(path)), separators=(",", ":")),
    )


def publish(
    target: DeltaTarget, root: Path, batch_id: int, attempt: int, rng: OffsetRange
) -> CommitOutcome:
    return target.publish(
        app_id=APP,
        batch_id=batch_id,
        files=[staged(root, APP, batch_id, attempt, rng)],
        schema=SCHEMA,
        metadata={"app_id": APP, "batch_id": batch_id, "attempt": attempt},
    )


def rows(root: Path) -> Counter[tuple[int, int, str]]:
    """(partition, offset, value) of every row of the table, counted."""
    table = DeltaTable(str(root)).to_pyarrow_table()
    return Counter(
        zip(
            table.column("_kafka_partition").to_pylist(),
            table.column("_kafka_offset").to_pylist(),
            table.column("value").to_pylist(),
            strict=True,
        )
    )


def coordinates(root: Path) -> Counter[tuple[int, int]]:
    return Counter((p, o) for (p, o, _v), n in rows(root).items() for _ in range(n))


def at_once(*calls: Any) -> list[object]:
    """Run the calls in threads released at the same instant; their results or errors."""
    barrier = threading.Barrier(len(calls))
    outcomes: list[object] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait(timeout=30)
        try:
            outcomes[i] = calls[i]()
        except Exception as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return outcomes


def test_publishing_one_batch_again_adds_nothing(tmp_path: Path) -> None:
    """Recovery after `after_delta_commit` publishes the voted batch a second time."""
    root = tmp_path / "table"
    target = DeltaTarget(str(root))
    first = publish(target, root, 1, 1, OffsetRange(TOPIC, 0, 0, 10))
    assert first.published
    version = DeltaTable(str(root)).version()

    again = publish(target, root, 1, 2, OffsetRange(TOPIC, 0, 0, 10))
    assert not again.published
    assert again.table_version == version
    assert DeltaTable(str(root)).version() == version
    assert rows(root) == Counter({(0, o, f"{APP}/1 attempt 1"): 1 for o in range(10)})

    # the next batch goes in; an older one, published late, adds nothing either
    assert publish(target, root, 2, 1, OffsetRange(TOPIC, 0, 10, 20)).published
    assert not publish(target, root, 1, 3, OffsetRange(TOPIC, 0, 0, 10)).published
    assert target.transaction_version(APP) == 2
    assert coordinates(root) == Counter({(0, o): 1 for o in range(20)})


@pytest.mark.parametrize("table_exists", [True, False], ids=["table", "no-table-yet"])
def test_concurrent_publishers_of_one_batch_add_it_once(tmp_path: Path, table_exists: bool) -> None:
    """Several attempts of one batch (a takeover racing the attempt it replaced, say), each
    with files of its own, publish at the same instant: the table gets one of them."""
    root = tmp_path / "table"
    target = DeltaTarget(str(root))
    if table_exists:
        assert publish(target, root, 1, 1, OffsetRange(TOPIC, 0, 0, 10)).published
    batch_id = 2 if table_exists else 1
    rng = OffsetRange(TOPIC, 1, 0, 25)
    files = {attempt: staged(root, APP, batch_id, attempt, rng) for attempt in range(1, 5)}

    def attempt_publishes(attempt: int) -> CommitOutcome:
        return DeltaTarget(str(root)).publish(
            app_id=APP,
            batch_id=batch_id,
            files=[files[attempt]],
            schema=SCHEMA,
            metadata={"app_id": APP, "batch_id": batch_id, "attempt": attempt},
        )

    outcomes = at_once(*(lambda a=a: attempt_publishes(a) for a in files))
    assert all(isinstance(o, CommitOutcome) for o in outcomes), outcomes
    published = [o for o in outcomes if isinstance(o, CommitOutcome) and o.published]
    assert len(published) == 1, outcomes
    assert target.transaction_version(APP) == batch_id
    partition_1 = Counter(
        (p, o) for (p, o, _v), n in rows(root).items() if p == 1 for _ in range(n)
    )
    assert partition_1 == Counter({(1, o): 1 for o in range(25)})
    winners = {v for (p, _o, v) in rows(root) if p == 1}
    assert len(winners) == 1, winners  # every row of the batch from the same one attempt


def test_concurrent_replaces_of_one_batch_rewrite_once(tmp_path: Path) -> None:
    """A replace backfill published by two attempts at once: the rows of its range are
    swapped once, never kept beside the new ones, never added twice."""
    root = tmp_path / "table"
    target = DeltaTarget(str(root))
    assert publish(target, root, 1, 1, OffsetRange(TOPIC, 0, 0, 40)).published
    backfill = f"{APP}.backfill"
    rng = OffsetRange(TOPIC, 0, 10, 20)

    def attempt_replaces(attempt: int) -> CommitOutcome:
        return DeltaTarget(str(root)).replace(
            app_id=backfill,
            batch_id=1,
            files=[staged(root, backfill, 1, attempt, rng)],
            schema=SCHEMA,
            metadata={"app_id": backfill, "batch_id": 1, "attempt": attempt},
            ranges=[rng],
            rewrite_dir=str(root / "_staged" / backfill / f"batch-1-attempt-{attempt}-rewrites"),
        )

    outcomes = at_once(*(lambda a=a: attempt_replaces(a) for a in (1, 2, 3)))
    assert all(isinstance(o, CommitOutcome) for o in outcomes), outcomes
    assert sum(1 for o in outcomes if isinstance(o, CommitOutcome) and o.published) == 1
    assert coordinates(root) == Counter({(0, o): 1 for o in range(40)})
    replaced = {v for (_p, o, v) in rows(root) if 10 <= o < 20}
    assert len(replaced) == 1 and replaced != {f"{APP}/1 attempt 1"}, replaced
    assert {v for (_p, o, v) in rows(root) if not 10 <= o < 20} == {f"{APP}/1 attempt 1"}
