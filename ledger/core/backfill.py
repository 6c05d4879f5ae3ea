"""Backfills: which offset ranges an operator may fill or replace, decided from the ledger.

A backfill is a batch of its own kind (BatchKind.BACKFILL) under its own application id
(`<pipeline>.backfill`), so its Delta transaction versions never collide with the live
pipeline's; this module decides whether the requested ranges are allowed:

- fill ingests offsets nothing covers yet. Offsets at or past the live pipeline's position
  belong to the live pipeline (it will read them), so a fill may only cover offsets below
  where the live pipeline started, and never what another fill already covers.
- replace reprocesses offsets that are already committed (by the live pipeline or a fill):
  their rows are removed and the new ones added in one Delta transaction. Offsets nobody
  committed cannot be replaced: there is nothing to replace, and adding them would
  duplicate what the live pipeline reads later. Nor can offsets of a batch that is planned
  but has not committed (PLANNED, STAGED, PREPARED): its rows are not in the table yet, so
  the replace would remove nothing there and the batch would add them afterwards, a second
  copy. Such a replace is refused, naming the batch, until it has committed.

The rules are pure functions of the batches they are given, so each can be tested alone;
`plan_backfill` (ledger/coordinator/backfill.py) is the I/O: it finishes earlier backfills
and plans the batch through the coordinator, which runs the rules inside the planning
transaction, under the lock every planner of the pipeline takes (live or backfill). A live
plan or another fill can therefore never slip in between the check and the insert.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ledger.core.batch import BACKFILL_SUFFIX, Batch, BatchKind
from ledger.core.errors import ExactlyError, RefusedBatchError
from ledger.core.protocol import HOLDS_RANGE, BatchState, OffsetRange


class BackfillMode(enum.StrEnum):
    FILL = "fill"
    REPLACE = "replace"


class BackfillError(ExactlyError):
    """The requested ranges conflict with what is committed; nothing was planned."""


def backfill_app_id(pipeline: str) -> str:
    """The application id of a pipeline's backfills; no pipeline is named like it
    (resources/config/pipeline_config.py refuses names ending in BACKFILL_SUFFIX)."""
    return f"{pipeline}{BACKFILL_SUFFIX}"


#: The table holds the rows of batches in these states.
IN_TABLE = frozenset({BatchState.COMMITTED, BatchState.ACKED})


@dataclass(frozen=True)
class Covered:
    """One interval of one partition that a batch holds, with the batch and its state."""

    start: int
    end: int
    label: str
    state: BatchState

    @property
    def in_table(self) -> bool:
        """Whether the batch's rows are in the table (it committed)."""
        return self.state in IN_TABLE


def coverage(batches: Iterable[Batch]) -> dict[tuple[str, int], list[Covered]]:
    """Held intervals per (topic, partition): live batches and fill backfills that were not
    abandoned, committed or still in flight (`Covered.in_table` tells). Replace backfills
    add nothing: they rewrite what is already covered."""
    found: dict[tuple[str, int], list[Covered]] = {}
    for batch in batches:
        if batch.state is BatchState.ABORTED:
            continue
        if batch.kind == BatchKind.BACKFILL and batch.params.get("mode") != BackfillMode.FILL:
            continue
        label = f"{batch.app_id}/{batch.batch_id}"
        for r in batch.ranges:
            if r.span:
                found.setdefault((r.topic, r.partition), []).append(
                    Covered(r.start, r.end, label, batch.state)
                )
    for intervals in found.values():
        intervals.sort(key=lambda c: (c.start, c.end))
    return found


def live_positions(batches: Iterable[Batch], live_app_id: str) -> dict[tuple[str, int], int]:
    """Where the live pipeline reads next, per (topic, partition): the ends of its newest
    batch that holds a range (in flight or committed), as `LedgerStore.positions` reads
    them, but from the same batches the rules are checked against."""
    holding = [b for b in batches if b.app_id == live_app_id and b.state in HOLDS_RANGE]
    if not holding:
        return {}
    newest = max(holding, key=lambda b: b.batch_id)
    return {(r.topic, r.partition): r.end for r in newest.ranges}


