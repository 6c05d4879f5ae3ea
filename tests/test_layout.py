"""The storage layout the stage, the publisher and the cleaner share (ledger/core/layout.py):
a folder the stage writes must be one the cleaner recognizes, or its orphans are never
cleaned (invariant 18); nothing else under a table may be taken for one."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.maintenance.cleaner import staged_root
from jobs.stage.routing import routed_folder
from jobs.stage.staging import attempt_folder
from ledger.core.layout import (
    DERIVED_PREFIX,
    QUARANTINE,
    TABLE,
    attempt_folder_of,
    attempt_path,
    derived_target,
    is_derived,
)
from resources.object_storage import storage

APP = "exactly-pageviews"


@pytest.mark.parametrize("root", ["/data/pageviews", "s3://bucket/pageviews"])
@pytest.mark.parametrize("app_id", [APP, f"{APP}.backfill"])
def test_a_file_the_stage_writes_is_in_the_attempt_folder_the_cleaner_finds(
    root: str, app_id: str
) -> None:
    folder = attempt_folder(root, app_id, 7, 2, "c0ffee")
    written = storage.join(routed_folder(folder, TABLE), "part-00000.snappy.parquet")
    # the cleaner lists below its staged root and groups by what the layout says
    assert written.startswith(staged_root(root, app_id) + "/")
    found = attempt_folder_of(storage.relative(written, root), app_id)
    assert found is not None
    assert storage.join(root, found) == folder


def test_the_attempt_folder_is_unique_to_batch_attempt_and_token() -> None:
    folders = {
        attempt_path(APP, batch, attempt, token)
        for batch in (1, 2)
        for attempt in (1, 2)
        for token in ("aaaa", "bbbb")
    }
    assert len(folders) == 8
    assert attempt_path(APP, 7, 1, "aaaa") == f"staged/{APP}/batch-000000000007-attempt-1-aaaa"


@pytest.mark.parametrize(
    "path",
    [
        "_delta_log/00000000000000000001.json",
        "part-00000.parquet",
        f"staged/{APP}.backfill/batch-000000000001-attempt-1-aaaa/x.parquet",
        f"staged/{APP}",
        f"staged/{APP}/",
        f"staged-old/{APP}/batch-000000000001-attempt-1-aaaa/x.parquet",
    ],
)
def test_nothing_outside_the_application_s_staged_folder_is_an_attempt_s(path: str) -> None:
    assert attempt_folder_of(path, APP) is None


def test_a_local_root_round_trips_through_the_file_system(tmp_path: Path) -> None:
    folder = Path(attempt_folder(str(tmp_path), APP, 3, 1, "tok"))
    (folder / "exactly_output=table").mkdir(parents=True)
    (folder / "exactly_output=table" / "part-0.parquet").write_bytes(b"")
    for info in storage.list_files(staged_root(str(tmp_path), APP)):
        found = attempt_folder_of(storage.relative(info.uri, str(tmp_path)), APP)
        assert found is not None and Path(tmp_path, found) == folder


def test_derived_targets_are_told_from_the_table_and_the_quarantine() -> None:
    target = derived_target("views_per_app")
    assert target == f"{DERIVED_PREFIX}views_per_app" and is_derived(target)
    assert not is_derived(TABLE) and not is_derived(QUARANTINE)
