"""Pure unit tests of ledger/core/protocol.py: the state machine and offset planning. No I/O."""

from __future__ import annotations

import itertools

import pytest

from ledger.core.errors import DataLossError, InconsistencyError
from ledger.core.protocol import (
    ABANDONABLE,
    HOLDS_RANGE,
    IN_FLIGHT,
    MUST_FINISH,
    RESTAGE_MOVE,
    TRANSITIONS,
    Available,
    BatchState,
    OffsetRange,
    Owner,
    check_contiguous,
    check_ranges_readable,
    check_readable,
    check_transition,
    is_empty,
    owner_may_be_alive,
    plan_ranges,
    positions_after,
    worth_planning,
)

S = BatchState

LEGAL = {
    (S.PLANNED, S.STAGED),
    (S.PLANNED, S.ABORTED),
    (S.STAGED, S.PREPARED),
    (S.STAGED, S.ABORTED),
    (S.PREPARED, S.COMMITTED),
    (S.PREPARED, S.PLANNED),  # re-stage, with a reason only (invariant 11)
    (S.COMMITTED, S.ACKED),
}
ALL_PAIRS = set(itertools.product(BatchState, BatchState))
ILLEGAL = sorted(ALL_PAIRS - LEGAL)


# -- the transition table ---------------------------------------------------------------


def test_transition_table_is_exactly_the_documented_graph() -> None:
    actual = {(src, dst) for src, targets in TRANSITIONS.items() for dst in targets}
    assert actual == LEGAL
    assert set(TRANSITIONS) == set(BatchState)


@pytest.mark.parametrize(("current", "target"), sorted(LEGAL))
def test_legal_transitions_pass(current: BatchState, target: BatchState) -> None:
    assert check_transition("app/1", current, target, reason="staged files vanished") is None


def test_the_one_move_back_needs_a_reason() -> None:
    assert RESTAGE_MOVE == (S.PREPARED, S.PLANNED)
    for reason in (None, ""):
        with pytest.raises(InconsistencyError, match=r"PREPARED -> PLANNED \(re-stage\) needs a"):
            check_transition("app/1", S.PREPARED, S.PLANNED, reason=reason)
    # no other move back exists, with or without a reason
    for current, target in [
        (S.STAGED, S.PLANNED),
        (S.COMMITTED, S.PREPARED),
        (S.PREPARED, S.STAGED),
    ]:
        with pytest.raises(InconsistencyError, match="illegal transition"):
            check_transition("app/1", current, target, reason="because")


@pytest.mark.parametrize(("current", "target"), ILLEGAL)
def test_illegal_transitions_raise_naming_both_states(
    current: BatchState, target: BatchState
) -> None:
    with pytest.raises(InconsistencyError) as info:
        check_transition("app/7 attempt 1", current, target)
    message = str(info.value)
    assert f"{current} -> {target}" in message
    assert "app/7 attempt 1" in message


def test_prepared_can_never_be_aborted() -> None:
    assert S.ABORTED not in TRANSITIONS[S.PREPARED]
    with pytest.raises(InconsistencyError, match="PREPARED -> ABORTED"):
        check_transition("app/1", S.PREPARED, S.ABORTED)
    assert S.PREPARED in MUST_FINISH
    assert S.PREPARED not in ABANDONABLE


def test_terminal_states_allow_nothing() -> None:
    for state in (S.ACKED, S.ABORTED):
        assert TRANSITIONS[state] == frozenset()
        with pytest.raises(InconsistencyError, match="only nothing is allowed"):
            check_transition("app/1", state, S.PLANNED)


def test_state_groups() -> None:
    assert frozenset({S.PREPARED, S.COMMITTED}) == MUST_FINISH
    assert frozenset({S.PLANNED, S.STAGED}) == ABANDONABLE
    assert frozenset({S.PLANNED, S.STAGED, S.PREPARED, S.COMMITTED}) == IN_FLIGHT
    assert set(BatchState) - {S.ABORTED} == HOLDS_RANGE


# -- OffsetRange --------------------------------------------------------------------------


def test_offset_range_valid_and_empty() -> None:
    rng = OffsetRange("t", 0, 5, 9)
    assert rng.span == 4
    assert str(rng) == "t-0[5,9)"
    assert OffsetRange("t", 1, 3, 3).span == 0


@pytest.mark.parametrize(("start", "end"), [(-1, 3), (5, 4), (-2, -1)])
def test_offset_range_rejects_invalid(start: int, end: int) -> None:
    with pytest.raises(InconsistencyError) as info:
        OffsetRange("events", 2, start, end)
    assert f"events-2: invalid offset range [{start}, {end})" in str(info.value)


def test_is_empty_and_positions_after() -> None:
    ranges = [OffsetRange("t", 0, 3, 3), OffsetRange("t", 1, 7, 7)]
    assert is_empty(ranges)
    assert is_empty([])
    assert not is_empty([*ranges, OffsetRange("t", 2, 0, 1)])
    assert positions_after([OffsetRange("t", 0, 3, 8), OffsetRange("t", 4, 0, 2)]) == {0: 8, 4: 2}


# -- plan_ranges --------------------------------------------------------------------------


