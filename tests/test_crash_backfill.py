"""The crash matrix of backfills: a real `exactly backfill` (a fill on a pipeline with every
output kind, a replace on one with the outputs a replace keeps true) killed at each crash
point, then nothing but the next plain `exactly run`, with the ledger kept and lost. Apart
from tests/test_crash.py (live batches, whose helpers it shares) so that the suite's two
workers can run the two halves side by side.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from exactly_cli.pipeline_cmd import ledger_lines, run_pipeline
from ledger.core.backfill import backfill_app_id
from ledger.core.protocol import BatchState, OffsetRange
from ledger.store.ledger_store import LedgerStore
from tests.fixtures.derived import (
    TRANSFORM,
    TRANSFORM_V2,
    assert_derived_match,
    derived_outputs,
    postgres_output,
    replaceable_outputs,
    user_events,
)
from tests.fixtures.pipeline import (
    FIRST_DERIVED_ONLY,
    config_path,
    coordinates,
    crash_env,
    crash_run,
    produced_coordinates,
    save_config,
)
from tests.fixtures.soak import full_size
from tests.test_backfill import apps_by_coordinate, cli
from tests.test_crash import LEFT_IN, derived_held, without_ledger
from tests.test_derived_replace_pipeline import backfill_args

S = BatchState

#: Backfill crash cases: (mode, point). A fill runs on a pipeline with every output kind (two
#: aggregates, an upsert with tombstones, a PostgreSQL aggregate); a replace on one whose
#: outputs a replace keeps true (counts and sums, the upsert: resources/config/derived_spec.py
#: `replace_refusal` refuses min/max and PostgreSQL outputs), so the PostgreSQL points are
#: reached by the fill only.
#: A replace stages as a fill does (the same backfill plan and stage, checked at each of these
#: points by the fill); it differs in its commit, which removes the rows it replaces. So
#: `make test` crashes a replace at the points from its vote on (but REPLACE_WIDE's), and
#: `make soak` at these too, as every crash point of a live batch runs in `make test` and a
#: fill's in `make test` or `make test-wide` (below).
#: A fill commits as a live batch does (tests/test_crash.py crashes that at every point) and
#: as a replace does from its vote on, but for the removal: so `make test` crashes a fill
#: before its vote (after_plan), and `make test-wide` at every other point, each left where
#: `make test` has the same state and the same recovery: before_stage leaves what after_plan
#: leaves; after_stage a staged, unvoted attempt, abandoned as after_plan's batch is, its
#: files as the live batch's after_stage leaves them (tests/test_crash.py); during_stage the
#: half written attempt on the same shared server that the live batch's during_stage leaves
#: (tests/test_crash.py), abandoned as after_stage's is; a voted fill (after_prepare) is
#: finished by the plain run as the replace's after_prepare is, and published as a live
#: batch is; its derived outputs' points are the live batch's (tests/test_crash.py's
#: derived cases) and the replace's between_derived_commits.
STAGE_SIDE = ("after_plan", "before_stage", "during_stage", "after_stage")
FILL_WIDE = (
    "before_stage",
    "during_stage",
    "after_stage",
    "after_prepare",
    "between_derived_commits",
    FIRST_DERIVED_ONLY,
    "between_table_commits",
    "after_delta_commit",
    "after_committed",
    "recovery_after_delta_commit",
    "postgres_before_commit",
    "postgres_after_commit",
)
#: A replace's points from its vote on are in `make test` but these, `make test-wide`'s:
#: between its tables' commits and with its first derived output committed, a replace is
#: crashed in `make test` by tests/test_derived_replace_pipeline.py (the same pipeline and
#: range, finished by the next replace); committed, and in the recovery's own commit, the
#: live batch is (tests/test_crash.py), whose recovery is the same. After its Delta commit
#: (every output and both tables committed, the ledger not told): the live batch's
#: after_delta_commit records such a commit from the logs, and a replace rebuilt from them
#: (`replace+rebuilt`) is between_derived_commits's, with the ledger lost.
REPLACE_WIDE = (
    "between_table_commits",
    FIRST_DERIVED_ONLY,
    "after_delta_commit",
    "after_committed",
    "recovery_after_delta_commit",
)
SOAK_ONLY = [pytest.mark.soak, pytest.mark.skipif(not full_size(), reason="runs in make soak")]
BACKFILL_CASES = [
    *(
        pytest.param("fill", p, marks=pytest.mark.wide) if p in FILL_WIDE else ("fill", p)
        for p in [*LEFT_IN, FIRST_DERIVED_ONLY]
        if p != "after_derived_commit"  # which outputs hold it is the threads': FIRST_DERIVED_ONLY
    ),
    *(
        pytest.param("replace", p, marks=SOAK_ONLY)
        if p in STAGE_SIDE
        else pytest.param("replace", p, marks=pytest.mark.wide)
        if p in REPLACE_WIDE
        else ("replace", p)
        for p in [*LEFT_IN, FIRST_DERIVED_ONLY]
        if not p.startswith("postgres_") and p != "after_derived_commit"
    ),
]
REPLACED = OffsetRange("", 1, 10, 80)  # partition 1, offsets [10, 80): the replace's


def plain_run(config: Any, spark: Any) -> None:
    """The next `exactly run --until-caught-up`, through the CLI's own function: recover
    (rebuilding a lost ledger), then batches until caught up."""
    run_pipeline(config, batches=None, spark_factory=lambda: spark)


def backfill_pipeline(
    mode: str, factory: Any, client: Any, spark: Any, postgres_url: str, root: Path
) -> tuple[Any, OffsetRange, str]:
    """A pipeline with history and the backfill to crash: (config, its range, transform).

    The fill's pipeline (one partition) started at the end of the topic (`latest`) over
    140 records, which were never read: the fill takes them. Its records have
    tombstones and the later ones none (a fill record tombstoned after the live start is
    the open fill-after-tombstone case of docs/derived-tables.md)."""
    if mode == "fill":
        dashboard = postgres_output(postgres_url, f"views_{uuid.uuid4().hex[:12]}")
        derived = [*derived_outputs(root), dashboard]
        config = factory(1, starting_offsets="latest", transform=TRANSFORM, derived=derived)
        older = user_events(0, 140, 1, tombstone_every=7, malformed_every=20)
        client.produce_records(config.kafka.topic, older)
        plain_run(config, spark)  # pins the live start at the end
        client.produce_records(
            config.kafka.topic, user_events(140, 90, 1, tombstone_every=0, malformed_every=20)
        )
        plain_run(config, spark)
        return config, OffsetRange(config.kafka.topic, 0, 0, len(older)), TRANSFORM
    config = factory(3, transform=TRANSFORM, derived=replaceable_outputs(root))
    client.produce_records(config.kafka.topic, user_events(0, 300, 3, malformed_every=20))
    plain_run(config, spark)
    rng = OffsetRange(config.kafka.topic, REPLACED.partition, REPLACED.start, REPLACED.end)
    return config, rng, TRANSFORM_V2


def check_verdicts(config: Any) -> dict[str, Any]:
    """Each derived output's Dagster check verdict now (orchestration/health/derived_checks.py)."""
    from jobs.wiring.pipeline import Pipeline
    from orchestration.health.derived_checks import derived_verdicts

    with Pipeline(config) as pipeline:
        verdicts = derived_verdicts(pipeline, lambda _message: None)
    return {v.check.removesuffix("_matches_recomputation"): v for v in verdicts}


