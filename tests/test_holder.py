"""Who holds a stuck batch and the one action that frees it (orchestration/health/holder.py),
as pure decisions: each case the stuck alert and check must tell apart."""

from __future__ import annotations

from datetime import timedelta
from unittest.mock import MagicMock

import dagster as dg
import pytest

from ledger.core.batch import RESTAGE, BatchKind, utcnow
from ledger.core.protocol import BatchState
from orchestration.health.holder import Holder, holder_metadata, release_text
from orchestration.health.table_checks import judge_stuck
from tests.fixtures.batches import a_batch

S = BatchState
PREPARED = a_batch(7, S.PREPARED)
RECOVER = "`exactly recover -c <config>`"


def test_a_live_owner_outside_dagster_is_named_by_process_and_host() -> None:
    text = release_text(PREPARED, Holder(owner_alive=True, redrive_on=True), "pv")
    assert text == (
        "Its owner, process 1 on h, is alive outside Dagster (a command line or a continuous "
        "run), and recovery leaves a live owner its batch: if it is hung, run `exactly "
        "abandon -c <config> 7 --reason '...'`, which fences its attempt and commits it; then "
        "stop the process."
    )
    backfill = a_batch(7, S.PLANNED, kind=BatchKind.BACKFILL)
    hung = release_text(backfill, Holder(owner_alive=True), "pv")
    assert "`exactly abandon -c <config> 7 --backfill --reason '...'`" in hung
    assert "abandons it, and the next batch reads its ranges again" in hung


def test_a_run_holding_the_batch_is_named_whether_its_owner_lives_or_not() -> None:
    alive = release_text(PREPARED, Holder(True, ("run-a", "run-b"), True), "pv")
    assert alive.startswith(
        "Its owner, process 1 on h, is alive, in Dagster run run-a, and recovery "
    )
    assert alive.endswith(
        "if that run is hung, launch the pv_abandon job with `batch_id: 7, reason: <why>`, "
        "which terminates the run, fences its attempt and commits it."
    )
    unseen = release_text(PREPARED, Holder(False, ("run-a",), False), "pv")
    assert unseen == (
        "Its owner, process 1 on h, is gone, but Dagster still shows run run-a as running "
        "(its process died unseen): terminate that run; then pv_redrive_sensor is stopped: "
        f"turn it on, or run {RECOVER}, which commits it."
    )


@pytest.mark.parametrize(
    ("batch", "finishes"),
    [
        (a_batch(7, S.PREPARED), "commits it"),
        (a_batch(7, S.COMMITTED), "acks it"),
        (a_batch(7, S.PLANNED), "abandons it, and the next batch reads its ranges again"),
        (a_batch(7, S.STAGED), "abandons it, and the next batch reads its ranges again"),
        (a_batch(7, S.PLANNED, metrics={RESTAGE: 1}), "stages it again"),
    ],
)
def test_nothing_holding_it_says_what_recovery_will_do_and_who_does_it(
    batch: object, finishes: str
) -> None:
    on = release_text(batch, Holder(False, (), True), "pv")  # type: ignore[arg-type]
    assert on == (
        "Its owner, process 1 on h, is gone and no Dagster run holds it: "
        f"pv_redrive_sensor {finishes} on its next tick."
    )
    off = release_text(batch, Holder(False, (), False), "pv")  # type: ignore[arg-type]
    assert off.endswith(f"is stopped: turn it on, or run {RECOVER}, which {finishes}.")
    unknown = release_text(batch, Holder(False), "pv")  # type: ignore[arg-type]
    assert unknown.endswith(f"pv_redrive_sensor (when it runs) or {RECOVER} {finishes}.")


def test_the_check_says_each_stuck_batch_s_holder_and_links_the_oldest_one_s_run() -> None:
    now = utcnow()
    old = a_batch(1, S.PREPARED, at=now - timedelta(minutes=9))
    new = a_batch(2, S.PLANNED, at=now - timedelta(minutes=2))
    holders = {"pv/1": Holder(False, ("run-1",), True), "pv/2": Holder(True, (), True)}
    verdict = judge_stuck("pv", [old, new], now, 60, holders)
    assert not verdict.passed
    assert (
        "Batch pv/1: Its owner, process 1 on h, is gone, but Dagster still shows run run-1"
        in verdict.text
    )
    assert "Batch pv/2: Its owner, process 1 on h, is alive outside Dagster" in verdict.text
    assert verdict.metadata["holding_run"] == dg.MetadataValue.dagster_run("run-1")
    assert verdict.metadata["owner_alive"] is False
    assert holder_metadata(Holder(True)) == {"owner_alive": True}


def test_with_the_dagster_ui_s_address_the_run_is_linked_in_the_alert() -> None:
    from orchestration.health.stuck_sensor import _stuck_alert
    from resources.config.sections import AlertSettings

    holder = Holder(True, ("run-a",), True)
    text = release_text(PREPARED, holder, "pv", "https://dagster.example.com/")
    assert "in Dagster run run-a (https://dagster.example.com/runs/run-a), and" in text
    config = MagicMock(pipeline="pv", alerts=AlertSettings(dagster_url="https://d.example"))
    alert = _stuck_alert(config, PREPARED, utcnow(), holder)
    assert alert.details["run_url"] == "https://d.example/runs/run-a"
    assert "(https://d.example/runs/run-a)" in alert.text
    with pytest.raises(ValueError, match="dagster_url"):
        AlertSettings(dagster_url="dagster.example.com")
