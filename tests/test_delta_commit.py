"""The commit half of the protocol on real Delta tables (delta-rs, resources/delta/commit.py).

Invariant 2 lives here, not in the coordinator: after a crash between the Delta commit and
the ledger's COMMITTED (crash point `after_delta_commit`), recovery publishes the voted
batch again, and a takeover can race the attempt it replaced to the table. Only the table's
application transaction version, read and committed as a compare-and-set by `DeltaTarget`,
keeps the second publish from adding a second copy. These tests publish one batch twice,
and from several threads at once, and count the rows by coordinates.

A `DeltaTarget` keeps its table open between batches (one per thread) and brings it up to
date incrementally; the tests at the end hold it to reading exactly what a fresh load of
the table reads: after another writer's commit, after the table was deleted and created
again underneath it (with fewer, as many or more versions than it had), after a failed
commit.
"""

from __future__ import annotations

import shutil
import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError

from ledger.core.batch import StagedFile
from ledger.core.errors import InconsistencyError
from ledger.core.protocol import OffsetRange
from resources.delta.commit import CommitOutcome
from resources.delta.stats import delta_stats, stats_json
from resources.delta.table import DeltaTarget
from resources.object_storage import storage

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
        stats_json(delta_stats(pq.read_metadata(path))),
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


def test_a_replace_rewrites_a_staged_file_with_the_table_s_columns_only(tmp_path: Path) -> None:
    """A file the stage's routed write produced holds `_error` and `_raw_value` (always
    null) beside the table's columns; the file a replace rewrites from it holds only the
    table's, and its statistics name only those."""
    root = tmp_path / "table"
    first = staged(root, APP, 1, 1, OffsetRange(TOPIC, 0, 0, 20))
    path = root / first.path
    extra = pq.read_table(path)
    extra = extra.append_column("_error", pa.nulls(extra.num_rows, pa.string()))
    extra = extra.append_column("_raw_value", pa.nulls(extra.num_rows, pa.binary()))
    pq.write_table(extra, path)
    info = storage.file_info(str(path))
    meta = pq.read_metadata(path)
    first = StagedFile(
        "table",
        first.path,
        info.size,
        first.records,
        info.modification_time_ms,
        stats_json(delta_stats(meta, SCHEMA.names)),
    )
    target = DeltaTarget(str(root))
    common = {"schema": SCHEMA, "metadata": {}}
    assert target.publish(app_id=APP, batch_id=1, files=[first], **common).published
    rng = OffsetRange(TOPIC, 0, 5, 10)
    backfill = f"{APP}.backfill"
    outcome = target.replace(
        app_id=backfill,
        batch_id=1,
        files=[staged(root, backfill, 1, 1, rng)],
        ranges=[rng],
        rewrite_dir=str(root / "_staged" / backfill / "batch-1-attempt-1-rewrites"),
        **common,
    )
    assert outcome.published
    assert coordinates(root) == Counter({(0, o): 1 for o in range(20)})
    rewritten = list((root / "_staged" / backfill).glob("*-rewrites/*.parquet"))
    assert len(rewritten) == 1
    assert pq.read_schema(rewritten[0]).names == SCHEMA.names
    assert set(delta_stats(pq.read_metadata(rewritten[0]))["nullCount"]) == set(SCHEMA.names)


# -- the table kept open between batches -------------------------------------------------------


def publish_batches(target: DeltaTarget, root: Path, batch_ids: Sequence[int]) -> None:
    """One commit per batch id, each of 10 offsets of partition 0 of its own."""
    for batch_id in batch_ids:
        rng = OffsetRange(TOPIC, 0, 10 * batch_id, 10 * batch_id + 10)
        assert publish(target, root, batch_id, 1, rng).published


def recreate(root: Path, batch_ids: Sequence[int]) -> None:
    """Delete the table and create it again, one commit per batch id (versions 0 to
    len(batch_ids)), through a DeltaTarget of its own: an operator, or a hostile tester,
    underneath a process that keeps the old table open."""
    shutil.rmtree(root)
    publish_batches(DeltaTarget(str(root)), root, batch_ids)