def normalize(ranges: Sequence[OffsetRange]) -> list[OffsetRange]:
    """Sorted, non-empty, and not overlapping each other."""
    ordered = sorted(ranges)
    if not ordered:
        raise BackfillError("a backfill needs at least one offset range")
    for r in ordered:
        if r.span == 0:
            raise BackfillError(f"{r}: an empty range backfills nothing")
    for a, b in itertools.pairwise(ordered):
        if (a.topic, a.partition) == (b.topic, b.partition) and b.start < a.end:
            raise BackfillError(f"requested ranges {a} and {b} overlap each other")
    return ordered


def check_fill(
    ranges: Sequence[OffsetRange],
    covered: Mapping[tuple[str, int], list[Covered]],
    live_positions: Mapping[tuple[str, int], int],
) -> None:
    """A fill may only cover offsets no batch holds, committed or in flight, and the live
    pipeline will never read (below its position). Protects invariant 1: two batches
    that read the same offsets would both add their rows."""
    for r in normalize(ranges):
        key = (r.topic, r.partition)
        if key not in live_positions:
            raise BackfillError(
                f"fill {r}: the live pipeline has not read partition {r.partition} yet and "
                "will start there on its own; run it first, then fill what lies before"
            )
        for c in covered.get(key, []):
            if r.start < c.end and c.start < r.end:
                lo, hi = max(r.start, c.start), min(r.end, c.end)
                overlap = f"[{lo}, {hi}) of {r.topic}-{r.partition}"
                if c.in_table:
                    raise BackfillError(
                        f"fill {r} overlaps committed data: batch {c.label} covers {overlap}; "
                        "fill only offsets no batch covers, or replace committed ones"
                    )
                raise BackfillError(
                    f"fill {r} overlaps batch {c.label} ({c.state}, not committed yet), which "
                    f"holds {overlap}: those offsets are that batch's to read"
                )
        if r.end > live_positions[key]:
            raise BackfillError(
                f"fill {r}: offsets from {live_positions[key]} on belong to the live pipeline, "
                "which reads them on its own; fill only offsets before that"
            )


def check_replace(
    ranges: Sequence[OffsetRange],
    covered: Mapping[tuple[str, int], list[Covered]],
    refusals: Sequence[str] = (),
) -> None:
    """Every offset of a replace must be committed already (by live batches or fills), and
    no batch over them may be in flight. Protects invariant 1: the rows of a batch that has
    not committed are not in the table yet, so the replace would remove nothing there and
    the batch would add them after it, a second copy.

    A derived output that a replace cannot keep right refuses it up front: `refusals` are
    the reasons the pipeline's outputs give (resources/config/derived_spec.py
    `replace_refusal`: min/max, an aggregate without a count, PostgreSQL); counts, sums and
    upserts follow a replace by a correction (jobs/publish/delta_publisher.py)."""
    if refusals:
        normalize(ranges)
        raise BackfillError("; ".join(refusals))
    for r in normalize(ranges):
        for c in covered.get((r.topic, r.partition), []):
            if not c.in_table and r.start < c.end and c.start < r.end:
                raise BackfillError(
                    f"replace {r}: batch {c.label} is {c.state} and holds "
                    f"[{max(r.start, c.start)}, {min(r.end, c.end)}) of {r.topic}-{r.partition}, "
                    "but has not committed: its rows are not in the table yet, so the replace "
                    "would remove nothing there and the batch would add them afterwards, a "
                    "second copy. Let it commit (or run `exactly recover`), then replace again"
                )
    for r in normalize(ranges):
        cursor = r.start
        for c in covered.get((r.topic, r.partition), []):
            if not c.in_table or c.end <= cursor or c.start >= r.end:
                continue
            if c.start > cursor:
                break
            cursor = max(cursor, c.end)
        if cursor < r.end:
            raise BackfillError(
                f"replace {r}: offsets [{cursor}, {r.end}) of {r.topic}-{r.partition} are not "
                "committed, so there is nothing to replace (use --mode fill for offsets before "
                "the live pipeline's start)"
            )


