"""Invariant 16's rule, purely: which batches in flight are stuck (in a state that is not
final for longer than the threshold), and which alerts already sent are resolved.

In the protocol core because three edges apply the same rule and must agree: the stuck
sensor alerts on it (orchestration/health/stuck_sensor.py), the `no_stuck_batch` check
shows it (orchestration/health/table_checks.py), and the metrics endpoint counts it
(jobs/metrics). Ages are measured by the ledger database's clock (invariant 17): `now` is
the database's, and so is every timestamp it is compared with.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from ledger.core.batch import Batch
from ledger.core.protocol import IN_FLIGHT, BatchState

S = BatchState


def batch_key(batch: Batch) -> str:
    return f"{batch.app_id}/{batch.batch_id}"


def in_state_since(batch: Batch) -> datetime | None:
    """When the batch entered its state, by the database's clock.

    PLANNED: when it was planned. STAGED: its last heartbeat, which the move to STAGED
    stamps and nothing renews afterwards (heartbeats run only while staging). PREPARED: the
    vote. COMMITTED: the commit. None for final states.
    """
    return {
        S.PLANNED: batch.created_at,
        S.STAGED: batch.heartbeat_at,
        S.PREPARED: batch.prepared_at,
        S.COMMITTED: batch.committed_at,
    }.get(batch.state)


def ack_refused(batch: Batch) -> bool:
    """A COMMITTED batch whose ack was refused: the ack alert speaks for it."""
    return batch.state is S.COMMITTED and "ack_error" in batch.metrics


@dataclass(frozen=True)
class StuckDecision:
    """What the stuck sensor must say now, and the alerts open after: batch key -> the state
    it was alerted in."""

    stuck: list[Batch]
    resolved: list[tuple[Batch, BatchState]]
    open_after: dict[str, str]


def decide_stuck(
    open_alerts: Mapping[str, str],
    candidates: Iterable[Batch],
    current: Mapping[str, Batch | None],
    now: datetime,
    threshold_s: float,
) -> StuckDecision:
    """Pure: alert once per batch stuck in a state that is not final; resolve once it
    leaves the state it was alerted in (invariant 16).

    `open_alerts` are the alerts already sent (the sensor's cursor); `current` maps each of
    them to its row now (None if it vanished); `now` is the database's time.
    """
    stuck = []
    for batch in candidates:
        since = in_state_since(batch)
        if (
            batch.state in IN_FLIGHT
            and since is not None
            and not ack_refused(batch)
            and (now - since).total_seconds() >= threshold_s
            and batch_key(batch) not in open_alerts
        ):
            stuck.append(batch)
    resolved = []
    still_open = dict(open_alerts)
    for key, alerted in sorted(open_alerts.items()):
        row = current.get(key)
        if row is None or str(row.state) != alerted:
            del still_open[key]
            if row is not None:
                resolved.append((row, BatchState(alerted)))
    still_open.update({batch_key(b): str(b.state) for b in stuck})
    return StuckDecision(stuck, resolved, dict(sorted(still_open.items())))