def test_plan_starts_at_stored_positions() -> None:
    available = {0: Available(0, 100), 1: Available(0, 50)}
    ranges = plan_ranges("t", {0: 40, 1: 50}, available, 1000)
    assert ranges == [OffsetRange("t", 0, 40, 100), OffsetRange("t", 1, 50, 50)]


def test_plan_new_partition_starts_at_earliest() -> None:
    available = {0: Available(10, 20), 1: Available(7, 30), 2: Available(0, 0)}
    ranges = plan_ranges("t", {0: 15}, available, 1000)
    assert ranges == [
        OffsetRange("t", 0, 15, 20),
        OffsetRange("t", 1, 7, 30),
        OffsetRange("t", 2, 0, 0),
    ]


def test_starting_offsets_latest_is_where_the_topic_starts_not_a_partition_added_later() -> None:
    """`latest` pins where the pipeline starts reading a topic. A partition added to the
    topic once it is read holds only records produced since: it starts at its earliest
    offset (as Structured Streaming and Flink start a newly discovered partition); its last
    stable offset would skip, silently, every record produced to it before this plan."""
    available = {0: Available(0, 40), 1: Available(0, 12), 2: Available(3, 30)}
    first = plan_ranges("t", {}, available, 1000, "latest")
    assert first == [
        OffsetRange("t", 0, 40, 40),
        OffsetRange("t", 1, 12, 12),
        OffsetRange("t", 2, 30, 30),
    ]
    assert worth_planning(first, {}, "latest")  # the start must be pinned

    later = plan_ranges("t", {0: 40, 1: 12}, available, 1000, "latest")
    assert later == [
        OffsetRange("t", 0, 40, 40),
        OffsetRange("t", 1, 12, 12),
        OffsetRange("t", 2, 3, 30),
    ]
    # a partition added empty starts at its earliest, which does not move: no batch to pin it
    empty = {**available, 2: Available(0, 0)}
    pinned = plan_ranges("t", {0: 40, 1: 12}, empty, 1000, "latest")
    assert not worth_planning(pinned, {0: 40, 1: 12}, "latest")


def test_plan_end_bounded_by_last_stable_and_max_records() -> None:
    available = {0: Available(0, 1_000), 1: Available(0, 12), 2: Available(500, 2_000)}
    ranges = plan_ranges("t", {0: 100, 1: 10}, available, 50)
    assert ranges == [
        OffsetRange("t", 0, 100, 150),  # max_records bound
        OffsetRange("t", 1, 10, 12),  # last_stable bound
        OffsetRange("t", 2, 500, 550),  # new partition, max_records bound
    ]


def test_plan_sorted_by_partition_and_contiguous_over_successive_batches() -> None:
    available = {2: Available(0, 25), 0: Available(0, 25), 1: Available(0, 3)}
    positions: dict[int, int] = {}
    consumed: dict[int, list[OffsetRange]] = {0: [], 1: [], 2: []}
    for _ in range(5):
        ranges = plan_ranges("t", positions, available, 10)
        assert [r.partition for r in ranges] == [0, 1, 2]
        check_contiguous(positions, ranges, "b")
        for rng in ranges:
            consumed[rng.partition].append(rng)
        positions = positions_after(ranges)
    assert positions == {0: 25, 1: 3, 2: 25}
    for partition, rngs in consumed.items():
        assert rngs[0].start == 0
        for prev, nxt in itertools.pairwise(rngs):
            assert prev.end == nxt.start, partition
    assert [r.end for r in consumed[0]] == [10, 20, 25, 25, 25]


def test_plan_caught_up_gives_empty_ranges() -> None:
    ranges = plan_ranges("t", {0: 9}, {0: Available(0, 9)}, 10)
    assert ranges == [OffsetRange("t", 0, 9, 9)]
    assert is_empty(ranges)


def test_plan_data_loss_names_partition_and_offsets() -> None:
    with pytest.raises(DataLossError) as info:
        plan_ranges("clicks", {0: 5, 3: 40}, {0: Available(0, 10), 3: Available(70, 90)}, 100)
    message = str(info.value)
    assert "clicks-3" in message
    assert "[40, 70)" in message
    assert "earliest available is 70" in message


def test_plan_vanished_partition_is_inconsistency() -> None:
    with pytest.raises(InconsistencyError) as info:
        plan_ranges("clicks", {0: 5, 1: 6, 2: 7}, {0: Available(0, 10)}, 100)
    message = str(info.value)
    assert "[1, 2]" in message
    assert "clicks" in message
    assert not isinstance(info.value, DataLossError)


def test_plan_start_past_last_stable_is_inconsistency() -> None:
    with pytest.raises(InconsistencyError) as info:
        plan_ranges("clicks", {0: 500}, {0: Available(0, 20)}, 100)
    message = str(info.value)
    assert "clicks-0" in message
    assert "500" in message
    assert "20" in message


@pytest.mark.parametrize("limit", [0, -1])
def test_plan_rejects_non_positive_limit(limit: int) -> None:
    with pytest.raises(InconsistencyError, match=f"got {limit}"):
        plan_ranges("t", {}, {0: Available(0, 10)}, limit)


