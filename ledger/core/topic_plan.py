"""One batch's ranges across every topic a pipeline reads (pure; no I/O).

A batch is one checkpoint (docs/protocol.md): with several topics, every matched topic's
partitions get their range in the same batch, planned at one instant, each recorded with
its topic's id (KIP-516). So a re-stage after a crash reads the very ranges the vote was
planned on, whatever topics a pattern matches by then, and a commit either holds every
topic's share of the batch or none of it.

The per-topic rules are the single-topic ones of ledger/core/protocol.py, applied topic by
topic: positions continue where the last batch ended (invariant 1), a re-created topic is
refused until an operator accepts it (invariant 10), offsets retention deleted are a loud
error (invariant 8). What is new is only what several topics add:

- `starting_offsets` is where the pipeline starts, as Structured Streaming's
  `startingOffsets` applies only when a query starts: every topic of the pipeline's first
  batch starts there, and so does a topic an operator accepted anew (`new-topic`). A topic
  that appears once the pipeline has positions (created and matching the pattern, added to
  the list, or created anew after it was retired) starts at its earliest offset, as does a
  partition added to a topic already read (protocol.plan_ranges): with `latest`, every
  record produced to it before a plan saw it would otherwise be skipped, silently;
- a topic that has positions but is not read any more (deleted, so the pattern no longer
  finds it, or dropped from `kafka.topics`) stops the plan: its unread records would
  otherwise be lost without anyone deciding so. An operator's `retire-topic` decision
  (ledger/core/decisions.py) releases it: the next batch is planned without it and carries
  the decision, and from then on the topic holds no positions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ledger.core.decision_rules import retire_topic_command
from ledger.core.decisions import Decision, DecisionKind, apply_decisions, retired_positions
from ledger.core.errors import TopicChangedError
from ledger.core.protocol import (
    Available,
    OffsetRange,
    Positions,
    check_contiguous,
    check_topic_identity,
    plan_ranges,
    worth_planning,
)


@dataclass(frozen=True)
class TopicRead:
    """One topic as Kafka reports it now: its id and every partition's offsets, the id
    read before and after the offsets and found the same (protocol.check_topic_steady)."""

    topic_id: str
    available: Mapping[int, Available]


@dataclass(frozen=True)
class TopicPlan:
    """The next batch's ranges on every topic, and the id each topic was planned on."""

    ranges: tuple[OffsetRange, ...]
    topic_ids: Mapping[str, str]
    #: whether the ranges are worth a batch (protocol.worth_planning, on any topic)
    worth_planning: bool


def positions_by_topic(
    ranges: Iterable[OffsetRange], topic_ids: Mapping[str, str | None]
) -> dict[str, Positions]:
    """The next offset per partition of each topic, from the ranges of the newest batch
    that holds a range, each topic with the id its ranges were recorded with (None for
    ranges recorded before exactly stored topic ids)."""
    offsets: dict[str, dict[int, int]] = {}
    for rng in ranges:
        offsets.setdefault(rng.topic, {})[rng.partition] = rng.end
    return {
        topic: Positions(by_partition, topic=topic, topic_id=topic_ids.get(topic))
        for topic, by_partition in offsets.items()
    }


def apply_topic_decisions(
    held: Mapping[str, Positions], last_batch_id: int | None, decisions: Iterable[Decision]
) -> dict[str, Positions]:
    """Each topic's positions once the decisions taken about it since the last batch apply
    (ledger/core/decisions.py apply_decisions, topic by topic: a decision names its topic, and
    moves only that topic's positions). A topic only a decision knows (accepted before it
    was ever read) gets the positions the decision leaves.

    A retired topic (`retire-topic`) is absent from every batch planned after it, so its
    positions are the decision's own: where it was left, marked `retired`, and kept for
    good, so that the same incarnation read again continues there instead of reading its
    committed records again from its first record (plan_topics)."""
    decisions = list(decisions)
    applicable = [
        d for d in decisions if last_batch_id is None or d.after_batch_id >= last_batch_id
    ]
    topics = sorted(set(held) | {d.topic for d in applicable if d.topic})
    positions = {
        topic: apply_decisions(
            held.get(topic) or Positions(topic=topic),
            last_batch_id,
            [d for d in applicable if d.topic == topic],
        )
        for topic in topics
    }
    for d in decisions:  # oldest first: a topic retired again keeps the last retirement
        if d.kind is DecisionKind.RETIRE_TOPIC and d.topic not in topics:
            positions[d.topic] = retired_positions(d)
    return positions


