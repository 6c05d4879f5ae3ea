"""Cleaning staged orphans (`exactly clean`, the `<pipeline>_clean` job, invariant 18): only
files that no vote names, that no version of either table still names, that no batch in
flight may still vote or publish, and that are older than the grace period are deleted.

The unit tests start no JVM: a real SQLite ledger written through LedgerStore, real delta-rs
tables written through the pipeline's DeltaPublisher, real Parquet files in the attempt
folders the stage job uses, their modification times moved back to stand for elapsed time.
The integration tests crash a real `exactly run` and VACUUM the tables with delta-spark.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from deltalake import DeltaTable

from jobs.examples.sample_data import pageviews
from jobs.publish.delta_publisher import DeltaPublisher
from jobs.stage import parquet_files
from jobs.stage.staging import attempt_folder
from jobs.wiring.pipeline import build
from ledger.coordinator.two_phase import TwoPhaseCommit
from ledger.core.backfill import backfill_app_id
from ledger.core.batch import Batch, BatchKind, StagedFile, utcnow
from ledger.core.errors import ConfigError, InconsistencyError
from ledger.core.layout import QUARANTINE, TABLE
from ledger.core.protocol import BatchState, OffsetRange, Owner
from ledger.store.ledger_store import LedgerStore
from resources.config.loading import load_config
from resources.config.pipeline_config import PipelineConfig
from resources.delta.schema import encode_schema
from tests.fixtures.batches import a_batch
from tests.fixtures.pipeline import assert_exactly_once, config_path, crash_run

S = BatchState
TOPIC = "pv"
REPO = Path(__file__).resolve().parent.parent
EXACTLY = [sys.executable, "-m", "exactly_cli"]
SCHEMA = pa.schema(
    [
        ("_kafka_topic", pa.string()),
        ("_kafka_partition", pa.int32()),
        ("_kafka_offset", pa.int64()),
        ("value", pa.string()),
    ]
)
SCHEMAS = {TABLE: encode_schema(SCHEMA), QUARANTINE: encode_schema(SCHEMA)}
DAY = timedelta(days=1)


# -- building real state ------------------------------------------------------------------


@pytest.fixture
def config(tmp_path: Path) -> PipelineConfig:
    doc = {
        "pipeline": "pv",
        "kafka": {"bootstrap_servers": "127.0.0.1:9", "topic": TOPIC},
        "delta": {
            "table_uri": str(tmp_path / "table"),
            "quarantine_uri": str(tmp_path / "quarantine"),
        },
        "ledger": {"url": f"sqlite:///{tmp_path / 'ledger.db'}"},
    }
    path = tmp_path / "pv.yaml"
    path.write_text(yaml.safe_dump(doc))
    loaded = load_config(path)
    object.__setattr__(loaded, "_path", path)
    return loaded


@pytest.fixture
def store(config: PipelineConfig) -> Iterator[LedgerStore]:
    ledger = LedgerStore(config.ledger.url)
    try:
        yield ledger
    finally:
        ledger.dispose()


def with_ledger(config: PipelineConfig, url: str) -> PipelineConfig:
    return config.model_copy(update={"ledger": config.ledger.model_copy(update={"url": url})})


def roots(config: PipelineConfig) -> dict[str, str]:
    return {TABLE: config.delta.table_uri, QUARANTINE: config.delta.quarantine_uri}


def folder_of(config: PipelineConfig, batch: Batch, target: str = TABLE) -> Path:
    """The attempt folder the stage job writes `batch`'s current attempt into."""
    folder = attempt_folder(
        roots(config)[target], batch.app_id, batch.batch_id, batch.attempt, batch.token
    )
    return Path(folder)


