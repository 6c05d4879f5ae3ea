"""Re-creating the ledger from the Delta logs when it was lost (invariant 7): the batches the
outputs committed, the batches some outputs hold and others not, and the decisions their
commits carried.

Each insert is idempotent: a row the ledger already has is left alone (False), so a rebuild
can run again, or race another, and the first one's rows stand. Batches are inserted under
the pipeline's planning lock, like every other insert of a batch, so a backfill's check
never decides between two of its statements.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from ledger.core.batch import RESTAGE, BatchKind
from ledger.core.decisions import Decision
from ledger.core.protocol import BatchState, OffsetRange
from ledger.host.process import this_owner
from ledger.store import reads
from ledger.store.connection import LedgerConnection
from ledger.store.db_clock import db_now
from ledger.store.rows import insert_batch, insert_decision, insert_ranges, lock_pipeline
from ledger.store.schema import decisions_table


class Rebuilding(LedgerConnection):
    """`insert_committed`, `insert_unfinished`, `insert_decision`: the rebuild's inserts."""

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

    def insert_decision(self, decision: Decision) -> bool:
        """Re-create a decision found in the Delta log's commit metadata. Idempotent."""
        try:
            with self._tx() as conn:
                found = conn.execute(
                    sa.select(decisions_table.c.seq).where(decisions_table.c.id == decision.id)
                ).first()
                if found is not None:
                    return False
                insert_decision(conn, decision)
        except IntegrityError:
            return False  # a concurrent rebuild inserted it first
        return True

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
        it has (idempotent: a concurrent rebuild may be first)."""
        try:
            with self._tx() as conn:
                lock_pipeline(conn, pipeline)
                if reads.get(conn, app_id, batch_id) is not None:
                    return False
                insert_batch(
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
                insert_ranges(conn, app_id, batch_id, ranges, topic_id)
        except IntegrityError:
            return False  # a concurrent rebuild inserted it first
        return True
