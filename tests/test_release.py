"""An operator's release of a batch a hung owner holds (ledger/coordinator/release.py),
against the coordinator's in-memory fakes of Kafka, Spark and Delta and a real SQLite
ledger. The owner here is this test's parent process: alive, as a hung process is, so
recovery leaves it its batch; the release does not. End to end, with real processes and a
Dagster run: tests/test_abandon.py."""

from __future__ import annotations

import dataclasses
import os
import socket

import pytest

from ledger.coordinator.release import release, released_text
from ledger.coordinator.two_phase import TwoPhaseCommit
from ledger.core.errors import BusyError, DecisionError, FencedError
from ledger.core.protocol import BatchState, Owner
from ledger.store.ledger_store import LedgerStore
from tests import test_two_phase as two_phase
from tests.fixtures.fakes import FakePublisher
from tests.test_two_phase import APP, plan_as, voted

# the coordinator's fixtures, on fakes and a real SQLite ledger
disk, source, stager = two_phase.disk, two_phase.source, two_phase.stager
publisher, tpc = two_phase.publisher, two_phase.tpc

S = BatchState
pytestmark = pytest.mark.unit


def hung() -> Owner:
    """An owner that is alive and going nowhere: the parent of this test process."""
    return Owner(socket.gethostname(), os.getppid())


def test_a_batch_that_never_voted_is_abandoned_and_its_owner_fenced(
    tpc: TwoPhaseCommit, store: LedgerStore
) -> None:
    theirs = plan_as(store, hung(), S.STAGED)
    with pytest.raises(BusyError):
        tpc.recover_and_commit()  # recovery leaves a live owner its batch
    done = release(tpc, 1, "ann", "its run hangs in the stage")
    assert done.state is S.ABORTED
    assert done.error == "abandoned by ann: its run hangs in the stage"
    assert released_text(done).startswith("abandoned batch pageviews/1: its attempt is fenced")
    with pytest.raises(FencedError):
        store.transition(theirs, S.PREPARED)  # the hung owner wakes up and votes: refused
    again = tpc.begin()  # the next batch reads the same ranges
    assert again is not None and again.batch_id == 2
    first = {(r.partition, r.start) for r in again.ranges}
    assert {(r.partition, r.start) for r in theirs.ranges} <= first


def test_a_voted_batch_is_never_abandoned_but_finished_and_its_owner_fenced(
    tpc: TwoPhaseCommit, store: LedgerStore, publisher: FakePublisher
) -> None:
    theirs = store.takeover(voted(tpc), hung())
    with pytest.raises(BusyError):
        tpc.recover_and_commit()
    done = release(tpc, 1, "ann", "hung after its vote")
    assert done.state is S.ACKED and done.metrics["taken_over_by"] == "ann: hung after its vote"
    assert "had voted, so it is never abandoned" in released_text(done)
    with pytest.raises(FencedError):
        tpc.commit(theirs)  # the hung owner wakes up and commits: refused
    assert publisher.published_ids() == [1]


def test_nothing_to_release_is_refused_in_one_sentence(
    tpc: TwoPhaseCommit, store: LedgerStore
) -> None:
    with pytest.raises(DecisionError, match="there is no batch pageviews/7 in the ledger"):
        release(tpc, 7, "ann", "typo")
    report = tpc.run_batch()
    assert report is not None
    with pytest.raises(DecisionError, match="batch pageviews/1 is ACKED: published"):
        release(tpc, 1, "ann", "late")
    plan_as(store, hung())
    release(tpc, 2, "ann", "hung")
    with pytest.raises(DecisionError, match=r"pageviews/2 is already ABORTED \(abandoned by"):
        release(tpc, 2, "bob", "twice")


def test_a_batch_that_moves_under_the_release_is_decided_again(
    tpc: TwoPhaseCommit,
    store: LedgerStore,
    publisher: FakePublisher,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The owner was slow, not hung: it voted between the release's read and its write. The
    abort is refused by the fence and the release, reading again, finishes the vote."""
    theirs = store.takeover(voted(tpc), hung())
    staged_copy = store.get(APP, 1)
    assert staged_copy is not None
    stale = dataclasses.replace(staged_copy, state=S.STAGED)  # as read before its vote
    reads = iter([stale])
    real_get = store.get
    monkeypatch.setattr(store, "get", lambda app, i: next(reads, None) or real_get(app, i))
    done = release(tpc, 1, "ann", "hung")
    assert done.state is S.ACKED and publisher.published_ids() == [1]
    assert theirs.attempt < done.attempt
