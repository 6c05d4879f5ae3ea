"""Invariant 11 with the real broker, Spark, Delta and a real `exactly run` killed at a crash
point: a vote whose staged file was deleted before the commit is never published; the batch
is re-staged from Kafka as a new attempt and committed once, the pipeline's alert sinks hear
of it, and the file counts reach `exactly ledger`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from exactly_cli import main
from jobs.examples.sample_data import pageviews
from jobs.wiring.pipeline import Pipeline
from ledger.core.layout import QUARANTINE, TABLE
from ledger.core.protocol import BatchState
from ledger.store.ledger_store import LedgerStore
from tests.fixtures.pipeline import (
    FIRST_DERIVED_ONLY,
    assert_exactly_once,
    config_path,
    crash_run,
)

WEBHOOK = {"webhook_url_env": "EXACTLY_TEST_WEBHOOK_URL"}


def delete_one_voted_file(config: Any, target: str) -> str:
    """Delete a staged file of the batch-1 vote that holds records; its path."""
    store = LedgerStore(config.ledger.url)
    try:
        voted = [f for f in store.files(config.app_id, 1) if f.target == target and f.records]
    finally:
        store.dispose()
    assert voted, f"the vote has no {target} file with records"
    root = config.delta.table_uri if target == TABLE else config.delta.quarantine_uri
    (Path(root) / voted[0].path).unlink()
    return voted[0].path


def restart(config: Any, spark: Any) -> list[Any]:
    """What the next `exactly run` does, in this process (its Spark session is warm)."""
    with Pipeline(config, spark_factory=lambda: spark) as pipeline:
        recovered = pipeline.live.recover_and_commit()
        while pipeline.live.run_batch() is not None:
            pass
    return recovered


def table_paths(uri: str) -> list[str]:
    return [p for p in DeltaTable(uri).get_add_actions(flatten=True).column("path").to_pylist()]


def commits_of(uri: str, app_id: str, batch_id: int) -> int:
    """How many commits of the table's log carry this batch."""
    found = 0
    for entry in DeltaTable(uri).history():
        meta = entry.get("exactly")
        meta = json.loads(meta) if isinstance(meta, str) else meta
        if isinstance(meta, dict) and (meta["app_id"], meta["batch_id"]) == (app_id, batch_id):
            found += 1
    return found