def assert_reads_as_fresh(target: DeltaTarget, root: Path) -> DeltaTable:
    """The target's table is the table as a fresh load reads it: same version, same
    incarnation (metadata id), same files, same rows, same application version."""
    kept = target.load()
    assert kept is not None
    fresh = DeltaTable(str(root))
    assert kept.version() == fresh.version()
    assert kept.metadata().id == fresh.metadata().id
    assert sorted(kept.file_uris()) == sorted(fresh.file_uris())
    assert kept.transaction_version(APP) == fresh.transaction_version(APP)
    assert (
        kept.to_pyarrow_table()
        .sort_by("_kafka_offset")
        .equals(fresh.to_pyarrow_table().sort_by("_kafka_offset"))
    )
    return kept


def test_a_log_entry_fingerprint_tells_a_rewritten_file_apart(tmp_path: Path) -> None:
    """A file written again at the same name with the same size is another file (ext4
    even hands it the deleted file's inode), and a missing one has no fingerprint."""
    entry = tmp_path / "_delta_log" / f"{3:020d}.json"
    assert storage.fingerprint(str(entry)) is None
    entry.parent.mkdir()
    entry.write_text('{"commitInfo":{"timestamp":1}}')
    first = storage.fingerprint(str(entry))
    assert first is not None and storage.fingerprint(str(entry)) == first
    assert storage.fingerprint(entry.as_uri()) == first

    shutil.rmtree(entry.parent)
    entry.parent.mkdir()
    entry.write_text('{"commitInfo":{"timestamp":2}}')
    assert storage.fingerprint(str(entry)) not in (None, first)


def test_the_table_is_kept_open_per_thread(tmp_path: Path) -> None:
    """Every load in one thread answers with the same table, brought up to date; another
    thread gets a table of its own (delta-rs tables are not shared between threads)."""
    root = tmp_path / "table"
    target = DeltaTarget(str(root))
    assert target.load() is None
    publish_batches(target, root, [1])
    kept = target.load()
    assert kept is not None and target.load() is kept

    seen: list[DeltaTable | None] = []
    worker = threading.Thread(target=lambda: seen.extend([target.load(), target.load()]))
    worker.start()
    worker.join(timeout=60)
    assert seen[0] is not None and seen[0] is seen[1] and seen[0] is not kept
    assert target.load() is kept


def test_a_kept_table_sees_another_writers_commits(tmp_path: Path) -> None:
    """Commits by another DeltaTarget, and by delta-rs directly, reach the kept table, the
    application version the commit's compare-and-set reads included."""
    root = tmp_path / "table"
    target = DeltaTarget(str(root))
    publish_batches(target, root, [1])
    kept = target.load()

    publish_batches(DeltaTarget(str(root)), root, [2, 3])
    assert target.transaction_version(APP) == 3
    assert assert_reads_as_fresh(target, root) is kept
    assert not publish(target, root, 3, 2, OffsetRange(TOPIC, 0, 30, 40)).published

    extra = pa.table(
        {"_kafka_topic": [TOPIC], "_kafka_partition": [5], "_kafka_offset": [0], "value": ["x"]},
        schema=SCHEMA,
    )
    write_deltalake(str(root), extra, mode="append")
    assert assert_reads_as_fresh(target, root) is kept
    assert publish(target, root, 4, 1, OffsetRange(TOPIC, 0, 40, 50)).published
    assert coordinates(root) == Counter({(5, 0): 1, **{(0, o): 1 for o in range(10, 50)}})


def test_a_load_with_nothing_new_does_not_read_the_log_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """delta-rs lists the whole `_delta_log` folder on every update (locally: every entry
    the log still keeps, so its cost grows with history), even when nothing is new. A load
    whose next log entry is not there has nothing to read: it updates nothing, and still
    sees the next commit, its own or another writer's, as soon as that entry is there."""
    root = tmp_path / "table"
    target = DeltaTarget(str(root))
    publish_batches(target, root, [1, 2])
    kept = target.load()
    updates: list[int] = []
    real = DeltaTable.update_incremental
    monkeypatch.setattr(
        DeltaTable,
        "update_incremental",
        lambda self, *a, **k: (
            updates.extend([self.version()] if self is kept else []),
            real(self, *a, **k),
        )[1],
    )
    assert target.load() is kept and target.transaction_version(APP) == 2
    assert updates == []

    publish_batches(DeltaTarget(str(root)), root, [3])
    assert assert_reads_as_fresh(target, root) is kept
    assert kept.version() == 3 and updates == [2]
    assert publish(target, root, 4, 1, OffsetRange(TOPIC, 0, 40, 50)).published
    assert assert_reads_as_fresh(target, root) is kept and kept.transaction_version(APP) == 4

    # the same through a file:// URI: the look for the next entry must find it there too
    by_uri = DeltaTarget(root.as_uri())
    assert by_uri.transaction_version(APP) == 4
    kept_by_uri = by_uri.load()
    publish_batches(target, root, [5])
    assert by_uri.transaction_version(APP) == 5 and by_uri.load() is kept_by_uri


