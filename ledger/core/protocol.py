"""The commit protocol's pure core: batch states, legal transitions, and offset planning.

Nothing here does I/O. The store (ledger/store/ledger_store.py) persists what this module decides,
the coordinator (ledger/coordinator/two_phase.py) calls the edges (Kafka, Spark, Delta) in the order
this module allows, and each rule below is tested on its own in tests/test_protocol.py.

A batch is one checkpoint in the sense of Flink's two-phase commit (see
docs/protocol.md):

    PLANNED -> STAGED -> PREPARED -> COMMITTED -> ACKED
     ^  \\         \\          |
     |   +---------+--> ABORTED  (only before PREPARED, and never once a batch voted)
     +-----------------------+  re-stage: the vote's files vanished (invariant 11)
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ledger.core.errors import (
    CONFIG_PLACEHOLDER,
    DataLossError,
    InconsistencyError,
    TopicChangedError,
)


class BatchState(enum.StrEnum):
    PLANNED = "PLANNED"
    STAGED = "STAGED"
    PREPARED = "PREPARED"
    COMMITTED = "COMMITTED"
    ACKED = "ACKED"
    ABORTED = "ABORTED"


#: Every legal move. Anything else is a bug or a zombie and is refused.
TRANSITIONS: Mapping[BatchState, frozenset[BatchState]] = {
    BatchState.PLANNED: frozenset({BatchState.STAGED, BatchState.ABORTED}),
    BatchState.STAGED: frozenset({BatchState.PREPARED, BatchState.ABORTED}),
    BatchState.PREPARED: frozenset({BatchState.COMMITTED, BatchState.PLANNED}),
    BatchState.COMMITTED: frozenset({BatchState.ACKED}),
    BatchState.ACKED: frozenset(),
    BatchState.ABORTED: frozenset(),
}

#: Past the vote: the batch must be published, whoever crashed (invariant 5).
MUST_FINISH = frozenset({BatchState.PREPARED, BatchState.COMMITTED})
#: Before the vote: the batch may be abandoned and its range planned again.
ABANDONABLE = frozenset({BatchState.PLANNED, BatchState.STAGED})
#: States whose offset range counts as consumed when the next batch is planned.
HOLDS_RANGE = frozenset(
    {
        BatchState.PLANNED,
        BatchState.STAGED,
        BatchState.PREPARED,
        BatchState.COMMITTED,
        BatchState.ACKED,
    }
)
IN_FLIGHT = frozenset(TRANSITIONS) - {BatchState.ACKED, BatchState.ABORTED}
#: What must finish before the next batch of the same application id is planned: one batch
#: reads at a time, and a vote is published before anything new (invariant 5). A COMMITTED
#: batch is complete; only its advisory ack may be outstanding, and that never holds the
#: pipeline up (the next ack that succeeds catches the group up).
BLOCKS_PLANNING = frozenset({BatchState.PLANNED, BatchState.STAGED, BatchState.PREPARED})
#: Batches the tables hold: the consumer group may be moved to their ends.
PUBLISHED = frozenset({BatchState.COMMITTED, BatchState.ACKED})


#: The one move back: a vote whose staged files vanished before its commit is staged again
#: over the same ranges, under the same batch id, as a new attempt (invariant 11).
RESTAGE_MOVE = (BatchState.PREPARED, BatchState.PLANNED)


def check_transition(
    batch: str, current: BatchState, target: BatchState, *, reason: str | None = None
) -> None:
    """Refuse a move the state machine does not allow (e.g. PREPARED -> ABORTED).

    Protects invariant 5: nothing may abandon a batch that has voted. The one move back
    (RESTAGE_MOVE) needs a `reason`, which the ledger keeps (invariant 11).
    """
    if (current, target) == RESTAGE_MOVE and not reason:
        raise InconsistencyError(
            f"batch {batch}: {current} -> {target} (re-stage) needs a reason: only a vote whose "
            "staged files vanished is staged again"
        )
    if target not in TRANSITIONS[current]:
        raise InconsistencyError(
            f"batch {batch}: illegal transition {current} -> {target}; "
            f"from {current} only {sorted(s.value for s in TRANSITIONS[current]) or 'nothing'} "
            "is allowed"
        )


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Offsets [start, end) of one topic-partition. An empty range (start == end) is valid."""

    topic: str
    partition: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.end < self.start:
            raise InconsistencyError(
                f"{self.topic}-{self.partition}: invalid offset range [{self.start}, {self.end})"
            )

    @property
    def span(self) -> int:
        """Offsets covered; an upper bound on records (markers and compaction leave gaps)."""
        return self.end - self.start

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}[{self.start},{self.end})"

    def as_dict(self) -> dict[str, str | int]:
        """The form stored in commit metadata and shown by `exactly ledger --json`."""
        return {
            "topic": self.topic,
            "partition": self.partition,
            "start": self.start,
            "end": self.end,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OffsetRange:
        return cls(str(data["topic"]), int(data["partition"]), int(data["start"]), int(data["end"]))


@dataclass(frozen=True)
class Available:
    """What Kafka holds for a partition right now, read with isolation.level=read_committed."""

    earliest: int
    last_stable: int


def plan_ranges(
    topic: str,
    positions: Mapping[int, int],
    available: Mapping[int, Available],
    max_records_per_partition: int,
    starting_offsets: str = "earliest",
    *,
    name_topic: bool = False,
) -> list[OffsetRange]:
    """Fix the next batch's range for every partition at one instant.

    `positions` maps partition -> the end offset of the last batch that holds a range (the
    next offset to read). A partition Kafka reports that has no position yet starts at its
    earliest offset, with one exception: `starting_offsets` "latest" is where the pipeline
    starts reading the topic, so while the topic has no position at all its partitions
    start at their last stable offset (older records are then for a fill backfill). A
    partition added to the topic once it is read holds only records produced since, and
    starts at its earliest offset whatever `starting_offsets` says, as Structured Streaming
    and Flink start a newly discovered partition: its last stable offset would skip,
    silently, every record produced to it before this plan saw it.

    Protects: ranges are contiguous with the previous batch (start == stored position, never
    a skip or an overlap); `end` never passes the last stable offset, so an open transaction
    is never half-read; data that retention deleted before we read it is a loud error, never
    a silent skip (invariant 8).
    """
    if max_records_per_partition <= 0:
        raise InconsistencyError(
            f"max_records_per_partition must be positive, got {max_records_per_partition}"
        )
    vanished = sorted(set(positions) - set(available))
    if vanished:
        raise InconsistencyError(
            f"topic {topic}: partitions {vanished} have committed offsets in the ledger but "
            "no longer exist in Kafka (was the topic deleted and re-created?)"
        )
    from_latest = starting_offsets == "latest" and not positions
    ranges = []
    for partition in sorted(available):
        avail = available[partition]
        first = avail.last_stable if from_latest else avail.earliest
        start = positions.get(partition, first)
        check_readable(topic, partition, start, avail, name_topic=name_topic)
        end = min(avail.last_stable, start + max_records_per_partition)
        ranges.append(OffsetRange(topic, partition, start, end))
    return ranges


def check_readable(
    topic: str, partition: int, start: int, avail: Available, *, name_topic: bool = False
) -> None:
    """The stored position must still be in Kafka and not beyond what Kafka has.

    Protects invariant 8 (no silent loss) and catches a topic that was truncated or
    re-created under the same name, where stored and available offsets disagree. With
    `name_topic` (a pipeline on several topics) the skip command names the topic.
    """
    which = f"--topic {topic} " if name_topic else ""
    if start < avail.earliest:
        raise DataLossError(
            f"{topic}-{partition}: offsets [{start}, {avail.earliest}) are no longer in Kafka "
            f"(earliest available is {avail.earliest}; retention or deletion removed them "
            "before they were committed). Skipping them needs an explicit operator decision: "
            f"exactly skip lost-offsets -c {CONFIG_PLACEHOLDER} {which}--partition {partition} "
            "--reason '...'"
        )
    if start > avail.last_stable:
        raise InconsistencyError(
            f"{topic}-{partition}: stored offset {start} is past the partition's last stable "
            f"offset {avail.last_stable}: the topic was truncated or re-created"
        )


def check_ranges_readable(
    ranges: Iterable[OffsetRange], available: Mapping[int, Available]
) -> None:
    """Before staging: every planned range must still be fully in Kafka (invariant 8)."""
    for rng in ranges:
        avail = available.get(rng.partition)
        if avail is None:
            raise DataLossError(f"{rng}: partition {rng.partition} no longer exists in Kafka")
        if rng.span and rng.start < avail.earliest:
            raise DataLossError(
                f"{rng}: offsets [{rng.start}, {min(avail.earliest, rng.end)}) are no longer "
                f"in Kafka (earliest available is {avail.earliest}); the batch cannot be "
                "staged and nothing was committed"
            )


def positions_after(ranges: Iterable[OffsetRange]) -> dict[int, int]:
    """The next offset to read per partition once these ranges are consumed."""
    return {r.partition: r.end for r in ranges}


def check_contiguous(
    previous: Mapping[int, int], ranges: Iterable[OffsetRange], batch: str
) -> None:
    """Stored vs. requested offsets: a new range must start exactly where the last one ended.

    Protects invariant 1: a gap loses records, an overlap duplicates them.
    """
    for rng in ranges:
        stored = previous.get(rng.partition)
        if stored is not None and stored != rng.start:
            kind = "skips" if rng.start > stored else "overlaps"
            raise InconsistencyError(
                f"batch {batch}: {rng} {kind} committed data: the stored offset for "
                f"{rng.topic}-{rng.partition} is {stored}, the requested start is {rng.start}"
            )


def is_empty(ranges: Iterable[OffsetRange]) -> bool:
    return all(r.span == 0 for r in ranges)


def worth_planning(
    ranges: Iterable[OffsetRange], positions: Mapping[int, int], starting_offsets: str
) -> bool:
    """A batch is worth committing if it reads something, or, with starting offsets
    "latest", if it pins where the pipeline starts reading a topic it has no position in
    (otherwise the start would keep moving with the topic's end and skip what arrives
    meanwhile). A partition added later starts at its earliest offset (`plan_ranges`),
    which does not move with what arrives: it needs no batch of its own."""
    ranges = list(ranges)
    if not is_empty(ranges):
        return True
    return starting_offsets == "latest" and not positions and bool(ranges)


@dataclass(frozen=True)
class Owner:
    """Who runs an attempt: enough to tell whether it can still be alive.

    A pid is reused once its process exits, so the owner also records when its process
    started (`started`: on Linux field 22 of /proc/PID/stat, clock ticks since boot) and
    the boot it started in (`boot`: /proc/sys/kernel/random/boot_id), where the host can
    tell (ledger/host/process.py). Stored in the ledger as `host:pid@started/boot`; owners
    recorded before exactly stored start times read back as `host:pid` with both None.
    """

    host: str
    pid: int
    started: int | None = None
    boot: str | None = None

    def __str__(self) -> str:
        text = f"{self.host}:{self.pid}"
        if self.started is not None:
            text += f"@{self.started}"
        if self.boot is not None:
            text += f"/{self.boot}"
        return text

    @classmethod
    def parse(cls, text: str) -> Owner:
        # The host may hold ':' (the last one ends it); what follows holds none.
        host, _, tail = text.rpartition(":")
        pid_started, _, boot = tail.partition("/")
        pid, _, started = pid_started.partition("@")
        return cls(host, int(pid), int(started) if started else None, boot or None)

    def same_process(self, other: Owner) -> bool:
        """Whether the two may name one process: the same host and pid, and the same start
        time and boot wherever both record them (an owner recorded before start times were
        stored is taken at its pid, as it always was)."""
        if (self.host, self.pid) != (other.host, other.pid):
            return False
        if None not in (self.started, other.started) and self.started != other.started:
            return False
        return None in (self.boot, other.boot) or self.boot == other.boot


def owner_may_be_alive(
    owner: Owner,
    heartbeat_age_s: float,
    lease_s: float,
    this_host: str,
    pid_alive: bool,
) -> bool:
    """Whether a PLANNED/STAGED attempt may still be running and must not be abandoned yet.

    On the same host the process table answers exactly (`pid_alive`: a process runs with
    the owner's pid, is not a zombie, and started when and in the boot the owner recorded;
    ledger/host/process.py), and no lease applies; elsewhere the heartbeat lease does.
    Abandoning a live attempt is still safe (fencing stops it at its next transition), but it
    wastes its work and two processes could abandon each other forever.
    """
    if owner.host == this_host:
        return pid_alive
    return heartbeat_age_s < lease_s


# -- topic identity (invariant 10) ---------------------------------------------------------


class Positions(dict[int, int]):
    """The next offset to read per partition, and which topic incarnation they belong to.

    A dict of the offsets, so planners that only need those read it as one. `topic` and
    `topic_id` are the name and Kafka's id (KIP-516) of the topic the positions were read
    from; `topic_id` is None when nothing recorded it (a ledger written before topic ids,
    or no position at all). `decisions` are the operator decisions (ledger/core/decisions.py)
    the positions were moved by since the last batch that holds a range: the next batch's
    commit carries them. `retired`: a topic the pipeline stopped reading by an operator's
    `retire-topic` decision; the offsets are where it was left, kept so that the same
    incarnation read again continues there (ledger/core/topic_plan.py).
    """

    def __init__(
        self,
        offsets: Mapping[int, int] | Iterable[tuple[int, int]] = (),
        *,
        topic: str | None = None,
        topic_id: str | None = None,
        decisions: Iterable[Any] = (),
        retired: bool = False,
    ) -> None:
        super().__init__(offsets)
        self.topic = topic
        self.topic_id = topic_id
        self.decisions: tuple[Any, ...] = tuple(decisions)
        self.retired = retired


def accept_topic_command(topic_id: str, topic: str | None = None) -> str:
    """The operator's way forward when the topic changed: the exact command to run. A
    pipeline on several topics names the one (`topic`); one on a single topic need not."""
    which = f"--topic {topic} " if topic else ""
    return (
        f"exactly skip new-topic -c {CONFIG_PLACEHOLDER} {which}--topic-id {topic_id} "
        "--reason '...'"
    )


def check_topic_identity(
    topic: str, positions: Positions, current_id: str, *, name_topic: bool = False
) -> bool:
    """Stored positions may only be continued on the topic incarnation they were read from.

    Returns True when the positions carry no topic id yet (written before exactly stored
    ids): the caller adopts `current_id` and records that it did. Raises TopicChangedError
    when the ids differ: the offsets of a deleted and re-created topic, or of another topic
    the config now names, mean nothing on this one, and continuing from them would skip
    its first records (invariant 10). Positions that are all unset start fresh.
    """
    if positions.topic_id is None:
        return bool(positions)
    if positions.topic_id == current_id:
        return False
    read_from = positions.topic or topic
    raise TopicChangedError(
        f"topic {topic}: Kafka's topic {topic} has id {current_id}, but the ledger's "
        f"positions were read from topic {read_from} with id {positions.topic_id} (the topic "
        "was deleted and re-created, or the config points at another topic); nothing was "
        "planned. To read the new topic from its starting offsets and keep the old positions "
        "as history, record the decision: "
        f"{accept_topic_command(current_id, topic if name_topic else None)}"
    )


def check_batch_topic(label: str, topic: str, planned_id: str | None, current_id: str) -> None:
    """A planned batch is read from the topic incarnation it was planned on, or not at all.

    Checked right before staging and again after it, so the read can neither start on nor
    cross into a re-created topic of the same name: ids are never reused, so the same id
    before and after means the same incarnation throughout (invariant 10).
    """
    if planned_id == current_id:
        return
    planned = planned_id or "no recorded id (planned before exactly stored topic ids)"
    raise TopicChangedError(
        f"batch {label}: planned on topic {topic} with id {planned}, but Kafka's topic "
        f"{topic} now has id {current_id}; nothing of it is voted. Run again: the batch is "
        "abandoned, and planning names the decision the new topic needs"
    )


def check_topic_steady(topic: str, before: str, after: str) -> None:
    """The topic id read before and after a batch's offsets must agree: otherwise the
    offsets may belong to either incarnation (invariant 10)."""
    if before != after:
        raise TopicChangedError(
            f"topic {topic} changed while its offsets were read (id {before}, then {after}): "
            "it was deleted and re-created just now; nothing was planned; run again"
        )
