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
  duplicate what the live pipeline reads later.

The rules are pure functions of the batches and positions they are given, so each can be
tested alone; `plan_backfill`, at the end, is the one function with I/O: it reads the
ledger, finishes earlier backfills and plans the batch through the coordinator.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ledger.batch import Batch, BatchKind
from ledger.errors import ExactlyError
from ledger.protocol import BatchState, OffsetRange, check_topic_identity
from ledger.two_phase import TwoPhaseCommit


class BackfillMode(enum.StrEnum):
    FILL = "fill"
    REPLACE = "replace"


class BackfillError(ExactlyError):
    """The requested ranges conflict with what is committed; nothing was planned."""


def backfill_app_id(pipeline: str) -> str:
    return f"{pipeline}.backfill"


@dataclass(frozen=True)
class Covered:
    """One committed interval of one partition, with who committed it."""

    start: int
    end: int
    label: str


def coverage(batches: Iterable[Batch]) -> dict[tuple[str, int], list[Covered]]:
    """Committed intervals per (topic, partition): live batches and fill backfills that were
    not abandoned. Replace backfills add nothing: they rewrite what is already covered."""
    found: dict[tuple[str, int], list[Covered]] = {}
    for batch in batches:
        if batch.state is BatchState.ABORTED:
            continue
        if batch.kind == BatchKind.BACKFILL and batch.params.get("mode") != BackfillMode.FILL:
            continue
        label = f"{batch.app_id}/{batch.batch_id}"
        for r in batch.ranges:
            if r.span:
                found.setdefault((r.topic, r.partition), []).append(Covered(r.start, r.end, label))
    for intervals in found.values():
        intervals.sort(key=lambda c: (c.start, c.end))
    return found


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
    """A fill may only cover offsets no committed batch covers and the live pipeline will
    never read (below its first start)."""
    for r in normalize(ranges):
        key = (r.topic, r.partition)
        if key not in live_positions:
            raise BackfillError(
                f"fill {r}: the live pipeline has not read partition {r.partition} yet and "
                "will start there on its own; run it first, then fill what lies before"
            )
        for c in covered.get(key, []):
            if r.start < c.end and c.start < r.end:
                raise BackfillError(
                    f"fill {r} overlaps committed data: batch {c.label} covers "
                    f"[{max(r.start, c.start)}, {min(r.end, c.end)}) of {r.topic}-{r.partition}"
                )
        if r.end > live_positions[key]:
            raise BackfillError(
                f"fill {r}: offsets from {live_positions[key]} on belong to the live pipeline"
            )


def check_replace(
    ranges: Sequence[OffsetRange], covered: Mapping[tuple[str, int], list[Covered]]
) -> None:
    """Every offset of a replace must be committed already (by live batches or fills)."""
    for r in normalize(ranges):
        cursor = r.start
        for c in covered.get((r.topic, r.partition), []):
            if c.end <= cursor or c.start >= r.end:
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


def check_one_incarnation(
    ranges: Sequence[OffsetRange], batches: Iterable[Batch], topic_id: str
) -> None:
    """A replace may not touch offsets committed from another incarnation of the topic.

    Rows carry their coordinates (topic name, partition, offset), not the topic's id, and
    a replace removes rows by coordinates: after a re-created topic was accepted, the same
    coordinates may name a record of each incarnation, and the replace would remove the old
    one with the new (invariant 10). Batches recorded before topic ids count as the current
    incarnation: nothing says otherwise.
    """
    for r in normalize(ranges):
        for batch in batches:
            if batch.state is BatchState.ABORTED or batch.topic_id in (None, topic_id):
                continue
            for c in batch.ranges:
                if (c.topic, c.partition) == (r.topic, r.partition) and (
                    r.start < c.end and c.start < r.end
                ):
                    raise BackfillError(
                        f"replace {r}: offsets [{max(r.start, c.start)}, {min(r.end, c.end)}) "
                        f"were committed by batch {batch.app_id}/{batch.batch_id} from an "
                        f"earlier incarnation of topic {r.topic} (id {batch.topic_id}, now "
                        f"{topic_id}); their rows cannot be told from the new topic's, so "
                        "replace cannot remove only the ones it means"
                    )


def params_for(mode: BackfillMode, ranges: Sequence[OffsetRange], transform: str) -> dict:
    """What identifies a backfill: repeating the same request is a no-op."""
    return {
        "mode": str(mode),
        "transform": transform,
        "ranges": [[r.topic, r.partition, r.start, r.end] for r in normalize(ranges)],
    }


# -- the I/O: read the ledger, then plan ------------------------------------------------


def plan_backfill(
    tpc: TwoPhaseCommit,
    *,
    live_app_id: str,
    mode: BackfillMode,
    ranges: Sequence[OffsetRange],
    transform: str,
    again: bool = False,
) -> tuple[Batch, bool]:
    """Plan a backfill batch after checking it is allowed; (batch, planned_now).

    A request identical to a committed backfill is not planned again (repeating a finished
    backfill does nothing) unless `again`; the earlier batch is returned instead. Voted
    backfill batches are finished first, as for live batches.
    """
    params = params_for(mode, ranges, transform)
    tpc.recover_and_commit()
    # the live positions that decide what a backfill may take belong to one incarnation
    # of the topic; on another they mean nothing (invariant 10)
    topic_id = tpc.read_topic()[0]
    check_topic_identity(tpc.source.topic, tpc.store.positions(live_app_id), topic_id)
    earlier = tpc.store.batches(app_id=tpc.app_id, states=[BatchState.COMMITTED, BatchState.ACKED])
    if not again:
        for batch in earlier:
            if {k: batch.params.get(k) for k in params} == params:
                return batch, False
    if again:
        params["again"] = len(earlier) + 1
    everything = [*tpc.store.batches(app_id=live_app_id), *tpc.store.batches(app_id=tpc.app_id)]
    covered = coverage(everything)
    ordered = normalize(ranges)
    if mode is BackfillMode.FILL:
        topics = {r.topic for r in ordered}
        live = {
            (topic, p): end
            for topic in topics
            for p, end in tpc.store.positions(live_app_id).items()
        }
        check_fill(ordered, covered, live)
    else:
        check_replace(ordered, covered)
        check_one_incarnation(ordered, everything, topic_id)
    return tpc.begin_fixed(ordered, params), True
