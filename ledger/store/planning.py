"""Planning a batch: one transaction that takes the pipeline's planning lock, refuses while a
batch is in flight (the one in-flight guard, BLOCKS_PLANNING), reads the positions and
records the new PLANNED batch continued from them.

Everything a plan decides on is read inside that transaction, so two planners can never
both build on the same positions. One skeleton (`_plan_in`) plans a batch on one topic and
on several; what differs between them, which positions the batch continues from, how
contiguity is checked and which positions adopt a topic id, is a `_Continuation`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row
from sqlalchemy.exc import IntegrityError

from ledger.core.batch import Batch, BatchKind
from ledger.core.decisions import EXACTLY, Decision, DecisionKind, new_decision_id
from ledger.core.errors import BusyError, InconsistencyError
from ledger.core.ports import RangesFor
from ledger.core.protocol import (
    BLOCKS_PLANNING,
    BatchState,
    OffsetRange,
    Owner,
    Positions,
    check_contiguous,
)
from ledger.core.topic_plan import check_contiguous_by_topic, decisions_of
from ledger.host.process import this_owner
from ledger.store import reads
from ledger.store.connection import LedgerConnection
from ledger.store.db_clock import db_now
from ledger.store.rows import insert_batch, insert_decision, insert_ranges, lock_pipeline
from ledger.store.schema import batches_table


class Planning(LedgerConnection):
    """`plan`: the store's planning transaction."""

    def plan(
        self,
        *,
        pipeline: str,
        app_id: str,
        kind: BatchKind,
        ranges_for: RangesFor,
        owner: Owner | None = None,
        params: Mapping[str, Any] | None = None,
        batch_id: int | None = None,
        contiguous: bool = True,
        check: Callable[[Sequence[Batch]], None] | None = None,
        topic_id: str | None = None,
        topic_ids: Mapping[str, str] | None = None,
    ) -> Batch | None:
        """Record a new PLANNED batch with the next batch id, in one transaction.

        `ranges_for(positions) -> list[OffsetRange] | None` computes the ranges from the stored
        positions read inside the same transaction, so two planners can never both build on
        the same positions: the batch id is the primary key and the loser's insert fails.
        Backfills pass `contiguous=False`: their ranges are chosen by an operator, not
        continued from the previous batch. `batch_id` names the new batch (it must be
        above every existing id); by default it is the next one. Refuses while a batch of
        this application id has not been published yet (BLOCKS_PLANNING; a COMMITTED batch
        whose advisory ack is outstanding does not hold the next one up). When `ranges_for`
        returns None nothing is recorded and None is returned.

        `check(batches)`, if given, runs in the same transaction with every batch of
        `pipeline` (all its application ids) and raises to refuse: a backfill's rules
        (ledger/core/backfill.py) are decided on what this transaction reads, and the planning
        lock of the pipeline keeps every other planner of it, live or backfill, out until
        the batch is recorded.

        `topic_id` is the topic incarnation the ranges are planned on, stored with each
        range. `ranges_for` receives the positions with their topic id and refuses a
        different one (ledger/core/protocol.py check_topic_identity); live positions that carry
        none adopt `topic_id` here, recorded as a decision. The batch records the decisions
        its positions were moved by, for its commit to carry (invariant 15).

        `topic_ids` instead of `topic_id`: the batch reads several topics (the id of each,
        by name). `ranges_for` then receives the positions per topic (positions_by_topic),
        contiguity and the adoption of an id are per topic, and every range is stored with
        its own topic's id (ledger/core/topic_plan.py).
        """
        on: _Continuation = _OneTopic(topic_id) if topic_ids is None else _Topics(topic_ids)
        owner = owner or this_owner()
        try:
            with self._tx() as conn:
                planned = _plan_in(
                    conn,
                    pipeline=pipeline,
                    app_id=app_id,
                    kind=kind,
                    ranges_for=ranges_for,
                    owner=owner,
                    params=params,
                    batch_id=batch_id,
                    contiguous=contiguous,
                    check=check,
                    on=on,
                )
        except IntegrityError as exc:
            raise BusyError(
                f"{app_id}: another process planned the next batch at the same moment; "
                "run again to continue after it"
            ) from exc
        if planned is None:
            return None
        with self._read() as conn:
            batch = reads.get(conn, app_id, planned)
        assert batch is not None
        return batch


