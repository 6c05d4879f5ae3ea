"""The order the bench runs its contenders in (bench/harness.py `contender_order`): plain
lists, no JVM. A contender pays for what the one before it left, so a fixed order would
charge that to one side of every ratio."""

from __future__ import annotations

import pytest

from bench.harness import CONTENDERS, PEER, contender_order

pytestmark = pytest.mark.unit


def test_over_three_repetitions_each_contender_runs_once_in_each_place() -> None:
    orders = [contender_order(i) for i in range(3)]
    assert orders[0] == list(CONTENDERS)
    for order in orders:
        assert sorted(order) == sorted(CONTENDERS)
    for place in range(len(CONTENDERS)):
        assert sorted(order[place] for order in orders) == sorted(CONTENDERS)


def test_the_peer_is_not_always_last() -> None:
    assert [order.index(PEER) for order in map(contender_order, range(3))] == [2, 1, 0]
    assert contender_order(3) == contender_order(0)
