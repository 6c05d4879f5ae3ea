"""The coordinator's planning and topic checks for a pipeline on several topics (pure; the
edges are Protocols, as in ledger/coordinator/two_phase.py).

`TwoPhaseCommit` takes this path when its offset source reads several topics (a
`TopicsSource`: `kafka.topics` or `kafka.pattern`, jobs/sources/topics_source.py). The states,
votes, commits, acks and recovery are the same as for one topic; what differs is only
what a batch is planned on and checked against (docs/protocol.md, invariant 10):

- planning resolves the selection now, reads every resolved topic's id and offsets (the id
  before and after the offsets), and plans every topic's ranges in one batch, each range
  recorded with its topic's id (ledger/core/topic_plan.py, LedgerStore.plan(topic_ids=...));
- staging checks, right before the read and again after it, that every topic the batch
  was planned on still has the id it was planned on. It never resolves the selection
  again: a re-stage after a crash reads exactly the batch's ranges, even if the pattern
  matches more topics by then (they join the next batch).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from ledger.core.batch import Batch, BatchKind
from ledger.core.errors import TopicChangedError
from ledger.core.other_writers import new_topics_refusal
from ledger.core.ports import NextBatch, TopicsSource
from ledger.core.protocol import (
    OffsetRange,
    Positions,
    check_batch_topic,
    check_ranges_readable,
    check_topic_identity,
    check_topic_steady,
)
from ledger.core.topic_plan import TopicPlan, TopicRead, check_nothing_left_behind, plan_topics

if TYPE_CHECKING:
    from ledger.coordinator.two_phase import TwoPhaseCommit


def reads_several_topics(source: object) -> bool:
    return isinstance(source, TopicsSource)


def topics_read(source: object) -> tuple[str, ...]:
    """The topics `source` reads now: a pattern's resolved, or the one topic."""
    if reads_several_topics(source):
        return source.topics()  # type: ignore[attr-defined]
    return (source.topic,)  # type: ignore[attr-defined]


def read_topics(source: TopicsSource, topics: Iterable[str]) -> dict[str, TopicRead]:
    """Each topic's id and offsets; the id is read before and after the offsets, and a
    change in between refuses (protocol.check_topic_steady, invariant 10)."""
    reads = {}
    for topic in topics:
        before = source.topic_id_of(topic)
        available = source.available_of(topic)
        check_topic_steady(topic, before, source.topic_id_of(topic))
        reads[topic] = TopicRead(before, available)
    return reads


def _plan(
    tpc: TwoPhaseCommit, positions: Mapping[str, Positions], reads: Mapping[str, TopicRead]
) -> TopicPlan:
    """Every read topic's ranges from `positions`, with the coordinator's settings."""
    return plan_topics(
        tuple(reads),
        positions,
        reads,
        max_records_per_partition=tpc.max_records_per_partition,
        starting_offsets=tpc.starting_offsets,
    )


def begin(tpc: TwoPhaseCommit, *, allow_empty: bool, batch_id: int | None) -> Batch | None:
    """TwoPhaseCommit.begin on several topics: every topic's range in one new batch."""
    source = _source(tpc)
    reads = read_topics(source, source.topics())
    if tpc.kind is BatchKind.LIVE:
        refuse_other_writers_of_new_topics(tpc, reads)

    def ranges_for(positions: Mapping[str, Positions]) -> list[OffsetRange] | None:
        plan = _plan(tpc, positions, reads)
        return list(plan.ranges) if allow_empty or plan.worth_planning else None

    return tpc.store.plan(
        pipeline=tpc.pipeline,
        app_id=tpc.app_id,
        kind=tpc.kind,
        ranges_for=ranges_for,
        batch_id=batch_id,
        topic_ids={topic: read.topic_id for topic, read in reads.items()},
    )


