"""The fates the history sensor tells (orchestration/health/fates.py), as pure decisions:
which batch read an abandoned batch's offsets again, which live batches a replace replaced,
and the sentences."""

from __future__ import annotations

import pytest

from ledger.core.batch import BatchKind
from ledger.core.protocol import BatchState, OffsetRange
from orchestration.health.fates import (
    fate_text,
    has_fate,
    is_replace,
    replaced,
    rereader,
    terminated_text,
    to_tell,
)
from tests.fixtures.batches import a_batch

pytestmark = pytest.mark.unit
S = BatchState


def ranges(*spans: tuple[int, int, int]) -> tuple[OffsetRange, ...]:
    return tuple(OffsetRange("t", p, a, b) for p, a, b in spans)


def test_the_rereader_is_the_first_later_batch_that_shares_an_offset() -> None:
    aborted = a_batch(4, S.ABORTED, ranges=ranges((0, 10, 20)), error="owner gone")
    other_partition = a_batch(5, S.ACKED, ranges=ranges((1, 0, 5)))
    again = a_batch(6, S.ACKED, ranges=ranges((0, 10, 30)))
    earlier = a_batch(3, S.ACKED, ranges=ranges((0, 0, 10)))
    assert rereader(aborted, [earlier, again, other_partition]) is again
    said = fate_text(aborted, reread_by=again, finished_by=None)
    assert said.startswith("batch pv/4 was abandoned (ABORTED at ")
    assert said.endswith("): owner gone; its offsets were read again by batch 6 (ACKED)")
    assert rereader(aborted, [other_partition]) is None
    skipped = fate_text(aborted, reread_by=None, finished_by=None)
    assert skipped.endswith("no later batch read its offsets (a decision skipped them)")
    empty = a_batch(7, S.ABORTED, ranges=ranges((0, 30, 30)), error="refused")
    assert fate_text(empty, reread_by=None, finished_by=None).endswith(
        "it held no offsets, so none were to be read again"
    )


def test_a_voted_batch_has_a_fate_only_when_a_later_attempt_finished_it() -> None:
    first = a_batch(2, S.ACKED)
    taken = a_batch(2, S.ACKED, attempt=2)
    assert not has_fate(first) and has_fate(taken) and has_fate(a_batch(2, S.ABORTED))
    assert not has_fate(a_batch(2, S.PREPARED, attempt=3))  # not finished yet
    assert fate_text(taken, finished_by="run-9").startswith(
        "batch pv/2 voted, and its first attempt did not finish it: run run-9 finished it "
        "under attempt 2 (ACKED at "
    )
    assert "recovery outside Dagster finished it" in fate_text(taken, finished_by=None)


def test_a_replace_replaced_the_published_batches_of_its_ranges_in_its_topic_incarnation() -> None:
    replace = a_batch(
        1,
        S.ACKED,
        app_id="pv.backfill",
        kind=BatchKind.BACKFILL,
        params={"mode": "replace"},
        ranges=ranges((0, 5, 25)),
        topic_ids={"t": "new"},
    )
    assert is_replace(replace) and to_tell(replace)
    assert not is_replace(a_batch(1, S.ACKED, kind=BatchKind.BACKFILL, params={"mode": "fill"}))
    live = [
        a_batch(1, S.ACKED, ranges=ranges((0, 0, 10)), topic_ids={"t": "new"}),
        a_batch(2, S.ACKED, ranges=ranges((0, 10, 20)), topic_ids={"t": "new"}),
        a_batch(3, S.ACKED, ranges=ranges((0, 20, 40)), topic_ids={"t": "old"}),  # re-created
        a_batch(4, S.ABORTED, ranges=ranges((0, 20, 40)), topic_ids={"t": "new"}),
        a_batch(5, S.ACKED, ranges=ranges((0, 40, 50)), topic_ids={"t": "new"}),
    ]
    assert [b.batch_id for b in replaced(replace, live)] == [1, 2]


def test_a_terminated_run_says_whether_its_batch_voted() -> None:
    assert terminated_text(None) == "Terminated before it planned a batch: nothing was written."
    planned = terminated_text(a_batch(3, S.STAGED))
    assert planned.startswith("Terminated while batch pv/3 was STAGED: it did not vote")
    voted = terminated_text(a_batch(3, S.PREPARED))
    assert "it voted, so it is never abandoned; the re-drive sensor" in voted
    assert terminated_text(a_batch(3, S.ACKED)).endswith(
        "it is in the table, once; nothing is lost."
    )
