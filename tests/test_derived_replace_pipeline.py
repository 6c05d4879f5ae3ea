"""A `replace` backfill on a pipeline with derived outputs, against the real broker, Spark
and Delta tables (issue 14): after the replace every derived output equals its
recomputation over the raw table; so it does after a crash between the replace's commits,
with the ledger kept and lost, and under a live pipeline committing beside it; and an
output a replace cannot keep right (a min) refuses it up front with its reason.

The replace's transform (tests/transforms.py `pageviews_with_tombstones_v2`) upper-cases
the app, so aggregate groups move, and gives every record at an odd offset to another
user, so the upsert gains keys and loses keys with no record left at all.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from jobs.derived.invariants import live_rows
from jobs.examples.sample_data import MALFORMED
from jobs.wiring.pipeline import build, build_backfill
from ledger.coordinator.backfill import plan_backfill
from ledger.core.backfill import BackfillMode, backfill_app_id
from ledger.core.protocol import BatchState, OffsetRange
from ledger.store.ledger_store import LedgerStore
from resources.config.derived_spec import replace_refusal
from tests.fixtures.derived import (
    TRANSFORM,
    TRANSFORM_V2,
    assert_derived_match,
    derived_outputs,
    replaceable_outputs,
    user_events,
)
from tests.fixtures.pipeline import (
    FIRST_DERIVED_ONLY,
    assert_exactly_once,
    config_path,
    crash_env,
    save_config,
)
from tests.test_backfill import cli
from tests.test_crash import crashed_batch, derived_held, without_ledger

S = BatchState
CLI = [sys.executable, "-m", "exactly_cli"]


def live_until_caught_up(config: Any, spark: Any) -> None:
    """The next `exactly run --until-caught-up`: recover (rebuilding a lost ledger), then
    batches until caught up."""
    tpc = build(config, spark_factory=lambda: spark)
    tpc.recover_and_commit()
    while tpc.run_batch() is not None:
        pass


def replace(config: Any, spark: Any, rng: OffsetRange) -> Any:
    """`exactly backfill --mode replace` with the v2 transform, in this process; the batch
    (None when an identical replace was done already: recovery finished it)."""
    tpc = build_backfill(config, transform=TRANSFORM_V2, spark_factory=lambda: spark)
    batch, planned = plan_backfill(
        tpc,
        live_app_id=config.app_id,
        mode=BackfillMode.REPLACE,
        ranges=[rng],
        transform=TRANSFORM_V2,
        replace_refusals=config.replace_refusals(),
    )
    return tpc.finish(batch).batch if planned else None


def backfill_args(path: Path, mode: str, rng: OffsetRange, transform: str) -> list[str]:
    """`exactly backfill`'s arguments for one range."""
    return [
        "backfill",
        "-c",
        str(path),
        "--partition",
        str(rng.partition),
        "--from",
        str(rng.start),
        "--to",
        str(rng.end),
        "--mode",
        mode,
        "--transform",
        transform,
    ]


def replace_args(path: Path, rng: OffsetRange) -> list[str]:
    return backfill_args(path, "replace", rng, TRANSFORM_V2)


def assert_replaced_something(config: Any) -> None:
    """The replace did move groups and keys (else a match would prove little)."""
    apps = DeltaTable(config.derived[0].table_uri).to_pyarrow_table()["app"].to_pylist()
    assert any(a is not None and a.isupper() for a in apps), apps
    users = live_rows(DeltaTable(config.derived[2].table_uri).to_pyarrow_table())
    assert any(u.endswith("-v2") for u in users["user"].to_pylist())