def plan(
    store: LedgerStore,
    config: PipelineConfig,
    *,
    app_id: str | None = None,
    owner: Owner | None = None,
    ranges: list[OffsetRange] | None = None,
    params: dict[str, Any] | None = None,
) -> Batch:
    """A PLANNED batch: the live pipeline's next 3 offsets, or `ranges` for a backfill."""
    live = app_id is None

    def ranges_for(positions: Any) -> list[OffsetRange]:
        if ranges is not None:
            return ranges
        start = positions.get(0, 0)
        return [OffsetRange(TOPIC, 0, start, start + 3)]

    batch = store.plan(
        pipeline=config.pipeline,
        app_id=app_id or config.app_id,
        kind=BatchKind.LIVE if live else BatchKind.BACKFILL,
        ranges_for=ranges_for,
        owner=owner,
        params=params,
        contiguous=live,
    )
    assert batch is not None
    return batch


def stage(
    config: PipelineConfig, batch: Batch, targets: Iterable[str] = (TABLE, QUARANTINE)
) -> list[StagedFile]:
    """Write what the stage job writes for `batch` (a Parquet part file and Spark's _SUCCESS
    marker in each target's attempt folder) and describe it as the vote would."""
    files: list[StagedFile] = []
    rng = batch.ranges[0]
    for target in targets:
        folder = folder_of(config, batch, target)
        folder.mkdir(parents=True)
        offsets = list(range(rng.start, rng.end))
        data = pa.table(
            {
                "_kafka_topic": [rng.topic] * len(offsets),
                "_kafka_partition": pa.array([rng.partition] * len(offsets), pa.int32()),
                "_kafka_offset": offsets,
                "value": [f"{target}-{o}" for o in offsets],
            },
            schema=SCHEMA,
        )
        pq.write_table(data, folder / "part-00000.snappy.parquet")
        (folder / "_SUCCESS").write_text("")
        files += parquet_files.describe(str(folder), roots(config)[target], target)
    return files


def prepare(store: LedgerStore, config: PipelineConfig, batch: Batch) -> Batch:
    files = stage(config, batch)
    batch = store.transition(batch, S.STAGED)
    return store.transition(batch, S.PREPARED, files=files, schemas=SCHEMAS)


def commit(store: LedgerStore, config: PipelineConfig, batch: Batch) -> Batch:
    result = DeltaPublisher.for_config(config).publish(
        batch, store.files(batch.app_id, batch.batch_id)
    )
    batch = store.transition(batch, S.COMMITTED, table_version=result.table_version)
    return store.transition(batch, S.ACKED)


def aborted(store: LedgerStore, config: PipelineConfig) -> Batch:
    """A batch that staged both outputs and was abandoned before its vote: its folders are
    orphans."""
    batch = plan(store, config)
    stage(config, batch)
    batch = store.transition(batch, S.STAGED)
    return store.transition(batch, S.ABORTED, error="abandoned by recovery (test)")


def age(path: Path, by: timedelta) -> None:
    """Make every file under `path` look written `by` ago."""
    when = time.time() - by.total_seconds()
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            os.utime(Path(dirpath, name), (when, when))


def files_under(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()}


def clean(config: PipelineConfig, older_than: str = "24h", dry_run: bool = False) -> Any:
    from jobs.maintenance.cleaner import clean as run_clean
    from ledger.core.cleaning import parse_duration

    return run_clean(config, older_than=parse_duration(older_than), dry_run=dry_run)


def paths(verdicts: Iterable[Any]) -> set[str]:
    return {v.entry.path for v in verdicts}


# -- what goes and what stays -------------------------------------------------------------


def test_orphans_of_an_aborted_attempt_are_deleted(
    store: LedgerStore, config: PipelineConfig
) -> None:
    done = commit(store, config, prepare(store, config, plan(store, config)))
    gone = aborted(store, config)
    age(Path(config.delta.table_uri), 2 * DAY)
    age(Path(config.delta.quarantine_uri), 2 * DAY)

    report = clean(config)

    for target in (TABLE, QUARANTINE):
        assert not folder_of(config, gone, target).exists()
        assert folder_of(config, done, target).exists()
    assert report.files_deleted == 4 and report.bytes_deleted > 0
    assert {v.entry.target for v in report.deleted} == {TABLE, QUARANTINE}
    # the committed batch is whole and readable; the ledger is untouched
    assert DeltaTable(config.delta.table_uri).to_pyarrow_table().num_rows == 3
    assert store.get(config.app_id, gone.batch_id).state is S.ABORTED


