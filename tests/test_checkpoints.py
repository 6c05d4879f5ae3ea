"""Checkpoints written beside a batch's commit (resources/delta/checkpoints.py), against real
delta-rs on local disk: the publish that makes a due version returns before its checkpoint
is written, the checkpoint is then there and readable, and one that cannot be written costs
the batch nothing."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from ledger.core.batch import StagedFile
from resources.delta import checkpoints
from resources.delta.stats import delta_stats
from resources.delta.table import DeltaTarget

SCHEMA = pa.schema([("n", pa.int64())])


def staged(root: Path, batch_id: int) -> StagedFile:
    name = f"staged/b{batch_id}.parquet"
    (root / "staged").mkdir(exist_ok=True)
    pq.write_table(pa.table({"n": [batch_id]}, SCHEMA), root / name)
    info = (root / name).stat()
    stats = json.dumps(delta_stats(pq.read_metadata(root / name)))
    return StagedFile("table", name, info.st_size, 1, int(info.st_mtime * 1000), stats)


def publish(target: DeltaTarget, root: Path, batch_id: int) -> None:
    files = [staged(root, batch_id)]
    target.publish(app_id="p", batch_id=batch_id, files=files, schema=SCHEMA, metadata={})


def every_fifth(root: Path) -> DeltaTarget:
    """A table whose checkpoint interval is 5, at version 0."""
    write_deltalake(
        str(root), pa.table({"n": []}, SCHEMA), configuration={"delta.checkpointInterval": "5"}
    )
    return DeltaTarget(str(root))


def disk_full_for_checkpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every checkpoint the module writes fails as on a full disk; the commits do not."""

    class Failing(DeltaTable):  # type: ignore[misc]
        def create_checkpoint(self) -> Any:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoints, "DeltaTable", Failing)


def checkpoint_files(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "_delta_log").glob("*.checkpoint.parquet"))


def test_a_due_version_s_checkpoint_is_written_after_its_commit_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    real = DeltaTable

    class Held(real):  # type: ignore[misc, valid-type]
        def create_checkpoint(self) -> None:
            assert release.wait(30), "the test never let the checkpoint go"
            super().create_checkpoint()

    monkeypatch.setattr(checkpoints, "DeltaTable", Held)
    target = every_fifth(tmp_path)
    for batch_id in range(1, 6):
        publish(target, tmp_path, batch_id)  # version 5 is due: its commit returned all the same
    assert DeltaTable(str(tmp_path)).version() == 5
    assert checkpoint_files(tmp_path) == []
    release.set()
    assert checkpoints.wait_for_checkpoints(30)
    assert checkpoint_files(tmp_path) == ["00000000000000000005.checkpoint.parquet"]
    table = DeltaTable(str(tmp_path))
    assert sorted(table.to_pyarrow_table()["n"].to_pylist()) == [1, 2, 3, 4, 5]
    assert table.transaction_version("p") == 5


def test_a_checkpoint_that_cannot_be_written_costs_the_batch_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    disk_full_for_checkpoints(monkeypatch)
    target = every_fifth(tmp_path)
    with caplog.at_level(logging.WARNING, logger=checkpoints.__name__):
        for batch_id in range(1, 7):
            publish(target, tmp_path, batch_id)
        assert checkpoints.wait_for_checkpoints(30)
    assert checkpoint_files(tmp_path) == []
    assert "checkpoint of" in caplog.text and "No space left on device" in caplog.text
    assert DeltaTable(str(tmp_path)).transaction_version("p") == 6


def test_no_checkpoint_is_asked_for_between_due_versions() -> None:
    class Table:
        def __init__(self, version: int, interval: str | None) -> None:
            self._version, self._interval = version, interval

        def version(self) -> int:
            return self._version

        def metadata(self) -> Any:
            config = {} if self._interval is None else {"delta.checkpointInterval": self._interval}
            return type("M", (), {"configuration": config})()

    assert checkpoints.due_version(Table(100, None), 99) == 100  # type: ignore[arg-type]
    assert checkpoints.due_version(Table(99, None), 98) is None  # type: ignore[arg-type]
    # another writer's commit came in between: the first version past the multiple is taken
    assert checkpoints.due_version(Table(11, "5"), 9) == 11  # type: ignore[arg-type]
    assert checkpoints.due_version(Table(12, "5"), 11) is None  # type: ignore[arg-type]