def decisions_of(positions: Mapping[str, Positions]) -> list[Decision]:
    """Every decision the positions were moved by, oldest first: the batch planned on them
    records them and its commit carries them (invariant 15)."""
    found = {d.id: d for p in positions.values() for d in p.decisions}
    return sorted(found.values(), key=lambda d: (d.after_batch_id, d.decided_at))


def continued(held: Positions, current_id: str) -> Positions:
    """The positions a topic is read on from, given the id Kafka reports for it now: a
    retired topic's own if it is the incarnation they were left on (no record read twice),
    none if it was deleted and created again since (a topic new to the pipeline)."""
    if held.retired and held.topic_id != current_id:
        return Positions(topic=held.topic, decisions=held.decisions)
    return held


def check_contiguous_by_topic(
    positions: Mapping[str, Positions],
    ranges: Sequence[OffsetRange],
    batch: str,
    topic_ids: Mapping[str, str],
) -> None:
    """protocol.check_contiguous, topic by topic: partition 0 of one topic and partition 0
    of another are two positions (invariant 1); each topic's positions as `continued` on
    the id the batch is planned on."""
    for topic in sorted({r.topic for r in ranges}):
        held = positions.get(topic) or Positions(topic=topic)
        if topic in topic_ids:
            held = continued(held, topic_ids[topic])
        check_contiguous(held, [r for r in ranges if r.topic == topic], batch)


def plan_topics(
    topics: Sequence[str],
    positions: Mapping[str, Positions],
    reads: Mapping[str, TopicRead],
    *,
    max_records_per_partition: int,
    starting_offsets: str = "earliest",
) -> TopicPlan:
    """Fix the next batch's range for every partition of every topic in `topics` (the
    selection resolved now, resources/kafka/topic_selection.py), from `positions` (per topic)
    and what Kafka reported (`reads`, per topic, read at one planning instant).

    Raises TopicChangedError naming the topic when one of them cannot be continued, and
    DataLossError (from protocol.plan_ranges) naming the partition whose offsets are gone.
    """
    check_nothing_left_behind(topics, positions)
    started = any(len(held) > 0 for held in positions.values())
    ranges: list[OffsetRange] = []
    worth = False
    for topic in topics:
        read = reads[topic]
        stored = positions.get(topic)
        held = continued(Positions(topic=topic) if stored is None else stored, read.topic_id)
        check_topic_identity(topic, held, read.topic_id, name_topic=True)
        starts = starting_offsets if not started or restarted(held) else "earliest"
        planned = plan_ranges(
            topic, held, read.available, max_records_per_partition, starts, name_topic=True
        )
        worth = worth or worth_planning(planned, held, starts)
        ranges.extend(planned)
    return TopicPlan(tuple(ranges), {topic: reads[topic].topic_id for topic in topics}, worth)


def restarted(held: Positions) -> bool:
    """Whether an operator's `new-topic` decision reset the topic's positions since its last
    batch: they restart at `starting_offsets` (ledger/core/decisions.py), on a running
    pipeline too."""
    return not held and any(d.kind is DecisionKind.NEW_TOPIC for d in held.decisions)


def check_nothing_left_behind(topics: Sequence[str], positions: Mapping[str, Positions]) -> None:
    """Every topic with stored positions must still be read: one that is not (deleted, so a
    pattern no longer finds it; or dropped from the config's list) would leave its unread
    records behind silently (invariant 8). A retired topic holds none."""
    for topic in sorted(set(positions) - set(topics)):
        held = positions[topic]
        if held.retired:
            continue
        raise TopicChangedError(
            f"topic {topic}: the ledger holds positions on it ({_where(held)}, id "
            f"{held.topic_id or 'not recorded'}) but the pipeline no longer reads it (the "
            "topic was deleted, or the config no longer names it); nothing was planned. "
            "Restore the config to read it on or, if it is gone for good, record that: "
            f"{retire_topic_command(topic)}"
        )


def check_one_topic(app_id: str, ranges: Iterable[OffsetRange]) -> None:
    """One-topic positions (partition -> offset) may only be read from a batch on one
    topic: merging several topics' partitions would take one topic's end for another's
    (records read twice or skipped), and the batch's ids for 'none recorded' (adopted
    silently). A config back on `kafka.topic` after a batch on several topics stops here."""
    topics = sorted({r.topic for r in ranges})
    if len(topics) > 1:
        raise TopicChangedError(
            f"the ledger's last batch of {app_id} read topics {', '.join(topics)}, but the "
            "config reads one topic (kafka.topic); nothing was planned. Read them on with "
            f"kafka.topics: [{', '.join(topics)}]"
        )


def _where(positions: Positions) -> str:
    return ", ".join(f"partition {p} at {o}" for p, o in sorted(positions.items()))