def backfill_batches(config: Any, app_id: str) -> list[Any]:
    store = LedgerStore(config.ledger.url)
    try:
        return store.batches(app_id=app_id)
    finally:
        store.dispose()


def backfill_state(config: Any, app_id: str) -> dict[int, S]:
    return {b.batch_id: b.state for b in backfill_batches(config, app_id)}


def assert_backfill_outcome(
    config: Any,
    client: Any,
    mode: str,
    rng: OffsetRange,
    published: bool,
    apps_before: dict[tuple[int, int], str],
) -> None:
    """The tables after a plain run: every output equal to its recomputation from the raw
    table, the raw table's rows once each, and the backfill all there or not at all."""
    table = coordinates(config.delta.table_uri)
    quarantine = coordinates(config.delta.quarantine_uri)
    stored = table + quarantine
    assert not {c for c, n in stored.items() if n > 1}, "a record stored twice"
    produced = produced_coordinates(client, config.kafka.topic)
    inside = {(rng.partition, o) for o in range(rng.start, rng.end)}
    if mode == "fill" and not published:
        produced -= inside
    assert set(stored) == produced, (
        f"missing {sorted(produced - set(stored))[:10]} extra {sorted(set(stored) - produced)[:10]}"
    )
    if mode == "replace":
        for coord, app in apps_by_coordinate(config).items():
            if coord not in apps_before:
                continue  # a record produced after the crash
            want = apps_before[coord]
            if published and coord in inside and want is not None:
                want = want.upper()
            assert app == want, (coord, app, want)
    assert_derived_match(config)