def test_a_prepared_batchs_files_are_kept_whatever_their_age(
    store: LedgerStore, config: PipelineConfig
) -> None:
    commit(store, config, prepare(store, config, plan(store, config)))
    voted = prepare(store, config, plan(store, config))
    before = (
        files_under(Path(config.delta.table_uri)),
        files_under(Path(config.delta.quarantine_uri)),
    )
    age(Path(config.delta.table_uri), 30 * DAY)
    age(Path(config.delta.quarantine_uri), 30 * DAY)

    report = clean(config, older_than="0s")

    voted_paths = {f.path for f in store.files(voted.app_id, voted.batch_id)}
    assert voted_paths <= paths(report.kept)
    # nothing went: the voted files, and Spark's markers beside them (folders go whole)
    assert report.files_deleted == 0
    after = (
        files_under(Path(config.delta.table_uri)),
        files_under(Path(config.delta.quarantine_uri)),
    )
    assert after == before


def test_a_committed_batchs_files_are_kept(store: LedgerStore, config: PipelineConfig) -> None:
    done = commit(store, config, prepare(store, config, plan(store, config)))
    age(Path(config.delta.table_uri), 30 * DAY)
    age(Path(config.delta.quarantine_uri), 30 * DAY)

    report = clean(config, older_than="0s")

    for f in store.files(done.app_id, done.batch_id):
        assert Path(roots(config)[f.target], f.path).exists()
    assert not {f.path for f in store.files(done.app_id, done.batch_id)} & paths(report.deleted)
    assert DeltaTable(config.delta.table_uri).to_pyarrow_table().num_rows == 3
    assert DeltaTable(config.delta.quarantine_uri).to_pyarrow_table().num_rows == 3


@pytest.mark.parametrize("state", [S.PLANNED, S.STAGED])
def test_a_live_attempts_files_are_kept_even_with_no_grace(
    store: LedgerStore, config: PipelineConfig, state: BatchState
) -> None:
    """An attempt that has not voted may still vote: whatever its lease says, only an abort
    fences it, so its files are kept until the batch is ABORTED."""
    commit(store, config, prepare(store, config, plan(store, config)))
    # owned by a process on another host whose lease ran out long ago: it may be paused
    batch = plan(store, config, owner=Owner("elsewhere", 4242))
    stage(config, batch)
    if state is S.STAGED:
        batch = store.transition(batch, S.STAGED)

    report = clean(config, older_than="0s")

    for target in (TABLE, QUARANTINE):
        assert (folder_of(config, batch, target) / "part-00000.snappy.parquet").exists()
    in_flight = [v for v in report.kept if v.entry.path.startswith(f"staged/{config.app_id}/")]
    assert any(f"{batch.app_id}/{batch.batch_id}" in v.detail for v in in_flight)
    assert not {
        str(p.relative_to(config.delta.table_uri)) for p in folder_of(config, batch).iterdir()
    } & paths(report.deleted)


def test_files_younger_than_the_grace_period_are_kept(
    store: LedgerStore, config: PipelineConfig
) -> None:
    gone = aborted(store, config)
    age(Path(config.delta.table_uri), timedelta(hours=5))
    age(Path(config.delta.quarantine_uri), timedelta(hours=5))

    kept = clean(config, older_than="6h")
    assert kept.files_deleted == 0 and kept.files_kept == 4
    assert folder_of(config, gone).exists()

    taken = clean(config, older_than="4h")
    assert taken.files_deleted == 4
    assert not folder_of(config, gone).exists()


def test_dry_run_deletes_nothing_and_lists_what_would_go(
    store: LedgerStore, config: PipelineConfig
) -> None:
    gone = aborted(store, config)
    age(Path(config.delta.table_uri), 2 * DAY)
    age(Path(config.delta.quarantine_uri), 2 * DAY)
    before = files_under(Path(config.delta.table_uri))

    report = clean(config, dry_run=True)

    assert files_under(Path(config.delta.table_uri)) == before
    assert report.dry_run and report.files_deleted == 4
    lines = report.lines
    assert any(
        line.startswith(f"would delete {folder_of(config, gone)}") and "bytes" in line
        for line in lines
    )
    assert "would delete 4 files" in lines[-1]


