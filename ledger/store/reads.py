"""Reading the ledger on an open connection: batch rows back into `Batch` values, positions,
the highest batch id in use, the recorded decisions.

Functions of a connection rather than of the store because the writes read inside their own
transaction: planning decides on positions read under its lock, a fenced write describes
the row it lost to, and a write returns the batch as it stands after it. The store's public
reads (ledger/store/ledger_store.py) open a connection and call these.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ledger.core import topic_plan
from ledger.core.batch import Batch, BatchKind
from ledger.core.decisions import Decision, apply_decisions
from ledger.core.protocol import HOLDS_RANGE, BatchState, OffsetRange, Owner, Positions
from ledger.store.db_clock import db_now
from ledger.store.schema import batches_table, decisions_table, ranges_table


def aware(ts: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; everything here is UTC."""
    if ts is None or ts.tzinfo is not None:
        return ts
    return ts.replace(tzinfo=UTC)


def db_time(conn: Connection) -> datetime:
    """The database's current time, read now (invariant 17)."""
    stamp = aware(conn.execute(sa.select(db_now())).scalar_one())
    assert stamp is not None
    return stamp


def ranges(conn: Connection, app_id: str, batch_ids: list[int]) -> dict[int, list[OffsetRange]]:
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


def topic_ids(conn: Connection, app_id: str, batch_ids: list[int]) -> dict[int, str]:
    """The topic id each one-topic batch's ranges were planned on; batches recorded
    before topic ids, and batches on several topics (see ids_by_topic), are absent."""
    return {
        batch_id: next(iter(ids.values()))
        for batch_id, ids in ids_by_topic(conn, app_id, batch_ids).items()
        if len(ids) == 1
    }


def ids_by_topic(conn: Connection, app_id: str, batch_ids: list[int]) -> dict[int, dict[str, str]]:
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


def to_batches(conn: Connection, rows: list[Any]) -> list[Batch]:
    by_app: dict[str, list[int]] = {}
    for r in rows:
        by_app.setdefault(r.app_id, []).append(r.batch_id)
    held = {app: ranges(conn, app, ids) for app, ids in by_app.items()}
    ids = {app: ids_by_topic(conn, app, batch_ids) for app, batch_ids in by_app.items()}
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
            heartbeat_at=aware(r.heartbeat_at),
            created_at=aware(r.created_at),
            updated_at=aware(r.updated_at),
            prepared_at=aware(r.prepared_at),
            committed_at=aware(r.committed_at),
            table_version=r.table_version,
            error=r.error,
            ranges=tuple(held[r.app_id][r.batch_id]),
            schemas=r.schemas or {},
            metrics=r.metrics or {},
            params=r.params or {},
            topic_id=_sole(ids[r.app_id].get(r.batch_id, {})),
            topic_ids=ids[r.app_id].get(r.batch_id, {}),
            decisions=tuple(Decision.from_dict(d) for d in r.decisions or ()),
        )
        for r in rows
    ]


def _sole(ids: Mapping[str, str]) -> str | None:
    """The topic id of a batch on one topic; None for several topics, or none recorded."""
    return next(iter(ids.values())) if len(ids) == 1 else None


def get(conn: Connection, app_id: str, batch_id: int) -> Batch | None:
    rows = conn.execute(
        sa.select(batches_table).where(
            batches_table.c.app_id == app_id, batches_table.c.batch_id == batch_id
        )
    ).all()
    found = to_batches(conn, rows)
    return found[0] if found else None


def pipeline_batches(conn: Connection, pipeline: str) -> list[Batch]:
    """Every batch of every application id of `pipeline`, newest first."""
    rows = conn.execute(
        sa.select(batches_table)
        .where(batches_table.c.pipeline == pipeline)
        .order_by(batches_table.c.batch_id.desc(), batches_table.c.app_id)
    ).all()
    return to_batches(conn, rows)


def positions(conn: Connection, app_id: str) -> Positions:
    """The next offset per partition: the ends of the newest batch that holds a range,
    moved by the operator decisions taken since (ledger/core/decisions.py), with the topic
    id they belong to."""
    last = _last_holding(conn, app_id)
    held = Positions()
    if last is not None:
        read = ranges(conn, app_id, [last])[last]
        topic_plan.check_one_topic(app_id, read)
        held = Positions(
            {r.partition: r.end for r in read},
            topic=read[0].topic if read else None,
            topic_id=topic_ids(conn, app_id, [last]).get(last),
        )
    return apply_decisions(held, last, decisions(conn, app_id=app_id))


def positions_by_topic(conn: Connection, app_id: str) -> dict[str, Positions]:
    """positions() for a pipeline on several topics: per topic, with each topic's id and
    the decisions that moved it."""
    last = _last_holding(conn, app_id)
    held: dict[str, Positions] = {}
    if last is not None:
        ids = ids_by_topic(conn, app_id, [last]).get(last, {})
        held = topic_plan.positions_by_topic(ranges(conn, app_id, [last])[last], ids)
    return topic_plan.apply_topic_decisions(held, last, decisions(conn, app_id=app_id))


def _last_holding(conn: Connection, app_id: str) -> int | None:
    """The newest batch of `app_id` whose ranges count as read (HOLDS_RANGE)."""
    return conn.execute(
        sa.select(sa.func.max(batches_table.c.batch_id)).where(
            batches_table.c.app_id == app_id,
            batches_table.c.state.in_([str(s) for s in HOLDS_RANGE]),
        )
    ).scalar_one_or_none()


def decisions(
    conn: Connection, *, app_id: str | None = None, pipeline: str | None = None
) -> list[Decision]:
    """Recorded operator decisions, oldest first."""
    query = sa.select(decisions_table.c.body).order_by(
        decisions_table.c.after_batch_id, decisions_table.c.decided_at, decisions_table.c.seq
    )
    if app_id is not None:
        query = query.where(decisions_table.c.app_id == app_id)
    if pipeline is not None:
        query = query.where(decisions_table.c.pipeline == pipeline)
    return [Decision.from_dict(body) for (body,) in conn.execute(query)]


def last_batch_id(conn: Connection, app_id: str) -> int | None:
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


def describe(conn: Connection, batch: Batch) -> str:
    """What `batch`'s row is now, for the message of a write it refused."""
    current = get(conn, batch.app_id, batch.batch_id)
    if current is None:
        return "it no longer exists"
    return f"it is {current.state} at attempt {current.attempt} (owner {current.owner})"