def test_a_vote_that_lost_a_staged_file_is_restaged_and_committed_once(
    spark: Any,
    kafka_client: Any,
    pipeline_factory: Any,
    webhook: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = pipeline_factory(3, alerts=WEBHOOK)
    kafka_client.produce(config.kafka.topic, pageviews(900, malformed_every=40))
    crash_run(config, "after_prepare")
    lost = delete_one_voted_file(config, TABLE)

    recovered = restart(config, spark)

    # exactly once, from a readable table; nothing of the broken vote was published
    table, quarantined = assert_exactly_once(config, kafka_client)
    assert (table + quarantined, quarantined) == (900, 900 // 40)
    broken_folder = lost.rsplit("/", 1)[0]
    assert not [p for p in table_paths(config.delta.table_uri) if p.startswith(broken_folder)]
    # the same batch, re-staged as attempt 3 (2 was the takeover) over the same ranges
    assert [(b.batch_id, b.state, b.attempt) for b in recovered] == [(1, BatchState.ACKED, 3)]
    done = recovered[0]
    counts = {k: done.metrics[k] for k in ("files_committed", "files_missing")}
    assert counts == {"files_committed": done.metrics["files_staged"], "files_missing": 1}
    assert done.metrics["files_already_committed"] == 0
    assert lost in (done.error or "")
    assert [p["kind"] for p in webhook.posts] == ["staged_files_missing"]
    assert webhook.posts[0]["details"]["missing"] == [f"table/{lost}"]

    # `exactly ledger` shows the counts, as text and as JSON
    ledger = ["ledger", "-c", str(config_path(config))]
    assert main(ledger) == 0
    text = capsys.readouterr().out
    staged = done.metrics["files_staged"]
    assert "files s/c/a/m" in text and f"{staged}/{staged}/0/1" in text
    assert main([*ledger, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["metrics"]["files_missing"] == 1 and row["attempt"] == 3


def test_a_batch_in_the_quarantine_only_that_lost_a_table_file_publishes_the_quarantine_once(
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    config = pipeline_factory(2)
    kafka_client.produce(config.kafka.topic, pageviews(600, malformed_every=25))
    crash_run(config, "between_table_commits")
    quarantine_version = DeltaTable(config.delta.quarantine_uri).version()
    assert DeltaTable(config.delta.quarantine_uri).transaction_version(config.app_id) == 1
    lost = delete_one_voted_file(config, TABLE)

    (done,) = restart(config, spark)

    assert (done.state, done.attempt) == (BatchState.ACKED, 3)
    # the quarantine kept its one commit of batch 1; the re-staged quarantine files are
    # orphans, never published (the quarantine is idempotent by its own txn version)
    assert DeltaTable(config.delta.quarantine_uri).version() == quarantine_version
    assert commits_of(config.delta.quarantine_uri, config.app_id, 1) == 1
    assert commits_of(config.delta.table_uri, config.app_id, 1) == 1
    m = done.metrics
    assert m["files_already_committed"] > 0 and m["files_committed"] > 0
    assert m["files_staged"] == m["files_committed"] + m["files_already_committed"]
    assert done.metrics["restage"]["outputs_holding"] == [QUARANTINE]
    assert lost not in table_paths(config.delta.table_uri)
    table, quarantined = assert_exactly_once(config, kafka_client)
    assert (table + quarantined, quarantined) == (600, 600 // 25)


@pytest.mark.parametrize(
    ("point", "lost_output"),
    [
        # the vote done, no output holds the batch: all of it is re-staged and published
        pytest.param("after_prepare", "views_per_app", id="after-vote"),
        # the first derived output committed (views_per_app), then the partial of one not
        # committed yet is lost: the others are re-staged and published, the first kept
        pytest.param(FIRST_DERIVED_ONLY, "latest_per_user", id="between-derived"),
    ],
)
def test_a_vote_that_lost_a_derived_partial_is_restaged_and_published_once(
    point: str,
    lost_output: str,
    spark: Any,
    kafka_client: Any,
    pipeline_factory: Any,
    tmp_path: Path,
) -> None:
    """A derived output's partial deleted between the vote and its MERGE: the vote check
    finds it (derived partials are voted files like any other), the batch is re-staged from
    Kafka as a new attempt, never published with the partial missing (no lost counts, no
    lost upserts), and every output equals its recomputation over the raw table."""
    from ledger.core.layout import derived_target
    from tests.fixtures.derived import (
        TRANSFORM,
        assert_derived_match,
        derived_outputs,
        user_events,
    )

    config = pipeline_factory(3, transform=TRANSFORM, derived=derived_outputs(tmp_path / "d"))
    kafka_client.produce_records(config.kafka.topic, user_events(0, 400, 3, malformed_every=20))
    crash_run(config, point)
    target = derived_target(lost_output)
    store = LedgerStore(config.ledger.url)
    try:
        voted = [f for f in store.files(config.app_id, 1) if f.target == target and f.records]
    finally:
        store.dispose()
    assert voted, f"the vote has no {target} partial with rows"
    (spec,) = [s for s in config.derived if s.name == lost_output]
    (Path(spec.table_uri) / voted[0].path).unlink()

    recovered = restart(config, spark)

    assert [(b.batch_id, b.state, b.attempt) for b in recovered] == [(1, BatchState.ACKED, 3)]
    done = recovered[0]
    assert done.metrics["files_missing"] == 1
    assert done.metrics["restage"]["missing"] == [f"{target}/{voted[0].path}"]
    # each output committed batch 1 once, the lost partial's output from the new attempt
    assert commits_of(config.delta.table_uri, config.app_id, 1) == 1
    for output in config.derived:
        assert commits_of(output.table_uri, output.app_id(config.app_id), 1) == 1, output.name
    table, quarantined = assert_exactly_once(config, kafka_client)
    assert table + quarantined == 400
    assert_derived_match(config)
