"""Recording an operator decision (ledger/core/decisions.py): built from the positions read
under the pipeline's planning lock, refused while a batch is in flight.

A decision moves the positions the next plan continues from, so it is taken like a plan:
in one transaction under the same lock and the same in-flight guard
(ledger/store/planning.py), and no plan can move the positions between its read and its
insert.
"""

from __future__ import annotations

from collections.abc import Callable

from ledger.core.decisions import Decision
from ledger.core.errors import BusyError
from ledger.core.protocol import Positions
from ledger.store import reads
from ledger.store.connection import LedgerConnection
from ledger.store.planning import first_in_flight
from ledger.store.rows import insert_decision, lock_pipeline


class DecisionRecording(LedgerConnection):
    """`record_decision`: an operator decision taken on the positions as they stand."""

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
            lock_pipeline(conn, pipeline)
            in_flight = first_in_flight(conn, app_id)
            if in_flight is not None:
                raise BusyError(
                    f"{app_id}: batch {in_flight.batch_id} is still {in_flight.state}; "
                    "recover it (exactly recover) before recording a decision"
                )
            last = max(reads.last_batch_id(conn, app_id) or 0, floor_batch_id or 0)
            if topic is None:
                positions = reads.positions(conn, app_id)
            else:
                by_topic = reads.positions_by_topic(conn, app_id)
                positions = by_topic.get(topic) or Positions(topic=topic)
            decision = decide(positions, last)
            insert_decision(conn, decision)
        return decision