def test_a_checkpoint_missed_by_an_earlier_process_is_written_by_the_next_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that ended before its checkpoint was written (the store was down, or it
    left the write at exit) leaves the table an interval or more past its newest checkpoint;
    the next process's first commit writes it, not the next multiple of the interval."""
    disk_full_for_checkpoints(monkeypatch)
    first = every_fifth(tmp_path)
    for batch_id in range(1, 7):  # version 5 was due, and is not written
        publish(first, tmp_path, batch_id)
    assert checkpoints.wait_for_checkpoints(30)
    assert checkpoint_files(tmp_path) == []

    monkeypatch.setattr(checkpoints, "DeltaTable", DeltaTable)
    monkeypatch.setattr(checkpoints, "_seen", set())  # the next process: its first commit
    publish(DeltaTarget(str(tmp_path)), tmp_path, 7)  # version 7: no multiple of 5 passed
    assert checkpoints.wait_for_checkpoints(30)
    assert checkpoint_files(tmp_path) == ["00000000000000000007.checkpoint.parquet"]
    assert DeltaTable(str(tmp_path)).transaction_version("p") == 7
    publish(DeltaTarget(str(tmp_path)), tmp_path, 8)  # now one behind: nothing due
    assert checkpoints.wait_for_checkpoints(30)
    assert checkpoint_files(tmp_path) == ["00000000000000000007.checkpoint.parquet"]


def test_how_far_behind_its_newest_checkpoint_a_table_may_fall() -> None:
    class Table:
        def __init__(self, version: int) -> None:
            self._version = version

        def version(self) -> int:
            return self._version

        def metadata(self) -> Any:
            return type("M", (), {"configuration": {"delta.checkpointInterval": "5"}})()

    due = checkpoints.due_version
    assert due(Table(7), 6, newest=-1) == 7  # type: ignore[arg-type]  # none yet, 5 passed
    assert due(Table(7), 6, newest=2) == 7  # type: ignore[arg-type]
    assert due(Table(7), 6, newest=5) is None  # type: ignore[arg-type]
    assert due(Table(4), 3, newest=-1) is None  # type: ignore[arg-type]  # young table
    assert due(Table(7), 6, newest=None) is None  # type: ignore[arg-type]  # unknown
    assert due(Table(10), 9, newest=9) == 10  # type: ignore[arg-type]  # a multiple still is


def test_the_newest_checkpoint_is_read_beside_the_commit_not_inside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first commit of a process looks for a checkpoint an earlier one missed: that read
    of `_last_checkpoint` is the store's to answer, and must not hold the batch's commit."""
    disk_full_for_checkpoints(monkeypatch)
    first = every_fifth(tmp_path)
    for batch_id in range(1, 7):
        publish(first, tmp_path, batch_id)
    assert checkpoints.wait_for_checkpoints(30)
    monkeypatch.setattr(checkpoints, "DeltaTable", DeltaTable)
    monkeypatch.setattr(checkpoints, "_seen", set(), raising=False)

    committed, waited = threading.Event(), []
    read = checkpoints.newest_checkpoint

    def slow_store(uri: str) -> int | None:
        waited.append(committed.wait(30))  # answers only once the commit has returned
        return read(uri)

    monkeypatch.setattr(checkpoints, "newest_checkpoint", slow_store)
    publish(DeltaTarget(str(tmp_path)), tmp_path, 7)
    committed.set()
    assert checkpoints.wait_for_checkpoints(30)
    assert waited == [True]
    assert checkpoint_files(tmp_path) == ["00000000000000000007.checkpoint.parquet"]


def test_a_table_that_sets_no_interval_is_checkpointed_every_ten_versions(
    tmp_path: Path,
) -> None:
    """Delta's own default (delta-spark's), not delta-rs's 100: a kept table replays every
    commit since its checkpoint on each update, so at 100 a commit's cost grew by a third of
    a millisecond per commit since the last one (BENCHMARKS.md, "Checkpoints every ten
    versions"). A table that sets its interval keeps it."""
    own, default = tmp_path / "own", tmp_path / "default"
    write_deltalake(str(default), pa.table({"n": []}, SCHEMA))
    write_deltalake(
        str(own), pa.table({"n": []}, SCHEMA), configuration={"delta.checkpointInterval": "100"}
    )
    for root in (own, default):
        target = DeltaTarget(str(root))
        for batch_id in range(1, 21):
            publish(target, root, batch_id)
    assert checkpoints.wait_for_checkpoints(30)
    assert checkpoint_files(own) == []
    assert checkpoint_files(default) == [
        "00000000000000000010.checkpoint.parquet",
        "00000000000000000020.checkpoint.parquet",
    ]
    assert DeltaTable(str(default)).transaction_version("p") == 20
