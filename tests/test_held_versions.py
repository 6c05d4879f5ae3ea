"""resources/delta/held.py: an application's version in a table never goes down under one
process, and a lower read is refused only when a fresh read agrees (another thread's kept
table may read a moment behind)."""

from __future__ import annotations

import pytest

from ledger.core.errors import InconsistencyError
from resources.delta.held import HeldVersions

pytestmark = pytest.mark.unit


def never() -> int | None:
    raise AssertionError("read afresh although nothing went back")


def test_versions_that_stay_or_grow_pass_without_a_fresh_read() -> None:
    held = HeldVersions("/lake/q")
    held.check("pv", None, never)  # nothing seen yet: a new table, or a first read
    held.check("pv", 3, never)
    held.check("pv", 3, never)
    held.saw("pv", 5)  # a commit of batch 5
    held.check("pv", 5, never)
    held.check("other", None, never)  # another application id has its own history


def test_a_lower_read_that_a_fresh_read_corrects_passes() -> None:
    held = HeldVersions("/lake/q")
    held.check("pv", 4, never)
    held.check("pv", 2, lambda: 4)  # a kept table a moment behind
    with pytest.raises(InconsistencyError, match="held batch 4 of pv"):
        held.check("pv", 2, lambda: 2)


@pytest.mark.parametrize(("fresh", "now"), [(None, "holds none now"), (1, "only batch 1 now")])
def test_a_table_that_went_back_is_refused_naming_both_versions(
    fresh: int | None, now: str
) -> None:
    held = HeldVersions("/lake/q")
    held.saw("pv", 7)
    with pytest.raises(InconsistencyError) as refused:
        held.check("pv", fresh, lambda: fresh)
    line = str(refused.value)
    assert line.startswith("/lake/q: the table went back") and "held batch 7 of pv" in line
    assert now in line and "dropped and created again" in line, line
