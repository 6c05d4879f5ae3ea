"""A data table or a quarantine that does not hold the batches the ledger committed into
it: deleted, moved aside, re-created empty, or a location in the config that names another
folder (a relative path run from elsewhere). The old code went on: the next batch created an
empty table there and filled it from where the ledger stopped, a table lacking every earlier
record, and nothing said so. Now refused in one line before anything is planned, and under
a running process before the table is created again; once the config names the table
again, the pipeline carries on, every record once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable, write_deltalake

from jobs.examples.sample_data import pageviews
from jobs.wiring.pipeline import build
from ledger.core.errors import InconsistencyError
from ledger.core.protocol import BatchState
from ledger.store.ledger_store import LedgerStore
from tests.fixtures.pipeline import assert_exactly_once, config_path, shared_spark_env

EXACTLY = [sys.executable, "-m", "exactly_cli"]


def _run(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EXACTLY, "run", "-c", str(config), "--until-caught-up"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **shared_spark_env()},
    )


#: (the config's field, what its refusal says)
MOVED = [
    ("table_uri", "committed, but the data table at"),
    # `make test-wide`: the same check over the other output (the table's case keeps it)
    pytest.param("quarantine_uri", "quarantined records into", marks=pytest.mark.wide),
]


@pytest.mark.parametrize(("field", "refusal"), MOVED)
def test_a_table_moved_away_or_named_elsewhere_is_refused_and_found_again(
    kafka_client: Any, pipeline_factory: Any, tmp_path: Path, field: str, refusal: str
) -> None:
    config = pipeline_factory(2)
    path = config_path(config)
    kafka_client.produce(config.kafka.topic, pageviews(150, malformed_every=30))
    first = _run(path)
    assert first.returncode == 0, first.stdout + first.stderr
    kafka_client.produce(config.kafka.topic, pageviews(50, start=150))

    table = Path(getattr(config.delta, field))
    aside = tmp_path / "moved-aside"
    elsewhere = tmp_path / "elsewhere.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["delta"][field] = str(tmp_path / "another" / "table")
    elsewhere.write_text(yaml.safe_dump(doc))

    shutil.move(table, aside)
    for refused in (_run(path), _run(elsewhere)):
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode == 2 and len(lines) == 1, refused.stdout + refused.stderr
        assert refusal in lines[0], lines[0]
        assert "Traceback" not in refused.stdout + refused.stderr
    # neither refused run created a table where it looked
    assert not table.exists() and not (tmp_path / "another").exists()

    shutil.move(aside, table)
    again = _run(path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert assert_exactly_once(config, kafka_client) == (195, 5)


@pytest.mark.parametrize(
    ("field", "refusal"),
    [MOVED[0], ("quarantine_uri", "was deleted while this process used it")],
)
def test_a_table_deleted_under_a_running_process_is_not_created_again_without_its_batches(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path, field: str, refusal: str
) -> None:
    """As `run --continuous` and a Dagster code location do: one process, its tables kept
    open, batch after batch. The old code's next commit created the deleted table anew
    and published its batch there alone (by hand: 196 rows left of 3,234)."""
    config = pipeline_factory(2)
    kafka_client.produce(config.kafka.topic, pageviews(100, malformed_every=25))
    tpc = build(config, spark_factory=lambda: spark)
    tpc.recover_and_commit()
    assert tpc.run_batch() is not None

    table = Path(getattr(config.delta, field))
    aside = tmp_path / "moved-aside"
    shutil.move(table, aside)
    kafka_client.produce(config.kafka.topic, pageviews(60, start=100, malformed_every=25))
    with pytest.raises(InconsistencyError, match=refusal):
        tpc.run_batch()
    assert not (table / "_delta_log").exists()  # not created again; the batch waits, voted
    (waiting,) = LedgerStore(config.ledger.url).batches(
        app_id=config.app_id, states=[BatchState.PREPARED]
    )

    # the table back where it was (beside the staged files of the batch that waits)
    shutil.copytree(aside, table, dirs_exist_ok=True)
    finished = tpc.recover_and_commit()
    assert [(b.batch_id, b.state) for b in finished] == [(waiting.batch_id, BatchState.ACKED)]
    assert assert_exactly_once(config, kafka_client) == (154, 6)


def test_a_quarantine_re_created_empty_between_runs_is_refused(
    kafka_client: Any, pipeline_factory: Any
) -> None:
    """Someone drops the quarantine and creates it again, empty, with its schema (a
    `CREATE TABLE` after a `DROP`, or a clean-up script): a table is there, so the check for
    a missing one passed, and the next batches carried on while the records quarantined
    before were gone. The quarantine must hold the newest batch that quarantined records."""
    config = pipeline_factory(2)
    path = config_path(config)
    kafka_client.produce(config.kafka.topic, pageviews(150, malformed_every=30))
    first = _run(path)
    assert first.returncode == 0, first.stdout + first.stderr

    uri = config.delta.quarantine_uri
    schema = DeltaTable(uri).schema().to_arrow()
    shutil.rmtree(uri)
    write_deltalake(uri, pa.Table.from_batches([], schema=pa.schema(schema)), mode="overwrite")
    kafka_client.produce(config.kafka.topic, pageviews(50, start=150, malformed_every=25))

    table_version = DeltaTable(config.delta.table_uri).version()
    refused = _run(path)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stdout + refused.stderr
    assert "does not hold batch" in lines[0] and uri in lines[0], lines[0]
    assert "Traceback" not in refused.stdout + refused.stderr
    # nothing more was committed: not the next batch, not its quarantined records
    assert DeltaTable(config.delta.table_uri).version() == table_version
    assert DeltaTable(uri).to_pyarrow_table().num_rows == 0


def test_a_quarantine_re_created_under_a_running_process_is_not_committed_into(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    """The same drop-and-create while one process keeps the tables open, batch after batch:
    its kept table noticed a new log and read the new table, which held no batch of the
    pipeline, and the next batch's quarantined records were committed into it alone. An
    application's transaction version never goes down in a table (checkpoints, compaction,
    vacuum and log clean-up keep it); a table where it did is not the one the batches went
    to."""
    config = pipeline_factory(2)
    kafka_client.produce(config.kafka.topic, pageviews(100, malformed_every=25))
    tpc = build(config, spark_factory=lambda: spark)
    tpc.recover_and_commit()
    assert tpc.run_batch() is not None

    uri = config.delta.quarantine_uri
    schema = pa.schema(DeltaTable(uri).schema().to_arrow())
    aside = tmp_path / "moved-aside"
    shutil.move(uri, aside)
    write_deltalake(uri, pa.Table.from_batches([], schema=schema), mode="overwrite")
    kafka_client.produce(config.kafka.topic, pageviews(60, start=100, malformed_every=25))
    with pytest.raises(InconsistencyError, match="went back"):
        tpc.run_batch()
    assert DeltaTable(uri).to_pyarrow_table().num_rows == 0  # nothing committed into it
    (waiting,) = LedgerStore(config.ledger.url).batches(
        app_id=config.app_id, states=[BatchState.PREPARED]
    )

    # the quarantine that holds the batches back where it was (beside the waiting batch's
    # staged files)
    shutil.rmtree(Path(uri) / "_delta_log")
    shutil.copytree(aside, uri, dirs_exist_ok=True)
    finished = tpc.recover_and_commit()
    assert [(b.batch_id, b.state) for b in finished] == [(waiting.batch_id, BatchState.ACKED)]
    assert assert_exactly_once(config, kafka_client) == (154, 6)
