"""The operator actions journal (ledger/core/actions.py): written once per action, read by
the table asset's history (orchestration/health/history_sensor.py) and `exactly ledger`.

An action is journaled after it was carried out, with what came of it: a recovery or a
rebuild that failed is not an action taken, and its run's failure says why. The time is the
ledger database's, as every timestamp in the ledger (invariant 17).
"""

from __future__ import annotations

import sqlalchemy as sa

from ledger.core.actions import ActionKind, OperatorAction, new_action_id
from ledger.store import reads
from ledger.store.connection import LedgerConnection
from ledger.store.schema import actions_table


class ActionJournal(LedgerConnection):
    """`record_action` and `actions`: the journal of one ledger database."""

    def record_action(
        self,
        *,
        pipeline: str,
        kind: ActionKind,
        subject: str,
        decided_by: str,
        reason: str,
        outcome: str,
    ) -> OperatorAction:
        """Journal an action carried out; returns it as stored."""
        with self._tx() as conn:
            action = OperatorAction(
                id=new_action_id(),
                pipeline=pipeline,
                kind=kind,
                subject=subject,
                decided_by=decided_by,
                reason=reason,
                decided_at=reads.db_time(conn),
                outcome=outcome,
            )
            conn.execute(
                actions_table.insert().values(
                    id=action.id,
                    pipeline=pipeline,
                    kind=str(kind),
                    subject=subject,
                    decided_by=decided_by,
                    reason=reason,
                    decided_at=action.decided_at,
                    outcome=outcome,
                )
            )
        return action

    def actions(self, pipeline: str) -> list[OperatorAction]:
        """The pipeline's journaled actions, oldest first."""
        query = (
            sa.select(actions_table)
            .where(actions_table.c.pipeline == pipeline)
            .order_by(actions_table.c.seq)
        )
        with self._read() as conn:
            rows = conn.execute(query).mappings().all()
        return [
            OperatorAction(
                id=row["id"],
                pipeline=row["pipeline"],
                kind=ActionKind(row["kind"]),
                subject=row["subject"],
                decided_by=row["decided_by"],
                reason=row["reason"],
                decided_at=reads.aware(row["decided_at"]),
                outcome=row["outcome"],
            )
            for row in rows
        ]
