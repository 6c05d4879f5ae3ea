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
  so the pattern no longer finds it, or dropped from `kafka.topics`) stops holding
  positions, so the other topics go on; if it is ever read again, it starts again from the
  `starting_offsets`, like any topic new to the pipeline.

A decision is recorded in the ledger (one row per decision) and carried by the commit
metadata of the next batch planned on it, so a lost ledger gets it back from the Delta log.
It applies to positions taken after `after_batch_id`: once a batch planned on it holds a
range, that batch's ends are the positions, as for any batch.

The rules here are pure (what a decision may skip, what positions it leaves); recording
one is `record_decision` (ledger/coordinator/decisions.py), the I/O, through a coordinator's
edges (as ledger/coordinator/backfill.py does for backfills).
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ledger.core.errors import CONFIG_PLACEHOLDER, DecisionError
from ledger.core.protocol import Available, OffsetRange, Positions


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
        elif d.kind is DecisionKind.RETIRE_TOPIC:
            offsets = {}
        topic, topic_id = d.topic, d.topic_id
    return Positions(offsets, topic=topic, topic_id=topic_id, decisions=applied)


# -- what an operator may decide (pure) ----------------------------------------------------


def _skip_command(kind: str, args: str) -> str:
    return f"exactly skip {kind} -c {CONFIG_PLACEHOLDER} {args} --reason '...'"


def retire_topic_command(topic: str) -> str:
    """The decision that lets a pipeline on several topics go on without `topic`."""
    return _skip_command("retire-topic", f"--topic {topic}")


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


def _same_topic(topic: str, positions: Positions, current_id: str) -> None:
    if positions.topic_id is not None and positions.topic_id != current_id:
        raise DecisionError(
            f"topic {topic} has id {current_id}, but the positions belong to id "
            f"{positions.topic_id}: accept the new topic first: "
            f"{_skip_command('new-topic', f'--topic-id {current_id}')}"
        )


def lost_offsets_skips(
    topic: str,
    positions: Positions,
    available: Mapping[int, Available],
    current_id: str,
    *,
    partition: int | None = None,
    to: int | None = None,
    force: bool = False,
) -> list[OffsetRange]:
    """The ranges a `lost-offsets` decision skips: [position, earliest) of each partition
    whose position retention deleted (all of them, or `partition`).

    Refuses what is not a loss: a partition whose position Kafka still holds, an end below
    the earliest offset (that would leave part of the loss in place), and, unless `force`,
    an end past it (that would skip records Kafka still holds: the careless operator's
    silent loss). Never past the last stable offset.
    """
    _same_topic(topic, positions, current_id)
    if partition is not None and partition not in available:
        raise DecisionError(f"{topic}-{partition}: no such partition in Kafka")
    wanted = [partition] if partition is not None else sorted(available)
    skips = []
    for p in wanted:
        avail = available[p]
        stored = positions.get(p)
        if stored is None or stored >= avail.earliest:
            if partition is None:
                continue
            where = (
                "it has no position yet and starts at its earliest offset on its own"
                if stored is None
                else f"its position {stored} is still in Kafka (earliest is {avail.earliest})"
            )
            raise DecisionError(f"{topic}-{p}: nothing is lost, so nothing to skip: {where}")
        end = avail.earliest if to is None else to
        if end < avail.earliest:
            raise DecisionError(
                f"{topic}-{p}: --to {end} would leave offsets [{end}, {avail.earliest}) lost "
                f"too; the lost range is [{stored}, {avail.earliest}): leave out --to"
            )
        if end > avail.last_stable:
            raise DecisionError(
                f"{topic}-{p}: --to {end} is past the last stable offset {avail.last_stable}"
            )
        if end > avail.earliest and not force:
            raise DecisionError(
                f"{topic}-{p}: skipping to {end} would also skip offsets "
                f"[{avail.earliest}, {end}) that Kafka still holds; only [{stored}, "
                f"{avail.earliest}) is lost (leave out --to), or add --force to drop those "
                "records on purpose"
            )
        skips.append(OffsetRange(topic, p, stored, end))
    if not skips:
        raise DecisionError(
            f"topic {topic}: nothing is lost: every partition's position is still in Kafka"
        )
    return skips