def _plan_in(
    conn: Connection,
    *,
    pipeline: str,
    app_id: str,
    kind: BatchKind,
    ranges_for: RangesFor,
    owner: Owner,
    params: Mapping[str, Any] | None,
    batch_id: int | None,
    contiguous: bool,
    check: Callable[[Sequence[Batch]], None] | None,
    on: _Continuation,
) -> int | None:
    """The planning transaction's steps, on one topic or several (`on`): the new batch's
    id, or None when `ranges_for` proposes nothing."""
    lock_pipeline(conn, pipeline)
    refuse_in_flight(conn, app_id)
    if check is not None:
        check(reads.pipeline_batches(conn, pipeline))
    positions = on.positions(conn, app_id)
    last_id = reads.last_batch_id(conn, app_id)
    batch_id = _next_id(app_id, batch_id, last_id)
    proposed = ranges_for(positions)
    if proposed is None:
        return None
    new_ranges = list(proposed)
    decisions: list[Decision] = []
    if contiguous:

        def adopt(held: Positions, topic_id: str) -> Decision:
            return _adopt(conn, pipeline, app_id, held, topic_id, last_id)

        decisions = on.continue_from(positions, new_ranges, f"{app_id}/{batch_id}", adopt)
    insert_batch(
        conn,
        app_id=app_id,
        batch_id=batch_id,
        pipeline=pipeline,
        kind=kind,
        state=BatchState.PLANNED,
        owner=owner,
        created_at=db_now(),
        params=params,
        decisions=decisions,
    )
    insert_ranges(conn, app_id, batch_id, new_ranges, on.ids)
    return batch_id


#: Records that positions without a topic id take the given one, and returns the decision.
_Adopt = Callable[[Positions, str], Decision]


class _Continuation(Protocol):
    """How a batch continues from the positions: of one topic, or of several."""

    @property
    def ids(self) -> str | Mapping[str, str] | None:
        """The topic id stored with each range: one for all, or each topic's by name."""

    def positions(self, conn: Connection, app_id: str) -> Any:
        """The positions `ranges_for` receives."""

    def continue_from(
        self, positions: Any, new_ranges: list[OffsetRange], label: str, adopt: _Adopt
    ) -> list[Decision]:
        """Refuse ranges that are not contiguous with the positions; the decisions the batch
        is planned on, with an adoption for positions recorded without a topic id."""


@dataclass(frozen=True)
class _OneTopic:
    ids: str | None

    def positions(self, conn: Connection, app_id: str) -> Positions:
        return reads.positions(conn, app_id)

    def continue_from(
        self, positions: Positions, new_ranges: list[OffsetRange], label: str, adopt: _Adopt
    ) -> list[Decision]:
        check_contiguous(positions, new_ranges, label)
        decisions = list(positions.decisions)
        if self.ids is not None and positions.topic_id is None and positions:
            decisions.append(adopt(positions, self.ids))
        return decisions


@dataclass(frozen=True)
class _Topics:
    ids: Mapping[str, str]

    def positions(self, conn: Connection, app_id: str) -> dict[str, Positions]:
        return reads.positions_by_topic(conn, app_id)

    def continue_from(
        self,
        positions: dict[str, Positions],
        new_ranges: list[OffsetRange],
        label: str,
        adopt: _Adopt,
    ) -> list[Decision]:
        check_contiguous_by_topic(positions, new_ranges, label, self.ids)
        decisions = decisions_of(positions)
        for topic, held in positions.items():
            if held.topic_id is None and held and not held.retired and topic in self.ids:
                decisions.append(adopt(held, self.ids[topic]))
        return decisions


def first_in_flight(conn: Connection, app_id: str) -> Row[Any] | None:
    """A batch of `app_id` that holds the next one up (BLOCKS_PLANNING), if any: its id,
    state and owner."""
    return conn.execute(
        sa.select(batches_table.c.batch_id, batches_table.c.state, batches_table.c.owner)
        .where(
            batches_table.c.app_id == app_id,
            batches_table.c.state.in_([str(s) for s in BLOCKS_PLANNING]),
        )
        .limit(1)
    ).first()


def refuse_in_flight(conn: Connection, app_id: str) -> None:
    """One batch at a time (BLOCKS_PLANNING): BusyError while one is not published."""
    in_flight = first_in_flight(conn, app_id)
    if in_flight is not None:
        raise BusyError(
            f"{app_id}: batch {in_flight.batch_id} is still {in_flight.state} "
            f"(owner {in_flight.owner}); recover it before planning another"
        )


def _next_id(app_id: str, batch_id: int | None, last_id: int | None) -> int:
    """`batch_id`, or the next id; ids only grow."""
    if batch_id is None:
        return (last_id or 0) + 1
    if batch_id <= (last_id or 0):
        raise InconsistencyError(
            f"{app_id}: cannot plan batch {batch_id}: the ledger is already at "
            f"batch {last_id} and batch ids only grow"
        )
    return batch_id


def _adopt(
    conn: Connection,
    pipeline: str,
    app_id: str,
    positions: Positions,
    topic_id: str,
    last_id: int | None,
) -> Decision:
    """Record positions without a topic id taking the topic's current one, and return the
    decision."""
    decision = Decision(
        id=new_decision_id(),
        pipeline=pipeline,
        app_id=app_id,
        kind=DecisionKind.ADOPT_TOPIC_ID,
        topic=positions.topic or "",
        topic_id=topic_id,
        previous_topic_id=None,
        after_batch_id=last_id or 0,
        reason=(
            "the positions were recorded before exactly stored topic ids (ledger schema "
            "1); they continue on the topic's current id"
        ),
        decided_by=EXACTLY,
        decided_at=reads.db_time(conn),
        previous_positions=dict(positions),
    )
    insert_decision(conn, decision)
    return decision
