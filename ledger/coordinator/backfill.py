"""Planning a backfill through the coordinator: the I/O around the pure rules of
ledger/core/backfill.py, which run inside the planning transaction."""

from __future__ import annotations

from collections.abc import Sequence

from ledger.coordinator.topics import reads_several_topics
from ledger.coordinator.two_phase import TwoPhaseCommit
from ledger.core.backfill import BackfillMode, check_request, normalize, params_for
from ledger.core.batch import Batch
from ledger.core.errors import ConfigError
from ledger.core.protocol import BatchState, OffsetRange, check_topic_identity


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
    if reads_several_topics(tpc.source):
        raise ConfigError(
            f"pipeline {tpc.pipeline} reads several topics (kafka.topics or kafka.pattern): "
            "backfills are built for a pipeline on one topic (kafka.topic) only so far"
        )
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
    ordered = normalize(ranges)

    def check(batches: Sequence[Batch]) -> None:
        check_request(mode, ordered, batches, live_app_id, topic_id, replace_refusals)

    return tpc.begin_fixed(ordered, params, check=check), True
