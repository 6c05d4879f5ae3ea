"""The commit ledger: durable batch states in the database ledger/store/schema.py describes.

Every state change is one compare-and-set UPDATE on (state, attempt token): a stale attempt
that wakes up later changes zero rows and learns it was fenced (invariant 6). The prepare
vote writes the file list and the new state in one database transaction, so a crash leaves
either no vote or a complete one. A database that does not answer is an UnreachableError
naming it, whichever call found out. Every timestamp is stamped by the database's clock
(ledger/store/db_clock.py), never the writing host's, so ages compare like with like (invariant 17).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError, OperationalError

from ledger.core.batch import RESTAGE, Batch, BatchKind, StagedFile
from ledger.core.decisions import EXACTLY, Decision, DecisionKind, apply_decisions, new_decision_id
from ledger.core.errors import BusyError, FencedError, InconsistencyError, UnreachableError
from ledger.core.protocol import (
    BLOCKS_PLANNING,
    HOLDS_RANGE,
    RESTAGE_MOVE,
    BatchState,
    OffsetRange,
    Owner,
    Positions,
    check_contiguous,
    check_transition,
)
from ledger.core.topic_plan import (
    apply_topic_decisions,
    check_contiguous_by_topic,
    check_one_topic,
    decisions_of,
    positions_by_topic,
)
from ledger.host.process import this_owner
from ledger.store.db_clock import db_now
from ledger.store.schema import (
    batches_table,
    create_ledger_engine,
    decisions_table,
    ensure_schema,
    files_table,
    meta_table,
    ranges_table,
)


def _aware(ts: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; everything here is UTC."""
    if ts is None or ts.tzinfo is not None:
        return ts
    return ts.replace(tzinfo=UTC)


