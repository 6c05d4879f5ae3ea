"""Recording an operator's decision through the coordinator: the I/O around the pure
rules of ledger/core/decisions.py, decided again inside the ledger transaction that records
the decision."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from ledger.coordinator.topics import read_topics, reads_several_topics
from ledger.coordinator.two_phase import TwoPhaseCommit
from ledger.core.decision_rules import (
    check_new_topic,
    lost_offsets_skips,
    resume_skips,
    retire_skips,
)
from ledger.core.decisions import Decision, DecisionKind, Request, new_decision_id
from ledger.core.errors import DecisionError
from ledger.core.protocol import Available, OffsetRange, Positions


def record_decision(tpc: TwoPhaseCommit, request: Request, decided_at: datetime) -> Decision:
    """Check `request` against Kafka, the table and the ledger, and record it; or refuse.

    Voted batches are finished first and dead attempts abandoned (as every start does before
    it plans), so the decision applies to positions nothing is still reading; a resume-at
    skips that step, because recovery rebuilds from the Delta log, which is what it stands
    in for. The rule is decided again inside the ledger transaction that records it, on the
    positions read there.
    """
    if not request.reason.strip():
        raise DecisionError("--reason must say why: it is recorded with the decision")
    if request.kind is not DecisionKind.RESUME_AT:
        tpc.recover_and_commit()
    still_read = False
    if request.kind is DecisionKind.RETIRE_TOPIC:
        topic, current_id, available, still_read = _retired_topic(tpc, request)
        several = True
    else:
        topic, current_id, available, several = _decision_topic(tpc, request)
    reach: Mapping[int, int] = {}
    floor = None
    read_before = tpc.store.topic_ids_read(tpc.app_id)
    if request.kind is DecisionKind.RESUME_AT:
        reach = tpc.publisher.rows_reach(topic)
        floor = tpc.publisher.committed_version(tpc.app_id)

    facts = _Facts(topic, current_id, available, reach, frozenset(read_before), still_read)

    def decide(positions: Positions, after_batch_id: int) -> Decision:
        skipped, resumed, forced = _checked(request, facts, positions)
        return Decision(
            id=new_decision_id(),
            pipeline=tpc.pipeline,
            app_id=tpc.app_id,
            kind=request.kind,
            topic=topic,
            # a retired topic's positions belong to no incarnation any more
            topic_id=None if request.kind is DecisionKind.RETIRE_TOPIC else current_id,
            previous_topic_id=positions.topic_id,
            after_batch_id=after_batch_id,
            reason=request.reason.strip(),
            decided_by=request.decided_by,
            decided_at=decided_at,
            skipped=tuple(skipped),
            positions=resumed,
            previous_positions=dict(positions),
            forced=forced,
        )

    return tpc.store.record_decision(
        pipeline=tpc.pipeline,
        app_id=tpc.app_id,
        decide=decide,
        floor_batch_id=floor,
        topic=topic if several else None,
    )


@dataclass(frozen=True)
class _Facts:
    """What the rules check a decision against, read once before the ledger transaction:
    the topic, its id and offsets now (None and nothing once deleted), the table's reach
    (resume-at), the ids batches read before, and whether the pipeline still reads it."""

    topic: str
    current_id: str | None
    available: Mapping[int, Available]
    reach: Mapping[int, int]
    read_before: frozenset[str]
    still_read: bool


def _checked(
    request: Request, facts: _Facts, positions: Positions
) -> tuple[list[OffsetRange], Mapping[int, int], bool]:
    """The rule of the request's kind (ledger/core/decision_rules.py), on the positions read
    in the recording transaction: (skipped ranges, resume positions, forced), or refused."""
    topic, current_id, available = facts.topic, facts.current_id or "", facts.available
    if request.kind is DecisionKind.LOST_OFFSETS:
        skipped = lost_offsets_skips(
            topic, positions, available, current_id,
            partition=request.partition, to=request.to, force=request.force,
        )  # fmt: skip
        return skipped, {}, any(r.end > available[r.partition].earliest for r in skipped)
    if request.kind is DecisionKind.NEW_TOPIC:
        check_new_topic(
            topic,
            positions,
            current_id,
            request.topic_id or "",
            read_before=facts.read_before,
            force=request.force,
            upsert_outputs=request.upsert_outputs,
        )
        unsure = positions.topic_id is None or current_id in facts.read_before
        return [], {}, request.force and unsure
    if request.kind is DecisionKind.RESUME_AT:
        skipped = resume_skips(
            topic, request.positions, available, facts.reach, force=request.force
        )
        return skipped, dict(request.positions), request.force
    if request.kind is DecisionKind.RETIRE_TOPIC:
        skipped = retire_skips(
            topic, positions, still_read=facts.still_read, current_id=facts.current_id,
            available=available, force=request.force,
        )  # fmt: skip
        return skipped, {}, bool(skipped)
    raise DecisionError(f"{request.kind} is recorded by exactly only")


def _retired_topic(
    tpc: TwoPhaseCommit, request: Request
) -> tuple[str, str | None, Mapping[int, Available], bool]:
    """The topic a retire-topic decision is about; its id and offsets if Kafka still has it
    (None and nothing once deleted); whether the pipeline still reads it."""
    source = tpc.source
    if not reads_several_topics(source):
        raise DecisionError(
            f"retire-topic: pipeline {tpc.pipeline} reads one topic; a topic is retired from "
            "a pipeline on several (kafka.topics or kafka.pattern)"
        )
    if request.topic is None:
        raise DecisionError("--topic: name the topic to retire")
    topic = request.topic
    still_read = topic in source.topics()  # type: ignore[union-attr]
    if not source.exists(topic):  # type: ignore[union-attr]
        return topic, None, {}, still_read
    read = read_topics(source, [topic])[topic]  # type: ignore[arg-type]
    return topic, read.topic_id, read.available, still_read


def _decision_topic(
    tpc: TwoPhaseCommit, request: Request
) -> tuple[str, str, Mapping[int, Available], bool]:
    """The topic a decision is about, its id and offsets now, and whether the pipeline reads
    several topics (then the decision names one, and moves only that topic's positions)."""
    source = tpc.source
    if not reads_several_topics(source):
        topic = source.topic  # type: ignore[union-attr]
        if request.topic not in (None, topic):
            raise DecisionError(f"--topic: pipeline {tpc.pipeline} reads topic {topic} only")
        current_id, available = tpc.read_topic()
        return topic, current_id, available, False
    topics = source.topics()  # type: ignore[union-attr]
    if request.topic is None:
        raise DecisionError(
            f"--topic: pipeline {tpc.pipeline} reads several topics ({', '.join(topics)}): "
            "name the one the decision is about"
        )
    if request.topic not in topics:
        raise DecisionError(
            f"--topic: pipeline {tpc.pipeline} does not read topic {request.topic} now (it "
            f"reads {', '.join(topics) or 'none'})"
        )
    read = read_topics(source, [request.topic])[request.topic]  # type: ignore[arg-type]
    return request.topic, read.topic_id, read.available, True