def test_check_readable_boundaries() -> None:
    avail = Available(10, 20)
    check_readable("t", 0, 10, avail)  # exactly earliest
    check_readable("t", 0, 20, avail)  # exactly last_stable: empty range, fine
    with pytest.raises(DataLossError, match=r"\[9, 10\)"):
        check_readable("t", 0, 9, avail)
    with pytest.raises(InconsistencyError, match="stored offset 21"):
        check_readable("t", 0, 21, avail)


# -- check_contiguous ---------------------------------------------------------------------


def test_contiguous_accepts_matching_and_new_partitions() -> None:
    check_contiguous({0: 10}, [OffsetRange("t", 0, 10, 20), OffsetRange("t", 1, 0, 5)], "b")
    check_contiguous({}, [OffsetRange("t", 0, 3, 4)], "b")


def test_contiguous_rejects_gap() -> None:
    with pytest.raises(InconsistencyError) as info:
        check_contiguous({0: 10, 1: 4}, [OffsetRange("t", 1, 6, 9)], "app/3")
    message = str(info.value)
    assert "skips" in message
    assert "app/3" in message
    assert "stored offset for t-1 is 4" in message
    assert "requested start is 6" in message


def test_contiguous_rejects_overlap() -> None:
    with pytest.raises(InconsistencyError) as info:
        check_contiguous({0: 10}, [OffsetRange("t", 0, 8, 12)], "app/3")
    message = str(info.value)
    assert "overlaps" in message
    assert "stored offset for t-0 is 10" in message
    assert "requested start is 8" in message


# -- check_ranges_readable ----------------------------------------------------------------


def test_ranges_readable_ok() -> None:
    check_ranges_readable(
        [OffsetRange("t", 0, 5, 10), OffsetRange("t", 1, 0, 0)],
        {0: Available(5, 10), 1: Available(3, 9)},  # partition 1's range is empty: fine
    )


def test_ranges_readable_missing_partition() -> None:
    with pytest.raises(DataLossError) as info:
        check_ranges_readable([OffsetRange("t", 4, 0, 3)], {0: Available(0, 3)})
    assert "t-4[0,3)" in str(info.value)
    assert "partition 4 no longer exists" in str(info.value)


def test_ranges_readable_retention_overtook_range() -> None:
    with pytest.raises(DataLossError) as info:
        check_ranges_readable([OffsetRange("t", 0, 5, 10)], {0: Available(7, 30)})
    assert "[5, 7)" in str(info.value)
    assert "earliest available is 7" in str(info.value)
    with pytest.raises(DataLossError, match=r"\[5, 10\)"):
        check_ranges_readable([OffsetRange("t", 0, 5, 10)], {0: Available(15, 30)})


# -- owners -------------------------------------------------------------------------------


def test_owner_round_trip() -> None:
    owner = Owner("host-a.example:1", 4242)
    assert str(owner) == "host-a.example:1:4242"
    assert Owner.parse(str(owner)) == owner


def test_owner_round_trip_with_start_time_and_boot() -> None:
    boot = "6f1c0f0e-6a4e-4c1b-9d3e-2b7f0a1c5d42"
    owner = Owner("host-a.example:1", 4242, started=987654, boot=boot)
    assert str(owner).startswith("host-a.example:1:4242")
    assert Owner.parse(str(owner)) == owner
    assert Owner.parse(str(Owner("h", 7, started=5))) == Owner("h", 7, started=5)


def test_owner_rows_written_before_start_times_still_parse() -> None:
    assert Owner.parse("old-host:1") == Owner("old-host", 1)
    assert Owner.parse("host-a.example:1:4242") == Owner("host-a.example:1", 4242)
    assert Owner.parse("old-host:1").started is None


def test_owner_same_process_compares_start_and_boot_where_both_record_them() -> None:
    me = Owner("h", 7, started=500, boot="b1")
    assert me.same_process(Owner("h", 7, started=500, boot="b1"))
    assert not me.same_process(Owner("h", 7, started=499, boot="b1"))  # the pid was reused
    assert not me.same_process(Owner("h", 7, started=500, boot="b2"))  # after a reboot
    assert not me.same_process(Owner("h", 8, started=500, boot="b1"))
    assert not me.same_process(Owner("g", 7, started=500, boot="b1"))
    assert me.same_process(Owner("h", 7))  # recorded before start times: the pid decides
    assert Owner("h", 7).same_process(me)


def test_owner_same_host_uses_pid_table_not_heartbeat() -> None:
    owner = Owner("me", 10)
    assert owner_may_be_alive(owner, 10_000.0, 120.0, "me", pid_alive=True) is True
    assert owner_may_be_alive(owner, 0.0, 120.0, "me", pid_alive=False) is False


def test_owner_other_host_uses_lease() -> None:
    owner = Owner("elsewhere", 10)
    assert owner_may_be_alive(owner, 119.9, 120.0, "me", pid_alive=False) is True
    assert owner_may_be_alive(owner, 120.0, 120.0, "me", pid_alive=True) is False
    assert owner_may_be_alive(owner, 500.0, 120.0, "me", pid_alive=True) is False