def test_an_application_version_is_read_once_per_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """delta-rs scans the snapshot on every `transaction_version`; a target answers each
    app id once per version of its kept table, and a new version (its own commit or
    another writer's) is asked again."""
    root = tmp_path / "table"
    target = DeltaTarget(str(root))
    publish_batches(target, root, [1, 2])
    kept = target.load()
    asked: list[str] = []  # of the kept table only, not of the other writer's
    real = DeltaTable.transaction_version

    def counted(self: DeltaTable, app_id: str) -> int | None:
        if self is kept:
            asked.append(app_id)
        return real(self, app_id)

    monkeypatch.setattr(DeltaTable, "transaction_version", counted)
    answers = [target.transaction_version(a) for a in (APP, "other", APP, "other", APP)]
    assert answers == [2, None, 2, None, 2] and asked == [APP, "other"]

    publish_batches(DeltaTarget(str(root)), root, [3])
    assert target.transaction_version(APP) == 3 and asked == [APP, "other", APP]
    publish_batches(target, root, [4])
    assert target.transaction_version(APP) == 4 and target.transaction_version(APP) == 4
    assert target.load() is kept
    assert asked.count(APP) == 4  # one more for the commit's own check, one for the answer


def test_time_travel_leaves_the_kept_table_at_the_latest_version(tmp_path: Path) -> None:
    """A batch's history reads the table as of its commit: from a table of its own."""
    root = tmp_path / "table"
    target = DeltaTarget(str(root))
    publish_batches(target, root, [1, 2, 3])
    kept = target.load()
    assert kept is not None

    then = target.stats(APP, version=1)
    assert then is not None and (then.version, then.row_count, then.app_version) == (1, 10, 1)
    assert target.load() is kept and kept.version() == 3
    now = target.stats(APP)
    assert now is not None and (now.version, now.row_count, now.app_version) == (3, 30, 3)


def test_a_table_recreated_with_fewer_versions_is_read_afresh(tmp_path: Path) -> None:
    """The kept table is at version 4; the table is deleted and created again with 2
    versions. Its answers come from the new table, never the old one: the old one's
    application version (4) would make batch 5 look committed already. And this process,
    which saw batch 4 there, commits nothing into a table that went back to batch 2
    (resources/delta/held.py); a new one, which never saw the old table, does."""
    root = tmp_path / "table"
    target = DeltaTarget(str(root))
    publish_batches(target, root, [1, 2, 3, 4])
    assert target.transaction_version(APP) == 4

    recreate(root, [2])
    assert target.transaction_version(APP) == 2
    assert assert_reads_as_fresh(target, root).version() == 1
    with pytest.raises(InconsistencyError, match=r"held batch 4 of \S+ and holds only batch 2 now"):
        publish(target, root, 3, 1, OffsetRange(TOPIC, 0, 30, 40))
    assert coordinates(root) == Counter({(0, o): 1 for o in range(20, 30)})
    assert publish(DeltaTarget(str(root)), root, 3, 1, OffsetRange(TOPIC, 0, 30, 40)).published
    assert coordinates(root) == Counter({(0, o): 1 for o in [*range(20, 30), *range(30, 40)]})


def test_a_table_recreated_with_as_many_versions_is_read_afresh(tmp_path: Path) -> None:
    """Same version number, other table: nothing newer to read, so only the log entry of
    the kept version tells that the table under it is not the one it read."""
    root = tmp_path / "table"
    target = DeltaTarget(str(root))
    publish_batches(target, root, [1, 2, 3])
    assert target.transaction_version(APP) == 3

    recreate(root, [7, 8, 9])
    assert target.transaction_version(APP) == 9
    assert assert_reads_as_fresh(target, root).version() == 3
    assert publish(target, root, 10, 1, OffsetRange(TOPIC, 0, 100, 110)).published
    assert coordinates(root) == Counter({(0, o): 1 for o in range(70, 110)})