def test_files_a_replace_removed_stay_for_time_travel_after_a_ledger_rebuild(
    store: LedgerStore, config: PipelineConfig, tmp_path: Path
) -> None:
    """A replace removes the live batch's file from the table; time travel still reads it
    until Delta's own VACUUM expires it. A ledger rebuilt from the log has no file rows, so
    only the Delta log can say the file is still needed."""
    first = commit(store, config, prepare(store, config, plan(store, config)))
    before_replace = DeltaTable(config.delta.table_uri).version()
    replace = plan(
        store,
        config,
        app_id=backfill_app_id(config.pipeline),
        ranges=list(first.ranges),
        params={"mode": "replace"},
    )
    commit(store, config, prepare(store, config, replace))
    removed = {f.path for f in store.files(first.app_id, first.batch_id) if f.target == TABLE}
    assert removed.isdisjoint(
        pa.table(DeltaTable(config.delta.table_uri).get_add_actions()).column("path").to_pylist()
    )

    # the ledger is lost and rebuilt from the Delta log: committed batches, no file rows
    rebuilt_url = f"sqlite:///{tmp_path / 'rebuilt.db'}"
    rebuilt = with_ledger(config, rebuilt_url)
    fresh = LedgerStore(rebuilt_url)
    publisher = DeltaPublisher.for_config(rebuilt)
    for app_id, kind in ((config.app_id, BatchKind.LIVE), (replace.app_id, BatchKind.BACKFILL)):
        tpc = TwoPhaseCommit(
            fresh,
            pipeline=config.pipeline,
            app_id=app_id,
            kind=kind,
            source=None,  # type: ignore[arg-type]
            stager=None,  # type: ignore[arg-type]
            publisher=publisher,
            max_records_per_partition=10,
        )
        assert tpc.rebuild_from_log() == 1
    assert fresh.files(config.app_id, first.batch_id) == []
    fresh.dispose()
    age(tmp_path, 30 * DAY)

    report = clean(rebuilt, older_than="0s")

    assert removed <= paths(report.kept)
    old = DeltaTable(config.delta.table_uri, version=before_replace).to_pyarrow_table()
    assert old.num_rows == 3


def test_clean_refuses_a_ledger_that_does_not_know_the_tables(
    store: LedgerStore, config: PipelineConfig, tmp_path: Path
) -> None:
    """A lost ledger (or a ledger.url resolved from the wrong directory) knows no vote: it
    must not be taken as "nothing is needed"."""
    commit(store, config, prepare(store, config, plan(store, config)))
    voted = prepare(store, config, plan(store, config))
    age(tmp_path, 30 * DAY)
    before = files_under(Path(config.delta.table_uri))
    elsewhere = f"sqlite:///{tmp_path / 'other' / 'ledger.db'}"
    wrong = with_ledger(config, elsewhere)

    with pytest.raises(InconsistencyError) as info:
        clean(wrong, older_than="0s")

    message = str(info.value)
    assert "\n" not in message and "pv/1" in message and "exactly recover" in message
    assert files_under(Path(config.delta.table_uri)) == before
    assert folder_of(config, voted).exists()


def test_clean_refuses_staged_files_of_a_ledger_with_no_batch(
    store: LedgerStore, config: PipelineConfig, tmp_path: Path
) -> None:
    """Before the first commit there is no table to compare with: staged files that an empty
    ledger knows nothing of were written by another ledger's pipeline."""
    prepare(store, config, plan(store, config))
    age(tmp_path, 30 * DAY)
    elsewhere = f"sqlite:///{tmp_path / 'other' / 'ledger.db'}"
    wrong = with_ledger(config, elsewhere)

    with pytest.raises(InconsistencyError, match="holds no batch of pv"):
        clean(wrong, older_than="0s")