def check_new_topic(
    topic: str,
    positions: Positions,
    current_id: str,
    accepted_id: str,
    *,
    read_before: Iterable[str] = (),
    force: bool = False,
    upsert_outputs: Sequence[str] = (),
) -> None:
    """A `new-topic` decision accepts the id Kafka reports now, and only when the positions
    belong to another one: the operator names the id, so a topic re-created once more
    since the error was read is not accepted unseen. Restarting at the starting offsets
    would read again a topic the pipeline already read from (`read_before`: a config
    pointed back at an earlier topic), and positions that carry no id (recorded before
    exactly stored ids) may be this very topic: both need `force`.

    A pipeline whose upsert outputs hold rows (`upsert_outputs`: the names of those whose
    table exists) is refused, even with `force`: an upsert orders a key's records by
    (partition, offset), which restart at 0 on the new topic, so the old topic's records
    would win over the new one's for ever (docs/derived-tables.md "Topic re-created"). Their
    tables must be deleted first; each starts again from the new topic, empty
    (jobs/derived/rebuild.py)."""
    if accepted_id != current_id:
        raise DecisionError(
            f"topic {topic} has id {current_id}, not {accepted_id}: accept the id Kafka "
            f"reports now: {_skip_command('new-topic', f'--topic-id {current_id}')}"
        )
    if positions.topic_id == current_id:
        raise DecisionError(
            f"topic {topic}: the positions already belong to id {current_id}; nothing to accept"
        )
    if not positions:
        raise DecisionError(
            f"topic {topic}: the pipeline has no positions yet and starts on id {current_id} "
            "on its own; nothing to accept"
        )
    if current_id in set(read_before) and not force:
        raise DecisionError(
            f"topic {topic}: batches of this pipeline already read topic id {current_id}; "
            "accepting it restarts at the starting offsets and reads those records again; "
            "add --force only to read it again on purpose"
        )
    if positions.topic_id is None and not force:
        raise DecisionError(
            f"topic {topic}: the positions were recorded before exactly stored topic ids, so "
            f"whether id {current_id} is another topic cannot be told; they take that id on "
            "the next plan on their own, while accepting it restarts them at the starting "
            "offsets and may read records again: add --force only if the topic was re-created"
        )
    if upsert_outputs:
        raise DecisionError(
            f"topic {topic}: upsert output(s) {', '.join(upsert_outputs)} order records by "
            "(partition, offset), which restart at 0 on the new topic, so the old topic's "
            "records would win for ever: delete their tables before accepting it, then start "
            f"each again from the new topic with `exactly derived rebuild --empty -c "
            f"{CONFIG_PLACEHOLDER} NAME`"
        )