@pytest.mark.parametrize(("mode", "point"), BACKFILL_CASES)
def test_backfill_crash_then_plain_run_with_and_without_the_ledger(
    mode: str,
    point: str,
    spark: Any,
    kafka_client: Any,
    pipeline_factory: Any,
    postgres_url: str,
    tmp_path: Path,
) -> None:
    """A real `exactly backfill` killed at each crash point; then nothing but the next plain
    `exactly run` (no second backfill command), with the ledger kept and with it lost.

    A backfill that voted is finished by that run (invariant 5), one that did not is
    abandoned; with the ledger lost, a backfill that any output holds is rebuilt from the
    logs and finished, one that no output holds was never published. Every output is then
    equal to its recomputation from the raw table (the derived invariant), output by
    output, the raw table holds every record once, and a backfill is all there or not."""
    config, rng, transform = backfill_pipeline(
        mode, pipeline_factory, kafka_client, spark, postgres_url, tmp_path / "derived"
    )
    app_id = backfill_app_id(config.pipeline)
    apps_before = apps_by_coordinate(config)
    args = backfill_args(config_path(config), mode, rng, transform)
    base = point.partition("#")[0].partition("@")[0]  # the point's name
    if point == "recovery_after_delta_commit":
        crashed = cli(*args, env=crash_env("after_prepare"))
        assert crashed.returncode == 137, crashed.stdout + crashed.stderr
        crash_run(config, point)  # the next start recovers the backfill and dies
    else:
        crashed = cli(*args, env=crash_env(point, config))
        assert crashed.returncode == 137, crashed.stdout + crashed.stderr
        assert f"crash point {base} reached" in crashed.stderr
    assert backfill_state(config, app_id) == {1: LEFT_IN[base]}
    voted = LEFT_IN[base] not in (S.PLANNED, S.STAGED)
    held_somewhere = any(derived_held(config, app_id, 1))
    holding = derived_held(config, app_id, 1)[1:-1]  # each derived output's, config order
    # the topic moves on before anyone restarts
    kafka_client.produce_records(
        config.kafka.topic, user_events(1000, 60, 3 if mode == "replace" else 1, tombstone_every=0)
    )
    lost = without_ledger(config, tmp_path / "ledger-lost")

    for restarted, published in ((config, voted), (lost, held_somewhere)):
        if not derived_held(restarted, app_id, 1)[-1]:
            # an output that holds the backfill the raw table does not fails its check
            # while nobody finishes it (the child is dead; a lost ledger does not know it)
            checked = check_verdicts(restarted)
            for spec, holds in zip(restarted.derived, holding, strict=True):
                failed = not checked[spec.name].passed
                assert failed == holds, (spec.name, checked[spec.name].text)
                if holds:
                    assert f"holds batch {app_id}/1" in checked[spec.name].text
        if restarted is config and point == "after_prepare":
            # `exactly recover` alone finishes it too
            recovered = cli("recover", "-c", str(config_path(config)))
            assert recovered.returncode == 0, recovered.stdout + recovered.stderr
            assert f"recovered batch {app_id}/1: ACKED" in recovered.stdout
            assert "recovered 1 batch(es)" in recovered.stdout
        plain_run(restarted, spark)
        assert all(v.passed for v in check_verdicts(restarted).values())
        assert_backfill_outcome(restarted, kafka_client, mode, rng, published, apps_before)
        states = backfill_state(restarted, app_id)
        if restarted is config:
            assert states == {1: S.ACKED if voted else S.ABORTED}
        else:
            assert states == ({1: S.ACKED} if published else {}), states
            # `exactly ledger` shows the rebuilt backfill with its kind
            lines = ledger_lines(backfill_batches(restarted, app_id))
            assert sum(f" {mode}+rebuilt " in line for line in lines) == int(published), lines
        if published:
            assert all(derived_held(restarted, app_id, 1))


def test_a_backfill_no_start_can_finish_refuses_the_start_naming_the_outputs_holding_it(
    spark: Any, kafka_client: Any, pipeline_factory: Any, postgres_url: str, tmp_path: Path
) -> None:
    """A replace killed with the first derived output holding it, the ledger lost, and its
    offsets then deleted from Kafka: the rebuilt batch must be staged again and cannot be.
    The next `exactly run` refuses in one line naming the batch and the outputs that hold
    it, exit 2, no traceback; the output's Dagster check fails. With the ledger kept the
    vote's files are still there, and the same start finishes it."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    config, rng, transform = backfill_pipeline(
        "replace", pipeline_factory, kafka_client, spark, postgres_url, tmp_path / "derived"
    )
    app_id = backfill_app_id(config.pipeline)
    crashed = cli(
        *backfill_args(config_path(config), "replace", rng, transform),
        env=crash_env(FIRST_DERIVED_ONLY, config),
    )
    assert crashed.returncode == 137, crashed.stdout + crashed.stderr
    lost = without_ledger(config, tmp_path / "ledger-lost")
    admin = AdminClient({"bootstrap.servers": config.kafka.bootstrap_servers})
    deleted = TopicPartition(config.kafka.topic, rng.partition, rng.end)
    for future in admin.delete_records([deleted]).values():
        future.result(timeout=30)

    lost_path = save_config(lost, tmp_path / "ledger-lost.yaml")
    refused = cli("run", "-c", str(lost_path), "--until-caught-up")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    line = refused.stderr.strip()
    assert "\n" not in line and "Traceback" not in refused.stdout + refused.stderr
    assert f"voted batch {app_id}/1 cannot be finished" in line
    assert "are no longer in Kafka" in line
    assert "derived:views_per_app" in line and "hold(s) it and the other outputs do not" in line
    checked = check_verdicts(lost)
    assert not checked["views_per_app"].passed
    assert f"holds batch {app_id}/1" in checked["views_per_app"].text

    plain_run(config, spark)  # the ledger kept: the vote's files publish without Kafka
    assert backfill_state(config, app_id) == {1: S.ACKED}
    assert_derived_match(config)
    assert all(v.passed for v in check_verdicts(config).values())
