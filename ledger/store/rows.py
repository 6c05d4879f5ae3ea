"""Writing new rows: a batch, its ranges, a decision, and the planning lock every insert of a
batch or a decision takes first.

Planning, recording a decision and rebuilding from the Delta logs all create batches or
decisions; they share these so that a row is written one way whichever of them writes it,
and so that all of them serialise on the same per-pipeline lock.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ledger.core.batch import BatchKind
from ledger.core.decisions import Decision
from ledger.core.protocol import BatchState, OffsetRange, Owner
from ledger.store.db_clock import db_now
from ledger.store.schema import batches_table, decisions_table, ranges_table


def lock_pipeline(conn: Connection, pipeline: str) -> None:
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


def insert_batch(
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


def insert_ranges(
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


def insert_decision(conn: Connection, decision: Decision) -> None:
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
