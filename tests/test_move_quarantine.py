"""jobs/stage/routing.py's move of the quarantined rows out of the table's attempt folder, on files
(no Spark: the move is pyarrow's, and needs of the quarantine's frame only its columns and
Spark schema)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.stage import routing as stage
from jobs.stage.routing import move_quarantine, routed_folder
from ledger.core.errors import UnreachableError
from ledger.core.layout import QUARANTINE, TABLE

COLUMNS = ["_kafka_topic", "_kafka_partition", "_kafka_offset", "_error", "_raw_value"]


def quarantine_frame() -> Any:
    schema = SimpleNamespace(json=lambda: json.dumps({"type": "struct", "fields": []}))
    return SimpleNamespace(columns=COLUMNS, schema=schema)


def routed_files(tmp_path: Path) -> dict[str, str]:
    """What the one write leaves: quarantined rows with the table's columns too."""
    dirs = {TABLE: str(tmp_path / "t" / "attempt"), QUARANTINE: str(tmp_path / "q" / "attempt")}
    folder = Path(routed_folder(dirs[TABLE], QUARANTINE))
    folder.mkdir(parents=True)
    for part in range(2):
        rows = pa.table(
            {
                "app": ["web", None],
                "_kafka_topic": ["pv", "pv"],
                "_kafka_partition": pa.array([part, part], pa.int32()),
                "_kafka_offset": pa.array([1, 2], pa.int64()),
                "_error": ["bad", "worse"],
                "_raw_value": [b"{", b"["],
            }
        )
        pq.write_table(rows, folder / f"part-{part}.parquet")
    (folder / ".part-0.parquet.crc").write_bytes(b"crc")
    return dirs


def test_the_quarantined_rows_move_with_the_quarantine_s_columns_only(tmp_path: Path) -> None:
    dirs = routed_files(tmp_path)
    move_quarantine(quarantine_frame(), dirs)
    moved = sorted(Path(dirs[QUARANTINE]).glob("*.parquet"))
    assert [p.name for p in moved] == ["part-0.parquet", "part-1.parquet"]
    for path in moved:
        table = pq.read_table(path)
        assert table.column_names == COLUMNS
        assert table.num_rows == 2
        assert b"org.apache.spark.sql.parquet.row.metadata" in (table.schema.metadata or {})
    assert list(Path(routed_folder(dirs[TABLE], QUARANTINE)).iterdir()) == []


def test_a_store_refusing_to_delete_the_originals_does_not_fail_the_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dirs = routed_files(tmp_path)

    def refuse(uri: str) -> bool:
        raise UnreachableError(f"{uri}: the object store failed: SlowDown")

    monkeypatch.setattr(stage.storage, "delete_file", refuse)
    move_quarantine(quarantine_frame(), dirs)
    assert len(list(Path(dirs[QUARANTINE]).glob("*.parquet"))) == 2