def test_files_voted_while_the_cleaner_deletes_are_kept(
    store: LedgerStore, config: PipelineConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger is read again right before each folder is deleted: a batch that votes while
    the cleaner works keeps its files, even when their times alone would let them go (a
    storage clock far behind the planner's)."""
    from resources.object_storage import storage

    gone = aborted(store, config)
    racing = plan(store, config, owner=Owner("elsewhere", 4242))
    files = stage(config, racing)
    racing = store.transition(racing, S.STAGED)
    age(Path(config.delta.table_uri), 2 * DAY)
    age(Path(config.delta.quarantine_uri), 2 * DAY)
    real_delete = storage.delete_file
    voted: list[Batch] = []

    def delete_while_the_batch_votes(uri: str) -> None:
        if not voted:
            voted.append(store.transition(racing, S.PREPARED, files=files, schemas=SCHEMAS))
        real_delete(uri)

    monkeypatch.setattr(storage, "delete_file", delete_while_the_batch_votes)

    report = clean(config, older_than="0s")

    assert voted, "the cleaner deleted nothing at all"
    assert not folder_of(config, gone).exists()
    for f in files:
        assert Path(roots(config)[f.target], f.path).exists()
    assert {f.path for f in files} <= paths(report.kept)


# -- the rule alone -----------------------------------------------------------------------


def test_the_in_flight_margin_and_whole_folders() -> None:
    """Rule 3 keeps what was written after the batch was planned, less the clock margin;
    a folder with one kept file keeps them all."""
    from ledger.core.cleaning import IN_FLIGHT_MARGIN, KeepReason, StagedEntry, classify

    now = utcnow()
    planned = now - 3 * IN_FLIGHT_MARGIN
    batch = a_batch(7, S.STAGED, at=planned, owner=Owner("elsewhere", 1))

    def entry(folder: str, name: str, written: Any, app_id: str = "pv") -> StagedEntry:
        path = f"staged/{app_id}/{folder}/{name}"
        return StagedEntry(TABLE, app_id, path, f"/t/{path}", 10, written, f"/t/{folder}")

    second = timedelta(seconds=1)
    inside = entry("a", "part-0.parquet", planned - IN_FLIGHT_MARGIN + second)
    outside = entry("b", "part-0.parquet", planned - IN_FLIGHT_MARGIN - second)
    voted = entry("c", "part-0.parquet", planned - 10 * IN_FLIGHT_MARGIN)
    marker = entry("c", "_SUCCESS", planned - 10 * IN_FLIGHT_MARGIN)
    other_app = entry("d", "part-0.parquet", planned, app_id="pv.backfill")
    verdicts = classify(
        [inside, outside, voted, marker, other_app],
        logged=set(),
        voted={(TABLE, voted.path)},
        in_flight=[batch],
        now=now,
        grace=timedelta(0),
    )
    assert [v.keep for v in verdicts] == [
        KeepReason.IN_FLIGHT,
        None,
        KeepReason.VOTED,
        KeepReason.BESIDE,
        None,  # another application's folders are not the batch's
    ]
    assert "pv/7 (STAGED)" in verdicts[0].detail


# -- durations ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0s", timedelta(0)),
        ("90s", timedelta(seconds=90)),
        ("30m", timedelta(minutes=30)),
        ("6h", timedelta(hours=6)),
        ("7d", timedelta(days=7)),
    ],
)
def test_durations(text: str, expected: timedelta) -> None:
    from ledger.core.cleaning import parse_duration

    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "7", "1w", "-1h", "1.5h", "h", "6 h", "1h30m"])
def test_bad_durations_are_one_line(text: str) -> None:
    from ledger.core.cleaning import parse_duration

    with pytest.raises(ConfigError) as info:
        parse_duration(text, "--older-than")
    assert "--older-than" in str(info.value) and "30m" in str(info.value)