def test_a_table_recreated_with_more_versions_is_read_afresh(tmp_path: Path) -> None:
    """The new table's later versions would apply cleanly on top of the old table's
    files, mixing both tables; the kept table is dropped instead."""
    root = tmp_path / "table"
    target = DeltaTarget(str(root))
    publish_batches(target, root, [1, 2])
    assert target.transaction_version(APP) == 2

    recreate(root, [11, 12, 13, 14, 15])
    assert target.transaction_version(APP) == 15
    assert assert_reads_as_fresh(target, root).version() == 5
    assert publish(target, root, 16, 1, OffsetRange(TOPIC, 0, 160, 170)).published
    assert coordinates(root) == Counter({(0, o): 1 for o in range(110, 170)})


def test_a_load_after_a_failed_commit_is_fresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit that raised may have committed (here it did: the log entry is written, and
    reading it back after it fails, as a store whose listing lags the write makes it fail),
    so the table object it went through is not trusted again: the retry, and every later
    load, read the table afresh, and find the batch committed."""
    root = tmp_path / "table"
    DeltaTable.create(str(root), schema=SCHEMA)
    target = DeltaTarget(str(root))
    publish_batches(target, root, [1, 2])
    kept = target.load()
    assert kept is not None and kept.version() == 2
    real = DeltaTable.update_incremental
    failures = iter([DeltaError("listing lags the write")])

    def after_the_write(table: DeltaTable) -> None:
        if (
            table is kept
            and table.version() == 2
            and (root / "_delta_log" / f"{3:020d}.json").exists()
        ):
            failure = next(failures, None)
            if failure is not None:
                raise failure
        real(table)

    monkeypatch.setattr(DeltaTable, "update_incremental", after_the_write)
    outcome = publish(target, root, 3, 1, OffsetRange(TOPIC, 0, 30, 40))
    monkeypatch.undo()

    assert outcome.published and outcome.tries == 2 and outcome.table_version == 3
    assert assert_reads_as_fresh(target, root) is not kept
    assert coordinates(root) == Counter({(0, o): 1 for o in range(10, 40)})


def test_a_table_created_with_a_timestamp_ntz_column_stays_readable_by_delta_spark(
    tmp_path: Path,
) -> None:
    """delta-rs creates such a table at writer version 7 naming timestampNtz alone, and
    delta-spark refuses to open it while a column is NOT NULL (the coordinates are): the
    invariants feature is in use but not in the protocol (tests/test_types.py reads one).
    The create names what writer version 2 implied, once."""
    uri = str(tmp_path / "table")
    schema = pa.schema(
        [pa.field("_kafka_offset", pa.int64(), nullable=False), ("ts", pa.timestamp("us"))]
    )
    target = DeltaTarget(uri)
    target.ensure_table(schema)
    protocol = DeltaTable(uri).protocol()
    assert {"timestampNtz", "invariants", "appendOnly"} <= set(protocol.writer_features or ())
    version = DeltaTable(uri).version()
    target.ensure_table(schema)
    assert DeltaTable(uri).version() == version


def test_a_log_entry_listed_before_its_content_is_readable_is_read_again(
    tmp_path: Path,
) -> None:
    """A store that lists a log entry while its writer is still writing it (s3proxy's
    filesystem backend creates the object with its If-None-Match check, then streams the
    bytes in) shows a version 0 with no metadata. Found by tests/test_s3_commit_race.py on
    a loaded machine: the loser of a race to create the table failed with delta-rs's `No
    table metadata or protocol found`. A fresh load reads such a log again, briefly."""
    made = tmp_path / "made"
    write_deltalake(str(made), pa.table({"x": [1, 2]}))
    root = tmp_path / "table"
    shutil.copytree(made, root)
    entry = root / "_delta_log" / "00000000000000000000.json"
    content = entry.read_bytes()
    entry.write_bytes(b"")  # listed, not yet written

    writer = threading.Timer(0.4, entry.write_bytes, args=(content,))
    writer.start()
    try:
        table = DeltaTarget(str(root)).load()
    finally:
        writer.join()
    assert table is not None and table.version() == 0
    assert table.to_pyarrow_table()["x"].to_pylist() == [1, 2]


def test_a_log_that_never_gets_its_metadata_is_not_a_delta_table(tmp_path: Path) -> None:
    from ledger.core.errors import ConfigError

    log = tmp_path / "table" / "_delta_log"
    log.mkdir(parents=True)
    (log / "00000000000000000000.json").write_text('{"commitInfo": {"timestamp": 1}}\n')
    with pytest.raises(ConfigError, match=r"`.*/table` is not a Delta table \(delta-rs: "):
        DeltaTarget(str(tmp_path / "table")).load()