def resume_skips(
    topic: str,
    stated: Mapping[int, int],
    available: Mapping[int, Available],
    reach: Mapping[int, int],
    *,
    force: bool = False,
) -> list[OffsetRange]:
    """Check `resume-at` positions against Kafka and the table's rows; the ranges they skip.

    `reach` is one past the highest offset of each partition in the published rows. Every
    partition must be stated. A position below the rows' reach reads committed records again
    (duplicates) and one above it skips records Kafka still holds (loss): both are refused
    unless `force`. Offsets below Kafka's earliest are gone whatever is decided; skipping
    them is recorded, like a lost-offsets decision.
    """
    missing = sorted(set(available) - set(stated))
    unknown = sorted(set(stated) - set(available))
    if missing or unknown:
        raise DecisionError(
            f"topic {topic}: state a position for every partition "
            f"{sorted(available)} and no other (missing {missing}, unknown {unknown})"
        )
    skipped = []
    for p in sorted(stated):
        at, avail = stated[p], available[p]
        rows_end = reach.get(p)
        if at < avail.earliest:
            raise DecisionError(
                f"{topic}-{p}: offsets [{at}, {avail.earliest}) are no longer in Kafka; "
                f"continue at {avail.earliest} or later"
            )
        if at > avail.last_stable:
            raise DecisionError(
                f"{topic}-{p}: position {at} is past the last stable offset {avail.last_stable}"
            )
        if rows_end is not None and at < rows_end and not force:
            raise DecisionError(
                f"{topic}-{p}: position {at} would read offsets [{at}, {rows_end}) again, but "
                f"the table already holds them (duplicates); continue at {rows_end}, or add "
                "--force"
            )
        start = rows_end if rows_end is not None else avail.earliest
        if start < avail.earliest:
            skipped.append(OffsetRange(topic, p, start, avail.earliest))
            start = avail.earliest
        if at > start:
            if not force:
                raise DecisionError(
                    f"{topic}-{p}: position {at} would skip offsets [{start}, {at}) that "
                    f"Kafka still holds; continue at {start}, or add --force to drop those "
                    "records on purpose"
                )
            skipped.append(OffsetRange(topic, p, start, at))
    return skipped


def retire_skips(
    topic: str,
    positions: Positions,
    *,
    still_read: bool,
    current_id: str | None,
    available: Mapping[int, Available],
    force: bool = False,
) -> list[OffsetRange]:
    """Check a `retire-topic` decision; the ranges it leaves unread that Kafka still holds.

    Only a topic the pipeline no longer reads (`still_read` False) and whose positions the
    ledger holds may be retired: retiring a topic still read would re-read it from the
    starting offsets at the next plan (duplicates). When Kafka still has the very
    incarnation the positions were read from (`current_id` equal to theirs: dropped from
    `kafka.topics`, not deleted), every record past the positions would never be read:
    refused unless `force`, and then recorded as skipped. A deleted topic (`current_id`
    None) or one re-created since (another id) took its unread records with it: nothing is
    left to skip, and the positions the decision replaces are kept as history.
    """
    if still_read:
        raise DecisionError(
            f"topic {topic}: the pipeline still reads it (the config names it or its pattern "
            "matches it), so retiring it would read it again from the starting offsets; "
            "nothing to retire: delete the topic, or take it out of kafka.topics, first"
        )
    if not positions or positions.retired:
        what = "is retired already" if positions.retired else "holds no positions on it"
        raise DecisionError(f"topic {topic}: the ledger {what}; nothing to retire")
    if current_id is None or positions.topic_id not in (None, current_id):
        return []
    skipped = []
    for p in sorted(set(available) | set(positions)):
        avail = available.get(p)
        if avail is None:
            continue  # a partition Kafka no longer lists holds nothing to read
        start = positions.get(p, avail.earliest)
        if max(start, avail.earliest) >= avail.last_stable:
            continue
        if not force:
            raise DecisionError(
                f"{topic}-{p}: offsets [{max(start, avail.earliest)}, {avail.last_stable}) were "
                "never read, and Kafka still holds them; read them first (name the topic in "
                "the config again), or add --force to leave them unread on purpose"
            )
        skipped.append(OffsetRange(topic, p, start, avail.last_stable))
    return skipped


def resume_command(
    reach: Mapping[int, int], partitions: Sequence[int], topic: str | None = None
) -> str:
    """The `resume-at` command the table's rows suggest (one past their highest offsets);
    naming its `topic` on a pipeline that reads several."""
    stated = " ".join(
        f"--position {p}={reach[p]}" if p in reach else f"--position {p}=OFFSET"
        for p in sorted(set(partitions) | set(reach))
    )
    which = f"--topic {topic} " if topic else ""
    return _skip_command("resume-at", which + (stated or "--position PARTITION=OFFSET"))


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
