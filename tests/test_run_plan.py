"""The decision table of a run that names a batch (ledger/core/run_plan.py `decide_plan`):
plan, re-drive, reprocess, or refuse, on batches built in memory."""

from __future__ import annotations

import pytest

from ledger.core.protocol import BatchState
from ledger.core.run_plan import Refused, RunAction, RunPlan, decide_plan
from tests.fixtures.batches import a_batch

S = BatchState


def test_a_run_that_names_no_batch_plans_the_next_one() -> None:
    assert decide_plan(None, None, [], reprocess=False) == RunPlan(RunAction.PLAN)


def test_a_run_on_a_batch_the_ledger_does_not_hold_after_recovery_plans_it() -> None:
    before = a_batch(3, S.PLANNED)
    assert decide_plan(before, None, [], reprocess=True) == RunPlan(RunAction.PLAN)


@pytest.mark.parametrize("published", [S.COMMITTED, S.ACKED])
def test_a_voted_batch_its_recovery_finished_is_reported_as_re_driven(
    published: BatchState,
) -> None:
    before = a_batch(3, S.PREPARED)
    redriven = a_batch(3, published)
    plan = decide_plan(before, redriven, [a_batch(2, S.ABORTED), redriven], reprocess=False)
    assert plan == RunPlan(RunAction.REDRIVEN, redriven)


def test_a_re_drive_wins_over_a_reprocess_request() -> None:
    before, redriven = a_batch(3, S.PREPARED), a_batch(3, S.COMMITTED)
    assert decide_plan(before, redriven, [redriven], reprocess=True).action is RunAction.REDRIVEN


def test_a_batch_of_another_application_finished_by_recovery_is_not_this_runs() -> None:
    before = a_batch(3, S.COMMITTED)
    other = a_batch(3, S.COMMITTED, app_id="pv-backfill")
    plan = decide_plan(before, before, [other], reprocess=False)
    assert plan == RunPlan(RunAction.REFUSE, before, Refused.ALREADY_COMMITTED)


@pytest.mark.parametrize("committed", [S.COMMITTED, S.ACKED])
def test_a_committed_batch_is_refused_without_the_reprocess_confirmation(
    committed: BatchState,
) -> None:
    batch = a_batch(3, committed)
    plan = decide_plan(batch, batch, [], reprocess=False)
    assert plan == RunPlan(RunAction.REFUSE, batch, Refused.ALREADY_COMMITTED)
    assert plan.refused == "AlreadyCommitted"  # the rejected-input tag the UI shows


def test_a_committed_batch_is_reprocessed_with_the_confirmation() -> None:
    batch = a_batch(3, S.ACKED)
    assert decide_plan(batch, batch, [], reprocess=True) == RunPlan(RunAction.REPROCESS, batch)


def test_an_abandoned_batch_is_refused_even_with_the_reprocess_confirmation() -> None:
    before, abandoned = a_batch(3, S.PLANNED), a_batch(3, S.ABORTED)
    plan = decide_plan(before, abandoned, [abandoned], reprocess=True)
    assert plan == RunPlan(RunAction.REFUSE, abandoned, Refused.ABANDONED)
    assert plan.refused == "AbandonedBatch"


@pytest.mark.parametrize("in_flight", [S.PLANNED, S.STAGED, S.PREPARED])
def test_a_batch_another_attempt_moves_on_is_refused_as_unfinished(
    in_flight: BatchState,
) -> None:
    batch = a_batch(3, in_flight)
    plan = decide_plan(batch, batch, [], reprocess=True)
    assert plan == RunPlan(RunAction.REFUSE, batch, Refused.UNFINISHED)
    assert plan.refused == "UnfinishedBatch"