def test_a_replace_keeps_aggregates_and_upserts_equal_to_their_recomputation(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    """Counts and sums (per app, per app and minute) and the latest record per user, with
    tombstones, after a replace and after a live batch that follows it; and a pipeline with
    a min output is refused the same replace by the CLI, in one line, with the reason."""
    config = pipeline_factory(
        3, transform=TRANSFORM, derived=replaceable_outputs(tmp_path / "derived")
    )
    topic = config.kafka.topic
    kafka_client.produce_records(topic, user_events(0, 300, 3, malformed_every=20))
    live_until_caught_up(config, spark)
    assert_derived_match(config)
    rng = OffsetRange(topic, 1, 10, 80)

    # (d) an output with a min refuses the replace up front, before anything is planned
    with_min = {**derived_outputs(tmp_path / "x")[1], "name": "first_views"}
    lossy_specs = [*replaceable_outputs(tmp_path / "derived"), with_min]
    lossy = type(config).model_validate({**config.model_dump(mode="json"), "derived": lossy_specs})
    refused = cli(*replace_args(save_config(lossy, tmp_path / "lossy.yaml"), rng))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    reason = replace_refusal(lossy.derived[3])
    assert reason is not None and "min and max cannot be subtracted" in reason
    assert refused.stderr.strip().count("\n") == 0 and reason in refused.stderr
    store = LedgerStore(config.ledger.url)
    try:
        assert store.batches(app_id=backfill_app_id(config.pipeline)) == []
    finally:
        store.dispose()

    done = replace(config, spark, rng)
    assert done is not None and done.state is S.ACKED
    assert assert_exactly_once(config, kafka_client)[0] > 0
    assert_derived_match(config)
    assert_replaced_something(config)
    kafka_client.produce_records(topic, user_events(300, 90, 3, malformed_every=20))
    live_until_caught_up(config, spark)
    quarantined = assert_exactly_once(config, kafka_client)[1]
    assert sum(assert_exactly_once(config, kafka_client)) == 390
    assert_derived_match(config)

    # a range whose every record was quarantined: no raw row in it, so each output's
    # correction is the new rows' alone (pyarrow refused to match an empty table's rows
    # to the ranges: the voted replace failed at its commit, every time)
    start = kafka_client.offsets(topic)[0].last_stable
    kafka_client.produce_records(topic, [(0, "user-00", MALFORMED[0])] * 3)
    live_until_caught_up(config, spark)
    done = replace(config, spark, OffsetRange(topic, 0, start, start + 3))
    assert done is not None and done.state is S.ACKED
    assert assert_exactly_once(config, kafka_client)[1] == quarantined + 3
    assert_derived_match(config)


#: crash point -> which derived outputs hold the replace when it dies (config order)
REPLACE_HELD = {
    FIRST_DERIVED_ONLY: (True, False, False),
    "between_table_commits": (True, True, True),
}


@pytest.mark.parametrize("point", list(REPLACE_HELD))
def test_a_replace_crashed_between_its_commits_finishes_right_with_and_without_the_ledger(
    point: str, spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    """A replace that died with some outputs holding it: each output left re-computes the
    same correction on the re-drive (the raw table, committed last, still holds the old
    rows), with the ledger kept, and with the ledger lost (rebuilt from the logs, re-staged,
    published to the outputs that lack it)."""
    config = pipeline_factory(
        3, transform=TRANSFORM, derived=replaceable_outputs(tmp_path / "derived")
    )
    topic = config.kafka.topic
    kafka_client.produce_records(topic, user_events(0, 300, 3, malformed_every=20))
    live_until_caught_up(config, spark)
    rng = OffsetRange(topic, 1, 10, 80)
    app_id = backfill_app_id(config.pipeline)

    crashed = cli(*replace_args(config_path(config), rng), env=crash_env(point, config))
    assert crashed.returncode == 137, crashed.stdout + crashed.stderr
    batch = crashed_batch(config, app_id)
    assert (batch.batch_id, batch.state) == (1, S.PREPARED)
    assert derived_held(config, app_id, 1)[1:] == (*REPLACE_HELD[point], False)
    lost = without_ledger(config, tmp_path / "ledger-lost")

    for restarted in (config, lost):
        live_until_caught_up(restarted, spark)
        replace(restarted, spark, rng)
        assert sum(assert_exactly_once(restarted, kafka_client)) == 300
        assert_derived_match(restarted)
        assert_replaced_something(restarted)
        assert all(derived_held(restarted, app_id, 1))
        store = LedgerStore(restarted.ledger.url)
        try:
            done = [b for b in store.batches(app_id=app_id) if b.state is S.ACKED]
        finally:
            store.dispose()
        assert len(done) == 1, [(b.batch_id, b.state) for b in store.batches(app_id=app_id)]


def test_a_replace_under_a_live_pipeline_with_derived_outputs(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Path
) -> None:
    """A producer keeps writing and `exactly run` keeps committing micro-batches (to the
    raw table and every derived output, under the live app id) while the replace plans,
    stages and publishes: every record is once in the raw table or the quarantine, and
    every derived output equals its recomputation."""
    config = pipeline_factory(
        3, max_records=150, transform=TRANSFORM, derived=replaceable_outputs(tmp_path / "derived")
    )
    topic = config.kafka.topic
    kafka_client.produce_records(topic, user_events(0, 600, 3, malformed_every=40))
    live_until_caught_up(config, spark)
    kafka_client.produce_records(topic, user_events(600, 300, 3, malformed_every=40))

    stop = threading.Event()
    produced = [900]

    def produce() -> None:
        while not stop.is_set() and produced[0] < 3000:
            records = user_events(produced[0], 50, 3, malformed_every=40)
            kafka_client.produce_records(topic, records)
            produced[0] += 50
            stop.wait(0.5)

    producer = threading.Thread(target=produce)
    producer.start()
    # continuous, not --until-caught-up: a live process that caught up between two produced
    # chunks would exit before the replace ran, and the test would prove nothing
    live = subprocess.Popen(
        [*CLI, "run", "-c", str(config_path(config)), "--continuous", "--min-interval", "0.5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    store = LedgerStore(config.ledger.url)
    try:
        before = max(b.batch_id for b in store.batches(app_id=config.app_id))
        deadline = time.monotonic() + 180
        # the live process is committing before the replace is planned
        while not any(
            b.batch_id > before and b.state in (S.COMMITTED, S.ACKED)
            for b in store.batches(app_id=config.app_id)
        ):
            assert time.monotonic() < deadline and live.poll() is None
            time.sleep(0.5)
        tpc = build_backfill(config, transform=TRANSFORM_V2, spark_factory=lambda: spark)
        batch, planned = plan_backfill(
            tpc,
            live_app_id=config.app_id,
            mode=BackfillMode.REPLACE,
            ranges=[OffsetRange(topic, 1, 20, 180)],
            transform=TRANSFORM_V2,
            replace_refusals=config.replace_refusals(),
        )
        assert planned
        batch, output = tpc.invoke(batch)
        voted = tpc.pre_commit(batch, output)
        # ... and commits between the replace's vote and its commit, where the corrections
        # read the raw table: waited for, not left to the machine's timing
        while not any(
            b.committed_at is not None and b.committed_at > voted.prepared_at
            for b in store.batches(app_id=config.app_id)
        ):
            assert time.monotonic() < deadline + 180 and live.poll() is None
            time.sleep(0.2)
        done = tpc.ack(tpc.commit(voted))
        assert done.committed_at is not None
        beside = [
            b.batch_id
            for b in store.batches(app_id=config.app_id)
            if b.committed_at is not None and done.created_at < b.committed_at < done.committed_at
        ]
    finally:
        store.dispose()
        stop.set()
        producer.join()
        live.send_signal(signal.SIGTERM)
        out = live.communicate(timeout=600)[0]
    assert live.returncode == 0, out
    assert done.state is S.ACKED
    assert beside, "no live batch committed while the replace ran"
    live_until_caught_up(config, spark)
    table, quarantined = assert_exactly_once(config, kafka_client)
    assert table + quarantined == produced[0]
    assert_derived_match(config)
    assert_replaced_something(config)