class LedgerStore:
    """Durable batch records for one or many pipelines in one database."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = create_ledger_engine(url)
        ensure_schema(self.engine)

    @property
    def safe_url(self) -> str:
        """The URL without its password: safe for logs and the UI."""
        return self.engine.url.render_as_string(hide_password=True)

    # -- connections --------------------------------------------------------------------

    @contextmanager
    def _reachable(self) -> Iterator[None]:
        """A database that does not answer ends the command with one line naming it (never
        its password), whichever read or write found out."""
        try:
            yield
        except OperationalError as exc:
            raise UnreachableError(f"ledger database {self.safe_url}: {exc.orig}") from exc

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self._reachable(), self.engine.connect() as conn:
            yield conn

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        with self._reachable(), self.engine.begin() as conn:
            yield conn

    # -- reads --------------------------------------------------------------------------

    def _ranges(self, conn: Connection, app_id: str, batch_ids: list[int]) -> dict[int, list]:
        out: dict[int, list[OffsetRange]] = {b: [] for b in batch_ids}
        if not batch_ids:
            return out
        rows = conn.execute(
            sa.select(ranges_table)
            .where(ranges_table.c.app_id == app_id, ranges_table.c.batch_id.in_(batch_ids))
            .order_by(ranges_table.c.topic, ranges_table.c.partition)
        )
        for r in rows:
            out[r.batch_id].append(OffsetRange(r.topic, r.partition, r.start_offset, r.end_offset))
        return out

    def _topic_ids(self, conn: Connection, app_id: str, batch_ids: list[int]) -> dict[int, str]:
        """The topic id each one-topic batch's ranges were planned on; batches recorded
        before topic ids, and batches on several topics (see _ids_by_topic), are absent."""
        return {
            batch_id: next(iter(ids.values()))
            for batch_id, ids in self._ids_by_topic(conn, app_id, batch_ids).items()
            if len(ids) == 1
        }

    def _ids_by_topic(
        self, conn: Connection, app_id: str, batch_ids: list[int]
    ) -> dict[int, dict[str, str]]:
        """Per batch, the id each of its topics was planned on (every range row holds its
        topic's id); batches recorded before topic ids are absent."""
        if not batch_ids:
            return {}
        rows = conn.execute(
            sa.select(ranges_table.c.batch_id, ranges_table.c.topic, ranges_table.c.topic_id)
            .where(
                ranges_table.c.app_id == app_id,
                ranges_table.c.batch_id.in_(batch_ids),
                ranges_table.c.topic_id.is_not(None),
            )
            .distinct()
        )
        out: dict[int, dict[str, str]] = {}
        for r in rows:
            out.setdefault(r.batch_id, {})[r.topic] = r.topic_id
        return out

    def _to_batches(self, conn: Connection, rows: list[Any]) -> list[Batch]:
        by_app: dict[str, list[int]] = {}
        for r in rows:
            by_app.setdefault(r.app_id, []).append(r.batch_id)
        ranges = {app: self._ranges(conn, app, ids) for app, ids in by_app.items()}
        topic_ids = {app: self._ids_by_topic(conn, app, ids) for app, ids in by_app.items()}
        return [
            Batch(
                app_id=r.app_id,
                batch_id=r.batch_id,
                pipeline=r.pipeline,
                kind=BatchKind(r.kind),
                state=BatchState(r.state),
                attempt=r.attempt,
                token=r.token,
                owner=Owner.parse(r.owner),
                heartbeat_at=_aware(r.heartbeat_at),
                created_at=_aware(r.created_at),
                updated_at=_aware(r.updated_at),
                prepared_at=_aware(r.prepared_at),
                committed_at=_aware(r.committed_at),
                table_version=r.table_version,
                error=r.error,
                ranges=tuple(ranges[r.app_id][r.batch_id]),
                schemas=r.schemas or {},
                metrics=r.metrics or {},
                params=r.params or {},
                topic_id=_sole(topic_ids[r.app_id].get(r.batch_id, {})),
                topic_ids=topic_ids[r.app_id].get(r.batch_id, {}),
                decisions=tuple(Decision.from_dict(d) for d in r.decisions or ()),
            )
            for r in rows
        ]

    def now(self) -> datetime:
        """The ledger database's current time: what every age is measured against, because
        every timestamp in the ledger is the database's too (invariant 17)."""
        with self._read() as conn:
            stamp = _aware(conn.execute(sa.select(db_now())).scalar_one())
        assert stamp is not None
        return stamp

    def schema_version(self) -> int:
        with self._read() as conn:
            value = conn.execute(
                sa.select(meta_table.c.value).where(meta_table.c.key == "schema_version")
            ).scalar_one()
        return int(value)

    def get(self, app_id: str, batch_id: int) -> Batch | None:
        with self._read() as conn:
            return self._get(conn, app_id, batch_id)

    def _get(self, conn: Connection, app_id: str, batch_id: int) -> Batch | None:
        rows = conn.execute(
            sa.select(batches_table).where(
                batches_table.c.app_id == app_id, batches_table.c.batch_id == batch_id
            )
        ).all()
        found = self._to_batches(conn, rows)
        return found[0] if found else None

    def batches(
        self,
        *,
        app_id: str | None = None,
        pipeline: str | None = None,
        states: Iterable[BatchState] | None = None,
        limit: int | None = None,
    ) -> list[Batch]:
        """Batches, newest first."""
        query = sa.select(batches_table).order_by(
            batches_table.c.batch_id.desc(), batches_table.c.app_id
        )
        if app_id is not None:
            query = query.where(batches_table.c.app_id == app_id)
        if pipeline is not None:
            query = query.where(batches_table.c.pipeline == pipeline)
        if states is not None:
            query = query.where(batches_table.c.state.in_([str(s) for s in states]))
        if limit is not None:
            query = query.limit(limit)
        with self._read() as conn:
            return self._to_batches(conn, conn.execute(query).all())

    def files(self, app_id: str, batch_id: int) -> list[StagedFile]:
        with self._read() as conn:
            rows = conn.execute(
                sa.select(files_table)
                .where(files_table.c.app_id == app_id, files_table.c.batch_id == batch_id)
                .order_by(files_table.c.target, files_table.c.path)
            ).all()
        return [
            StagedFile(r.target, r.path, r.size, r.records, r.modification_time, r.stats)
            for r in rows
        ]

    def voted_paths(
        self, app_ids: Iterable[str], among: Iterable[str] | None = None
    ) -> set[tuple[str, str]]:
        """(target, path) of every file a vote of these application ids recorded, whatever
        the batch's state now; with `among`, only those paths. For the cleaner, which must
        never delete a voted file (invariant 18)."""
        query = sa.select(files_table.c.target, files_table.c.path).where(
            files_table.c.app_id.in_(list(app_ids))
        )
        if among is not None:
            wanted = sorted(set(among))
            if not wanted:
                return set()
            query = query.where(files_table.c.path.in_(wanted))
        with self._read() as conn:
            return {(r.target, r.path) for r in conn.execute(query)}

    def positions(self, app_id: str) -> Positions:
        """The next offset per partition: the ends of the newest batch that holds a range,
        moved by the operator decisions taken since (ledger/core/decisions.py), with the topic
        id they belong to."""
        with self._read() as conn:
            return self._positions(conn, app_id)

    def _positions(self, conn: Connection, app_id: str) -> Positions:
        last = self._last_holding(conn, app_id)
        held = Positions()
        if last is not None:
            ranges = self._ranges(conn, app_id, [last])[last]
            check_one_topic(app_id, ranges)
            held = Positions(
                {r.partition: r.end for r in ranges},
                topic=ranges[0].topic if ranges else None,
                topic_id=self._topic_ids(conn, app_id, [last]).get(last),
            )
        return apply_decisions(held, last, self._decisions(conn, app_id=app_id))

    def positions_by_topic(self, app_id: str) -> dict[str, Positions]:
        """The next offset per partition of each topic, with each topic's id and the
        decisions that moved it: positions() for a pipeline on several topics."""
        with self._read() as conn:
            return self._positions_by_topic(conn, app_id)

    def _positions_by_topic(self, conn: Connection, app_id: str) -> dict[str, Positions]:
        last = self._last_holding(conn, app_id)
        held: dict[str, Positions] = {}
        if last is not None:
            ids = self._ids_by_topic(conn, app_id, [last]).get(last, {})
            held = positions_by_topic(self._ranges(conn, app_id, [last])[last], ids)
        return apply_topic_decisions(held, last, self._decisions(conn, app_id=app_id))

    def _last_holding(self, conn: Connection, app_id: str) -> int | None:
        """The newest batch of `app_id` whose ranges count as read (HOLDS_RANGE)."""
        return conn.execute(
            sa.select(sa.func.max(batches_table.c.batch_id)).where(
                batches_table.c.app_id == app_id,
                batches_table.c.state.in_([str(s) for s in HOLDS_RANGE]),
            )
        ).scalar_one_or_none()

    def topic_ids_read(self, app_id: str) -> set[str]:
        """Every topic id a batch of `app_id` that was not abandoned was planned on."""
        with self._read() as conn:
            rows = conn.execute(
                sa.select(ranges_table.c.topic_id)
                .distinct()
                .join(
                    batches_table,
                    sa.and_(
                        batches_table.c.app_id == ranges_table.c.app_id,
                        batches_table.c.batch_id == ranges_table.c.batch_id,
                    ),
                )
                .where(
                    ranges_table.c.app_id == app_id,
                    ranges_table.c.topic_id.is_not(None),
                    batches_table.c.state != str(BatchState.ABORTED),
                )
            )
            return {r.topic_id for r in rows}

    def decisions(
        self, *, app_id: str | None = None, pipeline: str | None = None
    ) -> list[Decision]:
        """Recorded operator decisions, oldest first."""
        with self._read() as conn:
            return self._decisions(conn, app_id=app_id, pipeline=pipeline)

    def _decisions(
        self, conn: Connection, *, app_id: str | None = None, pipeline: str | None = None
    ) -> list[Decision]:
        query = sa.select(decisions_table.c.body).order_by(
            decisions_table.c.after_batch_id, decisions_table.c.decided_at, decisions_table.c.seq
        )
        if app_id is not None:
            query = query.where(decisions_table.c.app_id == app_id)
        if pipeline is not None:
            query = query.where(decisions_table.c.pipeline == pipeline)
        return [Decision.from_dict(body) for (body,) in conn.execute(query)]

    def last_batch_id(self, app_id: str) -> int | None:
        """The highest batch id in use for `app_id`; the next batch gets a higher one."""
        with self._read() as conn:
            return self._last_batch_id(conn, app_id)

    def _last_batch_id(self, conn: Connection, app_id: str) -> int | None:
        """The highest batch id in use: of a batch, or of a decision's `after_batch_id` (a
        resume-at past the table's version reserves the ids up to it)."""
        ids = [
            conn.execute(
                sa.select(sa.func.max(table.c[column])).where(table.c.app_id == app_id)
            ).scalar_one_or_none()
            for table, column in (
                (batches_table, "batch_id"),
                (decisions_table, "after_batch_id"),
            )
        ]
        known = [i for i in ids if i is not None]
        return max(known) if known else None

    def _insert_decision(self, conn: Connection, decision: Decision) -> None:
        conn.execute(
            decisions_table.insert().values(
                id=decision.id,
                pipeline=decision.pipeline,
                app_id=decision.app_id,
                kind=str(decision.kind),
                topic=decision.topic,
                topic_id=decision.topic_id,
                previous_topic_id=decision.previous_topic_id,
                after_batch_id=decision.after_batch_id,
                reason=decision.reason,
                decided_by=decision.decided_by,
                decided_at=decision.decided_at,
                forced=decision.forced,
                body=decision.as_dict(),
            )
        )

    def record_decision(
        self,
        *,
        pipeline: str,
        app_id: str,
        decide: Callable[[Positions, int], Decision],
        floor_batch_id: int | None = None,
        topic: str | None = None,
    ) -> Decision:
        """Record an operator decision, in one transaction under the planning lock.

        `decide(positions, after_batch_id)` builds it (or refuses) from the positions read
        in this transaction, so no plan can move them in between; `after_batch_id` is the
        highest batch id in use, raised to `floor_batch_id` (the table's version, when the
        ledger lost the batches the table holds). Refused while a batch is in flight: its
        range would be read under the old positions (invariant 15). `topic`: the pipeline
        reads several topics, and `decide` gets that topic's positions only.
        """
        with self._tx() as conn:
            self._lock_pipeline(conn, pipeline)
            in_flight = conn.execute(
                sa.select(batches_table.c.batch_id, batches_table.c.state)
                .where(
                    batches_table.c.app_id == app_id,
                    batches_table.c.state.in_([str(s) for s in BLOCKS_PLANNING]),
                )
                .limit(1)
            ).first()
            if in_flight is not None:
                raise BusyError(
                    f"{app_id}: batch {in_flight.batch_id} is still {in_flight.state}; "
                    "recover it (exactly recover) before recording a decision"
                )
            last = max(self._last_batch_id(conn, app_id) or 0, floor_batch_id or 0)
            if topic is None:
                positions = self._positions(conn, app_id)
            else:
                by_topic = self._positions_by_topic(conn, app_id)
                positions = by_topic.get(topic) or Positions(topic=topic)
            decision = decide(positions, last)
            self._insert_decision(conn, decision)
        return decision

    def insert_decision(self, decision: Decision) -> bool:
        """Re-create a decision found in the Delta log's commit metadata. Idempotent."""
        try:
            with self._tx() as conn:
                found = conn.execute(
                    sa.select(decisions_table.c.seq).where(decisions_table.c.id == decision.id)
                ).first()
                if found is not None:
                    return False
                self._insert_decision(conn, decision)
        except IntegrityError:
            return False  # a concurrent rebuild inserted it first
        return True

    # -- writes -------------------------------------------------------------------------

    def plan(
        self,
        *,
        pipeline: str,
        app_id: str,
        kind: BatchKind,
        ranges_for: Any,
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
        if topic_ids is not None:
            return self._plan_topics(
                pipeline=pipeline,
                app_id=app_id,
                kind=kind,
                ranges_for=ranges_for,
                owner=owner,
                batch_id=batch_id,
                topic_ids=topic_ids,
            )
        owner = owner or this_owner()
        now = db_now()
        try:
            with self._tx() as conn:
                self._lock_pipeline(conn, pipeline)
                self._refuse_in_flight(conn, app_id)
                if check is not None:
                    check(self._pipeline_batches(conn, pipeline))
                positions = self._positions(conn, app_id)
                last_id = self._last_batch_id(conn, app_id)
                batch_id = self._next_id(app_id, batch_id, last_id)
                proposed = ranges_for(positions)
                if proposed is None:
                    return None
                new_ranges = list(proposed)
                decisions: list[Decision] = []
                if contiguous:
                    check_contiguous(positions, new_ranges, f"{app_id}/{batch_id}")
                    decisions = list(positions.decisions)
                    if topic_id is not None and positions.topic_id is None and positions:
                        decided_at = _aware(conn.execute(sa.select(db_now())).scalar_one())
                        adopted = self._adoption(
                            pipeline, app_id, positions, topic_id, last_id, decided_at
                        )
                        self._insert_decision(conn, adopted)
                        decisions.append(adopted)
                self._insert_batch(
                    conn,
                    app_id=app_id,
                    batch_id=batch_id,
                    pipeline=pipeline,
                    kind=kind,
                    state=BatchState.PLANNED,
                    owner=owner,
                    created_at=now,
                    params=params,
                    decisions=decisions,
                )
                self._insert_ranges(conn, app_id, batch_id, new_ranges, topic_id)
        except IntegrityError as exc:
            raise BusyError(
                f"{app_id}: another process planned the next batch at the same moment; "
                "run again to continue after it"
            ) from exc
        batch = self.get(app_id, batch_id)
        assert batch is not None
        return batch

    def _plan_topics(
        self,
        *,
        pipeline: str,
        app_id: str,
        kind: BatchKind,
        ranges_for: Callable[[dict[str, Positions]], Sequence[OffsetRange] | None],
        owner: Owner | None,
        batch_id: int | None,
        topic_ids: Mapping[str, str],
    ) -> Batch | None:
        """plan() for a live batch on several topics, continued from the positions."""
        owner = owner or this_owner()
        now = db_now()
        try:
            with self._tx() as conn:
                self._lock_pipeline(conn, pipeline)
                self._refuse_in_flight(conn, app_id)
                positions = self._positions_by_topic(conn, app_id)
                last_id = self._last_batch_id(conn, app_id)
                batch_id = self._next_id(app_id, batch_id, last_id)
                proposed = ranges_for(positions)
                if proposed is None:
                    return None
                new_ranges = list(proposed)
                check_contiguous_by_topic(positions, new_ranges, f"{app_id}/{batch_id}")
                decisions = decisions_of(positions)
                for topic, held in positions.items():
                    if held.topic_id is None and held and topic in topic_ids:
                        decided_at = _aware(conn.execute(sa.select(db_now())).scalar_one())
                        adopted = self._adoption(
                            pipeline, app_id, held, topic_ids[topic], last_id, decided_at
                        )
                        self._insert_decision(conn, adopted)
                        decisions.append(adopted)
                self._insert_batch(
                    conn,
                    app_id=app_id,
                    batch_id=batch_id,
                    pipeline=pipeline,
                    kind=kind,
                    state=BatchState.PLANNED,
                    owner=owner,
                    created_at=now,
                    params=None,
                    decisions=decisions,
                )
                self._insert_ranges(conn, app_id, batch_id, new_ranges, topic_ids)
        except IntegrityError as exc:
            raise BusyError(
                f"{app_id}: another process planned the next batch at the same moment; "
                "run again to continue after it"
            ) from exc
        batch = self.get(app_id, batch_id)
        assert batch is not None
        return batch

    def _refuse_in_flight(self, conn: Connection, app_id: str) -> None:
        """One batch at a time (BLOCKS_PLANNING): BusyError while one is not published."""
        in_flight = conn.execute(
            sa.select(batches_table.c.batch_id, batches_table.c.state, batches_table.c.owner)
            .where(
                batches_table.c.app_id == app_id,
                batches_table.c.state.in_([str(s) for s in BLOCKS_PLANNING]),
            )
            .limit(1)
        ).first()
        if in_flight is not None:
            raise BusyError(
                f"{app_id}: batch {in_flight.batch_id} is still {in_flight.state} "
                f"(owner {in_flight.owner}); recover it before planning another"
            )

    @staticmethod
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

    def _pipeline_batches(self, conn: Connection, pipeline: str) -> list[Batch]:
        """Every batch of every application id of `pipeline`, newest first."""
        rows = conn.execute(
            sa.select(batches_table)
            .where(batches_table.c.pipeline == pipeline)
            .order_by(batches_table.c.batch_id.desc(), batches_table.c.app_id)
        ).all()
        return self._to_batches(conn, rows)

    @staticmethod
    def _adoption(
        pipeline: str,
        app_id: str,
        positions: Positions,
        topic_id: str,
        last_id: int | None,
        decided_at: datetime,
    ) -> Decision:
        """The record of positions without a topic id taking the topic's current one."""
        return Decision(
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
            decided_at=decided_at,
            previous_positions=dict(positions),
        )

    @staticmethod
    def _lock_pipeline(conn: Connection, pipeline: str) -> None:
        """Serialise every planner of one pipeline, live and backfill, until the
        transaction ends.

        SQLite already does (BEGIN IMMEDIATE). PostgreSQL at READ COMMITTED would let a
        planner read positions, then see another planner's freshly committed batch as the
        maximum id and insert the next id on stale positions: an overlap. And a backfill
        decides which offsets it may take from the live pipeline's batches and the other
        backfills' (ledger/core/backfill.py): a lock per application id would let a live plan
        or another fill take the same offsets between its check and its insert.

        The key is the pipeline's name, which is also its live application id: a live
        planner of an older exactly, which locked on the application id, still excludes
        (and is excluded by) this one.
        """
        if conn.dialect.name == "postgresql":
            conn.execute(
                sa.text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"),
                {"key": f"exactly.plan.{pipeline}"},
            )

    def _describe_current(self, conn: Connection, batch: Batch) -> str:
        current = self._get(conn, batch.app_id, batch.batch_id)
        if current is None:
            return "it no longer exists"
        return f"it is {current.state} at attempt {current.attempt} (owner {current.owner})"

    @staticmethod
    def _insert_batch(
        conn: Connection,
        *,
        kind: BatchKind,
        state: BatchState,
        owner: Owner,
        created_at: datetime | db_now,
        params: Mapping[str, Any] | None,
        decisions: Iterable[Decision] = (),
        metrics: Mapping[str, Any] | None = None,
        **columns: Any,
    ) -> None:
        """A new batch row at attempt 1 with a fresh token, stamped by the database's clock."""
        now = db_now()
        conn.execute(
            batches_table.insert().values(
                kind=str(kind),
                state=str(state),
                attempt=1,
                token=uuid.uuid4().hex,
                owner=str(owner),
                heartbeat_at=now,
                created_at=created_at,
                updated_at=now,
                params=dict(params or {}),
                metrics=dict(metrics or {}),
                schemas={},
                decisions=[d.as_dict() for d in decisions],
                **columns,
            )
        )

    def _insert_ranges(
        self,
        conn: Connection,
        app_id: str,
        batch_id: int,
        rngs: Iterable[OffsetRange],
        topic_id: str | Mapping[str, str] | None = None,
    ) -> None:
        """`topic_id`: one id for every range, or the id of each range's topic by name."""
        ids = topic_id if isinstance(topic_id, Mapping) else None
        rows = [
            {
                "app_id": app_id,
                "batch_id": batch_id,
                "topic": r.topic,
                "partition": r.partition,
                "start_offset": r.start,
                "end_offset": r.end,
                "topic_id": ids.get(r.topic) if ids is not None else topic_id,
            }
            for r in rngs
        ]
        if rows:
            conn.execute(ranges_table.insert(), rows)

    def _guarded_update(
        self,
        conn: Connection,
        batch: Batch,
        values: Mapping[str, Any],
        *,
        same_state: bool,
        refused: str,
    ) -> None:
        """Write `values` to the batch's row only while `batch`'s attempt token (and, with
        `same_state`, its state) still hold there: every write of an attempt goes through
        here, so a stale attempt changes nothing and learns it was fenced (invariant 6).
        Transitions and takeovers start from the state they read; metrics and heartbeats
        belong to the attempt whatever its state.

        The FencedError reads "batch <label> was <refused>: <what the batch is now>".
        """
        guard = [
            batches_table.c.app_id == batch.app_id,
            batches_table.c.batch_id == batch.batch_id,
            batches_table.c.token == batch.token,
        ]
        if same_state:
            guard.append(batches_table.c.state == str(batch.state))
        result = conn.execute(batches_table.update().where(*guard).values(**values))
        if result.rowcount != 1:
            raise FencedError(
                f"batch {batch.label} was {refused}: {self._describe_current(conn, batch)}"
            )

    def _cas(
        self,
        conn: Connection,
        batch: Batch,
        target: BatchState,
        values: dict[str, Any],
    ) -> None:
        """The compare-and-set every transition goes through (invariant 6)."""
        self._guarded_update(
            conn,
            batch,
            {**values, "state": str(target), "updated_at": db_now()},
            same_state=True,
            refused=f"fenced moving {batch.state} -> {target}",
        )

    def transition(
        self,
        batch: Batch,
        target: BatchState,
        *,
        files: Iterable[StagedFile] = (),
        schemas: Mapping[str, str] | None = None,
        metrics: Mapping[str, Any] | None = None,
        error: str | None = None,
        table_version: int | None = None,
    ) -> Batch:
        """Move `batch` to `target` if nobody else moved it since it was read.

        For PREPARED, the file list is written in the same transaction: the vote is
        all-or-nothing (invariant 3: only these files are ever committed).
        """
        check_transition(batch.label, batch.state, target, reason=error)
        if (batch.state, target) == RESTAGE_MOVE:
            raise InconsistencyError(
                f"batch {batch.label}: a vote goes back to PLANNED only through "
                "LedgerStore.restage, which fences the attempt and drops its files (invariant 11)"
            )
        if target is BatchState.ABORTED and batch.voted_once:
            raise InconsistencyError(
                f"batch {batch.label} voted once and is being staged again: it cannot be "
                "abandoned (invariant 5); fix what fails its stage and run recover"
            )
        now = db_now()
        values: dict[str, Any] = {"heartbeat_at": now}
        if metrics is not None:
            values["metrics"] = {**batch.metrics, **metrics}
        if error is not None:
            values["error"] = error
        if schemas is not None:
            values["schemas"] = dict(schemas)
        if target is BatchState.PREPARED:
            values["prepared_at"] = now
        if target is BatchState.COMMITTED:
            values["committed_at"] = now
            values["table_version"] = table_version
        with self._tx() as conn:
            self._cas(conn, batch, target, values)
            rows = [
                {
                    "app_id": batch.app_id,
                    "batch_id": batch.batch_id,
                    "target": f.target,
                    "path": f.path,
                    "size": f.size,
                    "records": f.records,
                    "modification_time": f.modification_time,
                    "stats": f.stats,
                }
                for f in files
            ]
            if rows:
                if target is not BatchState.PREPARED:
                    raise ValueError("files are recorded only by the prepare vote")
                conn.execute(files_table.insert(), rows)
            updated = self._get(conn, batch.app_id, batch.batch_id)
        assert updated is not None
        return updated

    def restage(self, batch: Batch, *, reason: str, metrics: Mapping[str, Any]) -> Batch:
        """Send a PREPARED batch back to PLANNED to be staged again, in one transaction:
        a new attempt (the old token stops working), the old vote's file rows deleted, and
        `reason` and `metrics` (which must say which files were missing) recorded.

        The only way back from PREPARED (invariant 11). The batch keeps its id and ranges,
        so its range stays held and nothing is planned past it until it commits; and it
        stays marked (metrics RESTAGE) as a batch that voted, never abandoned (invariant 5).
        """
        check_transition(batch.label, batch.state, BatchState.PLANNED, reason=reason)
        if RESTAGE not in metrics:
            raise ValueError(f"re-staging {batch.label} must record metrics[{RESTAGE!r}]")
        with self._tx() as conn:
            now = db_now()
            self._guarded_update(
                conn,
                batch,
                {
                    "state": str(BatchState.PLANNED),
                    "attempt": batch.attempt + 1,
                    "token": uuid.uuid4().hex,
                    "owner": str(this_owner()),
                    "heartbeat_at": now,
                    "updated_at": now,
                    "error": reason,
                    "metrics": {**batch.metrics, **metrics},
                },
                same_state=True,
                refused=f"fenced moving {batch.state} -> {BatchState.PLANNED} to re-stage",
            )
            conn.execute(
                files_table.delete().where(
                    files_table.c.app_id == batch.app_id, files_table.c.batch_id == batch.batch_id
                )
            )
            updated = self._get(conn, batch.app_id, batch.batch_id)
        assert updated is not None
        return updated

    def record_metrics(self, batch: Batch, metrics: Mapping[str, Any]) -> Batch:
        """Merge metrics without changing state; fenced like any other write."""
        with self._tx() as conn:
            self._guarded_update(
                conn,
                batch,
                {"metrics": {**batch.metrics, **metrics}, "updated_at": db_now()},
                same_state=False,
                refused="fenced while recording metrics",
            )
            updated = self._get(conn, batch.app_id, batch.batch_id)
        assert updated is not None
        return updated

    def takeover(self, batch: Batch, owner: Owner | None = None) -> Batch:
        """Start a new attempt on `batch` (same state): the old attempt's token stops working.

        Used by recovery and re-drive: from here a zombie of the previous attempt can no
        longer move the batch.
        """
        with self._tx() as conn:
            now = db_now()
            self._guarded_update(
                conn,
                batch,
                {
                    "attempt": batch.attempt + 1,
                    "token": uuid.uuid4().hex,
                    "owner": str(owner or this_owner()),
                    "heartbeat_at": now,
                    "updated_at": now,
                },
                same_state=True,
                refused="taken over by someone else first",
            )
            updated = self._get(conn, batch.app_id, batch.batch_id)
        assert updated is not None
        return updated

    def require_current(self, batch: Batch) -> None:
        """Raise FencedError unless `batch` is still in the state and attempt it was read at.

        Checked before publishing, so a zombie learns it was replaced before it touches the
        table; the table's own version check still decides if the two race.
        """
        with self._read() as conn:
            current = self._get(conn, batch.app_id, batch.batch_id)
            if current is None or (current.state, current.token) != (batch.state, batch.token):
                raise FencedError(
                    f"batch {batch.label} was fenced before publishing: "
                    f"{self._describe_current(conn, batch)}"
                )

    def heartbeat(self, batch: Batch) -> None:
        """Renew the attempt's lease; any state, as long as the attempt still owns it."""
        with self._tx() as conn:
            self._guarded_update(
                conn,
                batch,
                {"heartbeat_at": db_now()},
                same_state=False,
                refused="fenced (heartbeat refused)",
            )

    def insert_committed(
        self,
        *,
        pipeline: str,
        app_id: str,
        kind: BatchKind,
        batch_id: int,
        ranges: Iterable[OffsetRange],
        table_version: int | None,
        committed_at: datetime | None = None,
        params: Mapping[str, Any] | None = None,
        topic_id: str | None = None,
        decisions: Iterable[Decision] = (),
    ) -> bool:
        """Re-create a COMMITTED batch found in the Delta log (invariant 7). Idempotent.

        `committed_at` defaults to the database's time of the rebuild (invariant 17). With
        its topic id and the decisions its commit carried (recorded again by
        `insert_decision`).
        """
        stamp = committed_at if committed_at is not None else db_now()
        return self._insert_rebuilt(
            pipeline=pipeline,
            app_id=app_id,
            kind=kind,
            batch_id=batch_id,
            ranges=ranges,
            params=params,
            topic_id=topic_id,
            decisions=decisions,
            state=BatchState.COMMITTED,
            created_at=stamp,
            committed_at=stamp,
            table_version=table_version,
        )

    def insert_unfinished(
        self,
        *,
        pipeline: str,
        app_id: str,
        kind: BatchKind,
        batch_id: int,
        ranges: Iterable[OffsetRange],
        params: Mapping[str, Any] | None,
        reason: str,
        metrics: Mapping[str, Any],
        topic_id: str | None = None,
        decisions: Iterable[Decision] = (),
    ) -> bool:
        """Re-create a batch that some outputs hold and others not, found in their logs
        when the ledger was lost (invariant 12), as a PLANNED batch to be staged again over
        its ranges and finished (metrics must carry RESTAGE). Idempotent."""
        if RESTAGE not in metrics:
            raise ValueError(f"an unfinished batch {app_id}/{batch_id} must carry {RESTAGE!r}")
        return self._insert_rebuilt(
            pipeline=pipeline,
            app_id=app_id,
            kind=kind,
            batch_id=batch_id,
            ranges=ranges,
            params=params,
            topic_id=topic_id,
            decisions=decisions,
            state=BatchState.PLANNED,
            created_at=db_now(),
            error=reason,
            metrics=metrics,
        )

    def _insert_rebuilt(
        self,
        *,
        pipeline: str,
        app_id: str,
        kind: BatchKind,
        batch_id: int,
        ranges: Iterable[OffsetRange],
        params: Mapping[str, Any] | None,
        topic_id: str | None,
        decisions: Iterable[Decision],
        state: BatchState,
        created_at: datetime | db_now,
        **columns: Any,
    ) -> bool:
        """Insert a batch re-created from the Delta logs unless the ledger has it; False if
        it has (idempotent: a concurrent rebuild may be first). Under the pipeline's
        planning lock, like every other insert of a batch, so a backfill's check never
        decides between two of its statements."""
        try:
            with self._tx() as conn:
                self._lock_pipeline(conn, pipeline)
                if self._get(conn, app_id, batch_id) is not None:
                    return False
                self._insert_batch(
                    conn,
                    app_id=app_id,
                    batch_id=batch_id,
                    pipeline=pipeline,
                    kind=kind,
                    state=state,
                    owner=this_owner(),
                    created_at=created_at,
                    params={**dict(params or {}), "rebuilt_from_delta_log": True},
                    decisions=decisions,
                    **columns,
                )
                self._insert_ranges(conn, app_id, batch_id, ranges, topic_id)
        except IntegrityError:
            return False  # a concurrent rebuild inserted it first
        return True

    def dispose(self) -> None:
        self.engine.dispose()


def _sole(ids: Mapping[str, str]) -> str | None:
    """The topic id of a batch on one topic; None for several topics, or none recorded."""
    return next(iter(ids.values())) if len(ids) == 1 else None
