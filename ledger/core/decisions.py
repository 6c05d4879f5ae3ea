"""Operator decisions: the only way positions ever jump (invariant 15).

The protocol refuses, loudly, the cases where continuing would lose records without anyone
knowing: offsets that retention deleted before they were read (invariant 8), a topic that
was re-created or a config that names another topic (invariant 10), and committed history
whose offsets are gone from the Delta log (invariant 7). Each of them continues only after
an operator records a decision, with who, when and why:

- `lost-offsets`: skip the range of a partition that Kafka no longer holds; reading goes on
  at the earliest offset Kafka still has.
- `new-topic`: accept the topic's current id; positions restart from the pipeline's
  `starting_offsets`, and the old ones stay in the ledger as history.
- `resume-at`: the operator states where every partition continues, when the positions
  cannot be rebuilt.
- `retire-topic`: on a pipeline reading several topics, a topic it no longer reads (deleted,
  so the pattern no longer finds it, or dropped from `kafka.topics`) is held by no batch any
  more, so the other topics go on; read again later, the same incarnation continues where
  it was left, and a topic created anew under its name is read from its first record, as
  any topic that appears once the pipeline runs (ledger/core/topic_plan.py).

A decision is recorded in the ledger (one row per decision) and carried by the commit
metadata of the next batch planned on it, so a lost ledger gets it back from the Delta log.
It applies to positions taken after `after_batch_id`: once a batch planned on it holds a
range, that batch's ends are the positions, as for any batch.

Here: the decisions and what they do to positions, pure. What each kind may skip is
checked by ledger/core/decision_rules.py, pure too; recording one is `record_decision`
(ledger/coordinator/decisions.py), the I/O, through a coordinator's edges (as
ledger/coordinator/backfill.py does for backfills).
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ledger.core.protocol import OffsetRange, Positions


class DecisionKind(enum.StrEnum):
    """What an operator decided. Stored in ledgers and Delta commit metadata: never renamed."""

    LOST_OFFSETS = "lost-offsets"
    NEW_TOPIC = "new-topic"
    RESUME_AT = "resume-at"
    RETIRE_TOPIC = "retire-topic"
    #: recorded by exactly itself, not an operator: positions written before topic ids were
    #: stored take the topic's id at their next plan (ledger/core/protocol.py check_topic_identity)
    ADOPT_TOPIC_ID = "adopt-topic-id"


#: Who records the decisions exactly takes on its own.
EXACTLY = "exactly"


@dataclass(frozen=True)
class Decision:
    """One recorded decision. `id` is stable (a rebuild from the Delta log keeps it)."""

    id: str
    pipeline: str
    app_id: str
    kind: DecisionKind
    topic: str
    #: the topic incarnation the positions belong to from this decision on
    topic_id: str | None
    #: the incarnation they belonged to before (None: unknown)
    previous_topic_id: str | None
    #: every batch id at or below this one existed when the decision was taken
    after_batch_id: int
    reason: str
    decided_by: str
    decided_at: datetime
    #: ranges never read because of this decision
    skipped: tuple[OffsetRange, ...] = ()
    #: where reading continues (resume-at); empty for new-topic: the starting offsets
    positions: Mapping[int, int] = field(default_factory=dict)
    #: the positions the decision replaced, kept as history
    previous_positions: Mapping[int, int] = field(default_factory=dict)
    #: the operator skipped records Kafka still held, on purpose (--force)
    forced: bool = False

    def describe(self) -> str:
        """One line for `exactly ledger` and the skip command's answer."""
        what = {
            DecisionKind.LOST_OFFSETS: "skip " + " ".join(str(r) for r in self.skipped),
            DecisionKind.NEW_TOPIC: f"accept topic {self.topic} id {self.topic_id} "
            f"(was {self.previous_topic_id or 'unknown'})",
            DecisionKind.RESUME_AT: f"resume {self.topic} at "
            + " ".join(f"{p}={o}" for p, o in sorted(self.positions.items())),
            DecisionKind.ADOPT_TOPIC_ID: f"adopt topic {self.topic} id {self.topic_id}",
            DecisionKind.RETIRE_TOPIC: f"retire topic {self.topic} (id "
            f"{self.previous_topic_id or 'unknown'}, left at "
            + (" ".join(f"{p}={o}" for p, o in sorted(self.previous_positions.items())) or "-")
            + ")",
        }[self.kind]
        if self.kind in (DecisionKind.RESUME_AT, DecisionKind.RETIRE_TOPIC) and self.skipped:
            what += ", skipping " + " ".join(str(r) for r in self.skipped)
        forced = " (forced)" if self.forced else ""
        return (
            f"{self.kind}: {what}{forced}; by {self.decided_by} at "
            f"{self.decided_at.isoformat(timespec='seconds')}: {self.reason}"
        )

    def as_dict(self) -> dict[str, Any]:
        """The form stored in the ledger, in commit metadata and shown as JSON."""
        return {
            "id": self.id,
            "pipeline": self.pipeline,
            "app_id": self.app_id,
            "kind": str(self.kind),
            "topic": self.topic,
            "topic_id": self.topic_id,
            "previous_topic_id": self.previous_topic_id,
            "after_batch_id": self.after_batch_id,
            "reason": self.reason,
            "decided_by": self.decided_by,
            "decided_at": self.decided_at.isoformat(),
            "skipped": [r.as_dict() for r in self.skipped],
            "positions": {str(p): o for p, o in sorted(self.positions.items())},
            "previous_positions": {str(p): o for p, o in sorted(self.previous_positions.items())},
            "forced": self.forced,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Decision:
        return cls(
            id=str(data["id"]),
            pipeline=str(data["pipeline"]),
            app_id=str(data["app_id"]),
            kind=DecisionKind(data["kind"]),
            topic=str(data["topic"]),
            topic_id=data.get("topic_id"),
            previous_topic_id=data.get("previous_topic_id"),
            after_batch_id=int(data["after_batch_id"]),
            reason=str(data["reason"]),
            decided_by=str(data["decided_by"]),
            decided_at=datetime.fromisoformat(str(data["decided_at"])),
            skipped=tuple(OffsetRange.from_dict(r) for r in data.get("skipped") or ()),
            positions=_int_keys(data.get("positions")),
            previous_positions=_int_keys(data.get("previous_positions")),
            forced=bool(data.get("forced", False)),
        )


def _int_keys(data: Mapping[str, Any] | None) -> dict[int, int]:
    return {int(p): int(o) for p, o in (data or {}).items()}


def new_decision_id() -> str:
    return uuid.uuid4().hex


# -- what decisions do to positions ---------------------------------------------------------


def apply_decisions(
    positions: Positions, last_batch_id: int | None, decisions: Iterable[Decision]
) -> Positions:
    """The positions once every decision taken after the last batch holding a range applies.

    `positions` are that batch's ends (with its topic id); `decisions` are the application's,
    oldest first. A decision taken before that batch was planned is already in its ranges.
    A topic retired last is left where it was, marked retired (`retired_positions`).
    """
    offsets = dict(positions)
    topic, topic_id = positions.topic, positions.topic_id
    applied = []
    for d in decisions:
        if last_batch_id is not None and d.after_batch_id < last_batch_id:
            continue
        applied.append(d)
        if d.kind is DecisionKind.LOST_OFFSETS:
            offsets.update({r.partition: r.end for r in d.skipped})
        elif d.kind is DecisionKind.NEW_TOPIC:
            offsets = {}
        elif d.kind is DecisionKind.RESUME_AT:
            offsets = dict(d.positions)
        topic, topic_id = d.topic, d.topic_id
    if applied and applied[-1].kind is DecisionKind.RETIRE_TOPIC:
        return retired_positions(applied[-1], applied)
    return Positions(offsets, topic=topic, topic_id=topic_id, decisions=applied)


def retired_positions(decision: Decision, decisions: Iterable[Decision] = ()) -> Positions:
    """The positions a `retire-topic` decision leaves: where the topic was left, on the
    incarnation it was read from, held by no batch (ledger/core/topic_plan.py)."""
    return Positions(
        decision.previous_positions,
        topic=decision.topic,
        topic_id=decision.previous_topic_id,
        decisions=decisions,
        retired=True,
    )


# -- recording one (I/O through a coordinator's edges) -------------------------------------


@dataclass(frozen=True)
class Request:
    """What the operator asked for, as the CLI passes it on."""

    kind: DecisionKind
    reason: str
    decided_by: str
    partition: int | None = None
    to: int | None = None
    topic_id: str | None = None
    positions: Mapping[int, int] = field(default_factory=dict)
    force: bool = False
    #: the topic the decision is about; required when the pipeline reads several topics
    topic: str | None = None
    #: the upsert outputs whose table exists: a new-topic decision is refused while any does
    upsert_outputs: tuple[str, ...] = ()
