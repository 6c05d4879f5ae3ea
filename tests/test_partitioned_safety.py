"""A date-partitioned table's files live in partition folders below each attempt's folder:
the cleaner must delete an abandoned attempt's and never a committed one (invariant 18),
and a voted file lost from a partition folder must be staged again (invariant 11). Real
broker, Spark (a crashed `exactly run` too) and Delta."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from jobs.maintenance.cleaner import clean
from ledger.core.protocol import BatchState
from ledger.store.ledger_store import LedgerStore
from tests.fixtures.partitioned import paris_day, produce, run_until_caught_up
from tests.fixtures.pipeline import assert_exactly_once, crash_run


def age_everything(root: str, by: timedelta) -> None:
    """Make every file below `root` look `by` older, past the cleaner's grace period."""
    past = time.time() - by.total_seconds()
    for path in Path(root).rglob("*"):
        if path.is_file():
            os.utime(path, (past, past))


def partition_files(root: str, attempt_folder: str) -> list[Path]:
    """The data files in partition folders below one attempt's folder."""
    return [
        p
        for p in (Path(root) / attempt_folder).rglob("*.parquet")
        if any(part.startswith("event_date=") for part in p.parts)
    ]


def check_rows_in_their_days(config: Any, instants: dict[str, Any]) -> None:
    """Every add action names a file that exists, and each row is in its Paris day."""
    uri = config.delta.table_uri
    table = DeltaTable(uri)
    for add in pa.table(table.get_add_actions(flatten=True)).to_pylist():
        assert (Path(uri) / add["path"]).is_file(), add["path"]
    rows = table.to_pyarrow_table(columns=["event_id", "event_date"]).to_pylist()
    assert sorted((r["event_id"], r["event_date"]) for r in rows) == sorted(
        (e, paris_day(t)) for e, t in instants.items()
    )


def test_the_cleaner_deletes_an_abandoned_attempts_partition_folders_and_no_committed_file(
    spark: Any, kafka_client: Any, partitioned_factory: Any
) -> None:
    config = partitioned_factory(2, max_records=30)
    instants = produce(kafka_client, config, 40)
    run_until_caught_up(config, spark)
    # a run that dies after staging a batch, before its vote
    instants.update(produce(kafka_client, config, 20, first=40))
    crash_run(config, "after_stage")
    store = LedgerStore(config.ledger.url)
    try:
        staged = [b for b in store.batches(app_id=config.app_id) if b.state is BatchState.STAGED]
        assert len(staged) == 1
        (folder,) = {
            f
            for f in Path(config.delta.table_uri, "staged", config.app_id).iterdir()
            if f.name.endswith(staged[0].token)
        }
    finally:
        store.dispose()
    abandoned = partition_files(
        config.delta.table_uri, str(folder.relative_to(config.delta.table_uri))
    )
    assert len({p.parent.name for p in abandoned}) >= 2  # several partition folders
    run_until_caught_up(config, spark)  # abandons it and stages the range again
    # with the ledger lost and rebuilt from the logs, no vote keeps a committed file: only
    # the Delta log does, by paths in partition folders
    Path(config.ledger.url.removeprefix("sqlite:///")).unlink()
    run_until_caught_up(config, spark)

    age_everything(config.delta.table_uri, timedelta(days=2))
    age_everything(config.delta.quarantine_uri, timedelta(days=2))
    report = clean(config, older_than=timedelta(hours=24), dry_run=False)

    assert not any(p.exists() for p in abandoned)
    deleted = {v.entry.path for v in report.deleted}
    assert {str(p.relative_to(config.delta.table_uri)) for p in abandoned} <= deleted
    committed = set(
        pa.table(DeltaTable(config.delta.table_uri).get_add_actions()).column("path").to_pylist()
    )
    assert not committed & deleted
    assert_exactly_once(config, kafka_client)
    check_rows_in_their_days(config, instants)


def test_a_voted_file_lost_from_a_partition_folder_is_staged_again_and_committed_once(
    spark: Any, kafka_client: Any, partitioned_factory: Any
) -> None:
    config = partitioned_factory(2)
    instants = produce(kafka_client, config, 60)
    crash_run(config, "after_prepare")
    store = LedgerStore(config.ledger.url)
    try:
        voted = [f for f in store.files(config.app_id, 1) if f.target == "table" and f.records]
    finally:
        store.dispose()
    assert len({f.path.rsplit("/", 2)[-2] for f in voted}) >= 2  # several partitions
    lost = next(f for f in voted if "event_date=2026-03-02/" in f.path)
    (Path(config.delta.table_uri) / lost.path).unlink()

    run_until_caught_up(config, spark)

    assert_exactly_once(config, kafka_client)
    check_rows_in_their_days(config, instants)
    paths = DeltaTable(config.delta.table_uri).get_add_actions(flatten=True)
    attempt = lost.path.split("/")[2]
    assert not [p for p in paths.column("path").to_pylist() if attempt in p]
    store = LedgerStore(config.ledger.url)
    try:
        batch = store.get(config.app_id, 1)
    finally:
        store.dispose()
    assert batch.state is BatchState.ACKED and batch.metrics["files_missing"] == 1