def check_replace_keeps(lost: int, first: tuple[str, int, int] | None) -> None:
    """A replace removes every row its ranges hold and adds the rows it staged, so a row
    held whose record it did not stage again would be deleted with nothing in its place:
    `lost` such rows, `first` the lowest one's (topic, partition, offset).

    The stage reads the ranges from Kafka and stages every record it read exactly once
    (invariant 13), so such a row is a record Kafka no longer holds: a compacted topic's
    log cleaner keeps only the newest record of each key, at any offset behind the active
    segment, without moving the partition's earliest offset (which is how retention's
    losses are caught when the replace is planned). Deleting those rows would lose records
    the table committed (invariant 1) for a replace that meant to rewrite them. Raised
    before the vote, so the replace is abandoned and nothing changes.
    """
    if lost:
        topic, partition, offset = first or ("?", -1, -1)
        raise RefusedBatchError(
            f"the replace would delete {lost} row(s) whose records Kafka no longer "
            f"holds, e.g. {topic}-{partition}@{offset} (a compacted topic's log cleaner "
            "removed them after they were committed), and put nothing in their place; "
            "replace ranges whose records Kafka still holds, or leave these rows as they are"
        )


def check_one_incarnation(
    ranges: Sequence[OffsetRange], batches: Iterable[Batch], topic_id: str | Mapping[str, str]
) -> None:
    """A replace may not touch offsets committed from another incarnation of the topic.

    Rows carry their coordinates (topic name, partition, offset), not the topic's id, and
    a replace removes rows by coordinates: after a re-created topic was accepted, the same
    coordinates may name a record of each incarnation, and the replace would remove the old
    one with the new (invariant 10). Batches recorded before topic ids count as the current
    incarnation: nothing says otherwise. `topic_id` is the topic's id now, or each topic's
    for a pipeline on several topics (whose batches record one id per topic).
    """
    for r in normalize(ranges):
        now = topic_id if isinstance(topic_id, str) else topic_id[r.topic]
        for batch in batches:
            held = batch.topic_ids.get(r.topic) if batch.topic_ids else batch.topic_id
            if batch.state is BatchState.ABORTED or held in (None, now):
                continue
            for c in batch.ranges:
                if (c.topic, c.partition) == (r.topic, r.partition) and (
                    r.start < c.end and c.start < r.end
                ):
                    raise BackfillError(
                        f"replace {r}: offsets [{max(r.start, c.start)}, {min(r.end, c.end)}) "
                        f"were committed by batch {batch.app_id}/{batch.batch_id} from an "
                        f"earlier incarnation of topic {r.topic} (id {held}, now "
                        f"{now}); their rows cannot be told from the new topic's, so "
                        "replace cannot remove only the ones it means"
                    )


def check_request(
    mode: BackfillMode,
    ranges: Sequence[OffsetRange],
    batches: Iterable[Batch],
    live_app_id: str,
    topic_id: str | Mapping[str, str],
    refusals: Sequence[str] = (),
) -> None:
    """The rules of `mode` against every batch of the pipeline (live and backfill), as the
    planning transaction read them, on the topic incarnation `topic_id`; `refusals` are the
    reasons the pipeline's derived outputs refuse a replace."""
    batches = list(batches)
    covered = coverage(batches)
    if mode is BackfillMode.FILL:
        check_fill(ranges, covered, live_positions(batches, live_app_id))
    else:
        check_replace(ranges, covered, refusals)
        check_one_incarnation(ranges, batches, topic_id)


def params_for(mode: BackfillMode, ranges: Sequence[OffsetRange], transform: str) -> dict:
    """What identifies a backfill: repeating the same request is a no-op."""
    return {
        "mode": str(mode),
        "transform": transform,
        "ranges": [[r.topic, r.partition, r.start, r.end] for r in normalize(ranges)],
    }