def test_a_bad_clean_setting_names_the_field(tmp_path: Path, config: PipelineConfig) -> None:
    doc = yaml.safe_load(config_path(config).read_text())
    doc["clean"] = {"older_than": "soon"}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"clean\.older_than"):
        load_config(path)


# -- the command line ---------------------------------------------------------------------


def exactly(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EXACTLY, *args], capture_output=True, text=True, timeout=300, cwd=REPO)


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("exactly: error: ")
    return lines[0]


def test_cli_bad_duration_is_one_line(config: PipelineConfig) -> None:
    line = one_error_line(exactly("clean", "-c", str(config_path(config)), "--older-than", "2w"))
    assert "--older-than" in line and "'2w'" in line


def test_cli_missing_config_is_one_line(tmp_path: Path) -> None:
    line = one_error_line(exactly("clean", "-c", str(tmp_path / "nope.yaml")))
    assert "nope.yaml" in line


def test_cli_dry_run_then_clean(store: LedgerStore, config: PipelineConfig) -> None:
    done = commit(store, config, prepare(store, config, plan(store, config)))
    gone = aborted(store, config)
    age(Path(config.delta.table_uri), 2 * DAY)
    age(Path(config.delta.quarantine_uri), 2 * DAY)
    path = str(config_path(config))

    dry = exactly("clean", "-c", path, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert folder_of(config, gone).exists()
    would = [line for line in dry.stdout.splitlines() if line.startswith("would delete")]
    assert len(would) == 3, dry.stdout  # two folders, then the summary
    assert str(folder_of(config, gone)) in dry.stdout
    assert "would delete 4 files" in would[-1]

    real = exactly("clean", "-c", path)
    assert real.returncode == 0, real.stderr
    deleted = [line for line in real.stdout.splitlines() if line.startswith("deleted")]
    assert len(deleted) == 3, real.stdout
    assert "deleted 4 files" in deleted[-1] and "kept" in deleted[-1]
    assert not folder_of(config, gone).exists() and folder_of(config, done).exists()

    again = exactly("clean", "-c", path)
    assert again.returncode == 0 and "deleted 0 files" in again.stdout


# -- Dagster ------------------------------------------------------------------------------


def test_the_clean_job_reports_what_it_deleted_and_ships_stopped(
    store: LedgerStore, config: PipelineConfig
) -> None:
    from orchestration.pipeline_definitions import pipeline_definitions

    commit(store, config, prepare(store, config, plan(store, config)))
    gone = aborted(store, config)
    age(Path(config.delta.table_uri), 2 * DAY)
    age(Path(config.delta.quarantine_uri), 2 * DAY)
    jobs = pipeline_definitions(config_path(config))
    defs = jobs.definitions
    schedule = defs.resolve_schedule_def("pv_clean_schedule")
    assert schedule.default_status is dg.DefaultScheduleStatus.STOPPED
    assert schedule.cron_schedule == config.clean.cron
    job = defs.resolve_job_def("pv_clean")
    assert schedule.job_name == job.name

    with dg.instance_for_test() as instance:
        dry_run = {"ops": {"pv_clean_staged": {"config": {"dry_run": True}}}}
        dry = job.execute_in_process(instance=instance, run_config=dry_run)
        assert dry.success and folder_of(config, gone).exists()
        result = job.execute_in_process(instance=instance)
    assert result.success
    assert not folder_of(config, gone).exists()
    (step_output,) = [e for e in result.all_node_events if e.event_type_value == "STEP_OUTPUT"]
    meta = {k: v.value for k, v in step_output.event_specific_data.metadata.items()}
    assert meta["files_deleted"] == 4 and meta["bytes_deleted"] > 0
    assert meta["files_kept"] > 0 and meta["bytes_kept"] > 0
    assert meta["dry_run"] is False
    jobs.resource.close()


# -- with the real pipeline (Kafka, Spark, delta-rs, delta-spark) -------------------------


def test_clean_after_a_crash_keeps_the_prepared_batch_and_recovery_commits_it(
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    config = pipeline_factory(2, max_records=400)
    kafka_client.produce(config.kafka.topic, pageviews(600, malformed_every=40))
    store = LedgerStore(config.ledger.url)
    # an attempt dies while staging: its half-written folder is an orphan once recovery
    # abandons the batch (the next run does, then dies right after its own vote)
    crash_run(config, "during_stage")
    crash_run(config, "after_prepare")
    orphan, voted = store.get(config.app_id, 1), store.get(config.app_id, 2)
    assert orphan is not None and orphan.state is S.ABORTED
    assert voted is not None and voted.state is S.PREPARED
    orphan_folder = folder_of(config, orphan)
    assert any(orphan_folder.rglob("*.parquet"))
    age(orphan_folder, 2 * DAY)  # the orphan has waited long enough; the vote is fresh
    files = store.files(voted.app_id, voted.batch_id)
    assert files

    result = exactly("clean", "-c", str(config_path(config)), "--older-than", "0s")

    assert result.returncode == 0, result.stdout + result.stderr
    assert not orphan_folder.exists(), result.stdout
    for f in files:
        assert Path(roots(config)[f.target], f.path).exists(), result.stdout
    tpc = build(config, spark_factory=lambda: spark)
    assert [b.state for b in tpc.recover_and_commit()] == [S.ACKED]
    while tpc.run_batch() is not None:
        pass
    table, quarantined = assert_exactly_once(config, kafka_client)
    assert table + quarantined == 600


#: `make test-wide`: that a vote whose staged files are gone is staged again and committed
#: once is tests/test_restage_pipeline.py's (a lost file); here an operator's VACUUM is the
#: cause, and every file of both outputs is gone.
@pytest.mark.wide
def test_vacuum_with_zero_retention_while_a_batch_is_prepared(
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    """delta-spark's VACUUM deletes every file the table does not reference and that is
    older than the retention, staged files of a PREPARED batch included: with RETAIN 0
    HOURS, all of them. Recovery must notice the vote's files are gone and stage the batch
    again (invariant 11) instead of committing files that no longer exist."""
    config = pipeline_factory(2, max_records=300)
    kafka_client.produce(config.kafka.topic, pageviews(900, malformed_every=30))
    tpc = build(config, spark_factory=lambda: spark)
    assert tpc.run_batch() is not None  # both tables exist before the crash
    crash_run(config, "after_prepare")
    store = LedgerStore(config.ledger.url)
    voted = store.get(config.app_id, 2)
    assert voted is not None and voted.state is S.PREPARED
    files = store.files(voted.app_id, voted.batch_id)

    # VACUUM lists the table in spark.sql.sources.parallelPartitionDiscovery.parallelism
    # tasks, 10,000 by default: 45 s per tiny table on local[2], 4 tasks take seconds
    # (and the `spark` fixture keeps delta-spark's state in 2 tasks, not 50)
    listing = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    spark.conf.set(listing, "4")
    try:
        for uri in (config.delta.table_uri, config.delta.quarantine_uri):
            spark.sql(f"VACUUM delta.`{uri}` RETAIN 0 HOURS").collect()
    finally:
        spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "true")
        spark.conf.unset(listing)
    vacuumed = [f.path for f in files if not Path(roots(config)[f.target], f.path).exists()]
    assert vacuumed == [f.path for f in files], "VACUUM RETAIN 0 HOURS left voted files"

    restarted = build(config, spark_factory=lambda: spark)
    (recovered,) = restarted.recover_and_commit()
    # an empty file (a Spark task with no row for that output) is never published, so the
    # vote check does not count it missing (ledger/core/vote_check.py)
    holding_records = [f for f in files if f.records > 0]
    assert recovered.batch_id == 2
    assert recovered.metrics["files_missing"] == len(holding_records)
    assert recovered.metrics["restage"]["count"] == 1
    while restarted.run_batch() is not None:
        pass
    table, quarantined = assert_exactly_once(config, kafka_client)
    assert table + quarantined == 900
    for uri in (config.delta.table_uri, config.delta.quarantine_uri):
        assert spark.read.format("delta").load(uri).count() > 0
