"""What the ledger records: batches, the files a vote names, and who owns an attempt.

Kept apart from the store and free of SQLAlchemy, so that the edges that only pass these
values along (the Delta publisher, the Parquet describer, the Dagster sensors) do not pull a
database client in with them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ledger.core.decisions import Decision
from ledger.core.protocol import BatchState, OffsetRange, Owner


class BatchKind(enum.StrEnum):
    """Who a batch belongs to. The values are stored in ledgers and in Delta commit metadata,
    so they never change."""

    #: the pipeline's own batches, continuing from the previous one and acking the group
    LIVE = "live"
    #: an operator's fill or replace under `<pipeline>.backfill` (ledger/core/backfill.py)
    BACKFILL = "backfill"


#: What follows a pipeline's name in the application id of its backfills: pipeline `X`
#: commits as `X`, its backfills as `X.backfill` (ledger/core/backfill.py). Ledgers and Delta logs
#: hold these ids, so the suffix never changes; instead no pipeline name may end in it
#: (resources/config/pipeline_config.py), or a pipeline `X.backfill` would share the ids of X's
# backfills.
BACKFILL_SUFFIX = ".backfill"

#: The metrics key of a batch whose vote was sent back to be staged again (invariant 11):
#: why, which files were missing, how often. Its presence marks a batch that voted once, so
#: recovery finishes it and never abandons it (invariant 5).
RESTAGE = "restage"


def utcnow() -> datetime:
    """Every timestamp the ledger writes or compares is timezone-aware UTC."""
    return datetime.now(UTC)


@dataclass(frozen=True)
class StagedFile:
    """One Parquet file an attempt wrote, as the vote records it and Delta will add it.

    `path` is relative to the root of the table it belongs to (`target`).
    """

    target: str
    path: str
    size: int
    records: int
    modification_time: int
    stats: str


@dataclass(frozen=True)
class Batch:
    """One attempt's view of a batch, as read from the ledger.

    The `token` identifies the attempt: every write presents it, so a copy read before a
    takeover can no longer move the batch (invariant 6).
    """

    app_id: str
    batch_id: int
    pipeline: str
    kind: BatchKind
    state: BatchState
    attempt: int
    token: str
    owner: Owner
    heartbeat_at: datetime
    created_at: datetime
    updated_at: datetime
    prepared_at: datetime | None
    committed_at: datetime | None
    table_version: int | None
    error: str | None
    ranges: tuple[OffsetRange, ...]
    schemas: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    #: Kafka's id of the topic incarnation the ranges were planned on (invariant 10); None
    #: for batches recorded before exactly stored topic ids
    topic_id: str | None = None
    #: the id of every topic the batch reads, by name (a batch of a pipeline on several
    #: topics has one per topic, and then `topic_id` is None); empty for batches recorded
    #: before exactly stored topic ids
    topic_ids: dict[str, str] = field(default_factory=dict)
    #: operator decisions the batch was planned on; its commit carries them (invariant 15)
    decisions: tuple[Decision, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.app_id}/{self.batch_id} attempt {self.attempt}"

    @property
    def span(self) -> int:
        return sum(r.span for r in self.ranges)

    @property
    def voted_once(self) -> bool:
        """Whether the batch voted before and was sent back to PLANNED to be staged again
        (invariant 11), or was rebuilt from an output that holds it: it must be finished,
        never abandoned, even in a state that is otherwise abandonable (invariant 5)."""
        return RESTAGE in self.metrics

    def as_dict(self) -> dict[str, Any]:
        return {
            "app_id": self.app_id,
            "batch_id": self.batch_id,
            "pipeline": self.pipeline,
            "kind": str(self.kind),
            "state": str(self.state),
            "attempt": self.attempt,
            "owner": str(self.owner),
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
            "prepared_at": self.prepared_at.isoformat() if self.prepared_at else None,
            "committed_at": self.committed_at.isoformat() if self.committed_at else None,
            "table_version": self.table_version,
            "error": self.error,
            "ranges": [r.as_dict() for r in self.ranges],
            "metrics": self.metrics,
            "params": self.params,
            "topic_id": self.topic_id,
            "topic_ids": self.topic_ids,
            "decisions": [d.as_dict() for d in self.decisions],
        }

    def commit_metadata(self) -> dict[str, Any]:
        """What every commit of the batch carries so the Delta log alone can rebuild the
        ledger (invariant 7): with the ranges, the topic incarnation they were read from
        (invariant 10) and the operator decisions taken since the previous batch
        (invariant 15)."""
        return {
            "app_id": self.app_id,
            "pipeline": self.pipeline,
            "kind": self.kind,
            "batch_id": self.batch_id,
            "attempt": self.attempt,
            "ranges": [r.as_dict() for r in self.ranges],
            "params": self.params,
            "topic_id": self.topic_id,
            # every topic's id, by name (a batch on several topics; invariant 10)
            "topic_ids": self.topic_ids,
            "decisions": [d.as_dict() for d in self.decisions],
        }
