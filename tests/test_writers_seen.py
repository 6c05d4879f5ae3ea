"""resources/delta/writers.py on real delta-rs tables: who else commits batches into a table,
read once per process and then entry by entry, asked only while the pipeline holds nothing
there. The race it closes is tests/test_other_writers.py's (two processes)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from ledger.core.errors import ConfigError
from resources.delta import writers
from resources.delta.writers import WritersSeen, refuse_other_writers


def _commit(uri: str, app_id: str, pipeline: str, topic: str, batch_id: int) -> None:
    meta = {"app_id": app_id, "pipeline": pipeline, "batch_id": batch_id,
            "ranges": [{"topic": topic, "partition": 0, "start": 0, "end": 1}]}  # fmt: skip
    write_deltalake(
        uri,
        pa.table({"x": [batch_id]}),
        mode="append",
        commit_properties=CommitProperties(
            app_transactions=[Transaction(app_id, batch_id)],
            custom_metadata={"exactly": json.dumps(meta)},
        ),
    )


def _meta(app_id: str, pipeline: str, topic: str = "pv") -> dict[str, Any]:
    return {"app_id": app_id, "pipeline": pipeline, "batch_id": 1, "ranges": [{"topic": topic}]}


def test_the_log_is_read_whole_once_then_entry_by_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = str(tmp_path / "t")
    _commit(uri, "a", "a", "pv", 1)
    _commit(uri, "a", "a", "pv", 2)
    read: list[str] = []
    real = writers.storage.read_bytes
    monkeypatch.setattr(writers.storage, "read_bytes", lambda u: read.append(u) or real(u))

    seen = WritersSeen()
    found = seen.through(DeltaTable(uri), uri)
    assert found["a"]["batch_id"] == 2 and found["a"]["topics"] == {"pv"}
    assert len(read) == 2  # versions 1 and 0
    _commit(uri, "b", "b", "orders", 1)
    found = seen.through(DeltaTable(uri), uri)
    assert set(found) == {"a", "b"} and found["b"]["topics"] == {"orders"}
    assert len(read) == 3, read  # only the new entry

    # re-created under the same path: another table, read whole again, the old one forgotten
    shutil.rmtree(uri)
    _commit(uri, "c", "c", "pv", 1)
    assert set(seen.through(DeltaTable(uri), uri)) == {"c"}


def test_a_first_commit_onto_another_pipelines_batches_of_its_topic_is_refused(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "t")
    _commit(uri, "pv", "pv", "pv", 1)
    with pytest.raises(ConfigError, match=r"pipeline pv \(application id pv\)"):
        refuse_other_writers(WritersSeen(), DeltaTable(uri), uri, "copy", _meta("copy", "copy"))
    # another topic may share the table
    refuse_other_writers(WritersSeen(), DeltaTable(uri), uri, "o", _meta("o", "o", "orders"))
    # the pipeline's own backfill is its history
    own = _meta("pv.backfill", "pv")
    refuse_other_writers(WritersSeen(), DeltaTable(uri), uri, "pv.backfill", own)


def test_once_the_pipeline_holds_a_batch_the_log_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backfill's first commit into the pipeline's table, or a derived output's under the
    backfill's id: the live id is there, so whoever came since was refused at their own
    first commit, and a long table's log is not read for it."""
    uri = str(tmp_path / "t")
    _commit(uri, "pv.derived.views", "pv", "pv", 4)
    monkeypatch.setattr(writers.storage, "read_bytes", lambda u: pytest.fail(f"read {u}"))
    app = "pv.backfill.derived.views"
    refuse_other_writers(WritersSeen(), DeltaTable(uri), uri, app, _meta(app, "pv"))
