"""Planning a backfill through the coordinator: the I/O around the pure rules of
ledger/core/backfill.py, which run inside the planning transaction."""

from __future__ import annotations

from collections.abc import Sequence

from ledger.coordinator import topics
from ledger.coordinator.topics import reads_several_topics
from ledger.coordinator.two_phase import TwoPhaseCommit
from ledger.core.backfill import BackfillMode, check_request, normalize, params_for
from ledger.core.batch import Batch
from ledger.core.errors import ConfigError
from ledger.core.protocol import BatchState, OffsetRange, Positions, check_topic_identity
from ledger.core.topic_plan import continued


def plan_backfill(
    tpc: TwoPhaseCommit,
    *,
    live_app_id: str,
    mode: BackfillMode,
    ranges: Sequence[OffsetRange],
    transform: str,
    again: bool = False,
    replace_refusals: Sequence[str] = (),
) -> tuple[Batch, bool]:
    """Plan a backfill batch after checking it is allowed; (batch, planned_now).

    A request identical to a committed backfill is not planned again (repeating a finished
    backfill does nothing) unless `again`; the earlier batch is returned instead. Voted
    backfill batches are finished first, as for live batches.

    The rules (`check_request`) run inside the planning transaction, on the batches it
    reads, under the lock every planner of the pipeline takes: a live plan or another fill
    either committed before and is seen, or waits until this plan is recorded and then sees
    it. Checking first and planning after would let both take the same offsets.
    `replace_refusals` are the reasons the pipeline's derived outputs refuse a replace
    (`PipelineConfig.replace_refusals`).
    """
    several = reads_several_topics(tpc.source)
    params = params_for(mode, ranges, transform)
    tpc.recover_and_commit()
    # the live positions that decide what a backfill may take belong to one incarnation
    # of each topic; on another they mean nothing (invariant 10)
    topic_id: str | dict[str, str]
    if several:
        topic_id = _topic_ids(tpc, live_app_id, ranges)
    else:
        topic_id = tpc.read_topic()[0]
        check_topic_identity(tpc.source.topic, tpc.store.positions(live_app_id), topic_id)
    earlier = tpc.store.batches(app_id=tpc.app_id, states=[BatchState.COMMITTED, BatchState.ACKED])
    if not again:
        for batch in earlier:
            if {k: batch.params.get(k) for k in params} == params:
                return batch, False
    if again:
        params["again"] = len(earlier) + 1
    ordered = normalize(ranges)

    if mode is BackfillMode.REPLACE:  # the outputs as they are now may refuse it too
        replace_refusals = [*replace_refusals, *tpc.publisher.replace_refusals()]

    def check(batches: Sequence[Batch]) -> None:
        check_request(mode, ordered, batches, live_app_id, topic_id, replace_refusals)

    return tpc.begin_fixed(ordered, params, check=check), True


def _topic_ids(
    tpc: TwoPhaseCommit, live_app_id: str, ranges: Sequence[OffsetRange]
) -> dict[str, str]:
    """Each range's topic: one the pipeline reads now, on the incarnation its live positions
    were read from (invariant 10); its id, read now."""
    source = tpc.source
    read_now = source.topics()  # type: ignore[union-attr]
    wanted = sorted({r.topic for r in ranges})
    unknown = [t for t in wanted if t not in read_now]
    if unknown:
        raise ConfigError(
            f"pipeline {tpc.pipeline} does not read topic {', '.join(unknown)} now (it reads "
            f"{', '.join(read_now) or 'none'}): a backfill takes offsets of the pipeline's "
            "own topics"
        )
    positions = tpc.store.positions_by_topic(live_app_id)
    ids = {}
    for topic, read in topics.read_topics(source, wanted).items():  # type: ignore[arg-type]
        held = continued(positions.get(topic, Positions(topic=topic)), read.topic_id)
        check_topic_identity(topic, held, read.topic_id)
        ids[topic] = read.topic_id
    return ids