def refuse_other_writers_of_new_topics(tpc: TwoPhaseCommit, topics: Iterable[str]) -> None:
    """Before a live batch of a pipeline that holds batches is planned: refuse the topics
    it reads now and never read (no position in the ledger: added to `kafka.topics`, or
    newly matched by its pattern, found at a restart or between two batches of a
    continuous run) when another pipeline's batches in its tables read them
    (ledger/core/other_writers.py `new_topics_refusal`). A pipeline that holds nothing was
    asked at its start (ledger/coordinator/table_history.py `refuse_other_writers`) and is
    asked again at its first commit (resources/delta/writers.py). The logs are read only
    when there is such a topic, and once per process for each (an empty topic stays new
    until a batch reads its partitions, and an idle continuous run plans every second)."""
    held = tpc.store.positions_by_topic(tpc.app_id)
    new = [t for t in topics if t not in held and t not in tpc.new_topics_cleared]
    if not held or not new:
        return
    others = tpc.publisher.other_writers()
    refusal = new_topics_refusal(tpc.pipeline, tpc.publisher.table_location(), new, others)
    if refusal is not None:
        raise refusal
    tpc.new_topics_cleared.update(new)


def next_batch(tpc: TwoPhaseCommit) -> NextBatch:
    """TwoPhaseCommit.next_batch on several topics (the caller checked nothing is in
    flight): the batch begin() would plan now, without planning it."""
    from ledger.core.ports import NextBatch

    source = _source(tpc)
    reads = read_topics(source, source.topics())
    plan = _plan(tpc, tpc.store.positions_by_topic(tpc.app_id), reads)
    if not plan.worth_planning:
        return NextBatch(None)
    return NextBatch((tpc.store.last_batch_id(tpc.app_id) or 0) + 1, plan.ranges)


def check_topics(tpc: TwoPhaseCommit) -> None:
    """TwoPhaseCommit.check_topic on several topics: TopicChangedError naming the first
    topic whose positions cannot be continued (re-created, or no longer read)."""
    source = _source(tpc)
    topics = source.topics()
    positions = tpc.store.positions_by_topic(tpc.app_id)
    check_nothing_left_behind(topics, positions)
    for topic in topics:
        if topic in positions and not positions[topic].retired:
            check_topic_identity(
                topic, positions[topic], source.topic_id_of(topic), name_topic=True
            )


def check_before_stage(tpc: TwoPhaseCommit, batch: Batch) -> None:
    """Every topic the batch was planned on is still that incarnation, and its ranges are
    still in Kafka (invariants 8, 10). Only the batch's own topics are read: the selection
    is not resolved again."""
    source = _source(tpc)
    for topic, read in read_topics(source, _planned_topics(batch)).items():
        check_batch_topic(batch.label, topic, batch.topic_ids.get(topic), read.topic_id)
        check_ranges_readable([r for r in batch.ranges if r.topic == topic], read.available)


def check_after_stage(tpc: TwoPhaseCommit, batch: Batch) -> None:
    """The ids again after the read: the read cannot have crossed into a re-created topic."""
    source = _source(tpc)
    for topic in _planned_topics(batch):
        check_batch_topic(batch.label, topic, batch.topic_ids.get(topic), source.topic_id_of(topic))


def _planned_topics(batch: Batch) -> list[str]:
    """The batch's topics; a batch without an id for one of them was not planned on several
    topics by this code and is refused rather than read on a guess."""
    topics = sorted({r.topic for r in batch.ranges} | set(batch.topic_ids))
    missing = [t for t in topics if t not in batch.topic_ids]
    if missing:
        raise TopicChangedError(
            f"batch {batch.label}: no topic id recorded for {', '.join(missing)}; nothing of it "
            "is voted"
        )
    return topics


def _source(tpc: TwoPhaseCommit) -> TopicsSource:
    source = tpc.source
    assert isinstance(source, TopicsSource)
    return source


def read_fixed(tpc: TwoPhaseCommit, ranges: Sequence[OffsetRange]) -> dict[str, str]:
    """TwoPhaseCommit.begin_fixed on several topics (a backfill over operator-chosen
    ranges): every range's topic read now, its id steady across the read, and every range
    still in Kafka (invariant 8); the id of each topic, which the batch is recorded with
    (invariant 10), so the stage and recovery read exactly those incarnations."""
    reads = read_topics(_source(tpc), sorted({r.topic for r in ranges}))
    for topic, read in reads.items():
        check_ranges_readable([r for r in ranges if r.topic == topic], read.available)
    return {topic: read.topic_id for topic, read in reads.items()}
