"""Whether a pipeline's data table is the one its batches went to: checked at every start
(recovery) and before every commit, so that no batch is published into a table that lacks
the batches before it (a table deleted under a running process is created again by the next
commit), nor into one another pipeline fills from the same topics.

Both read the tables only through the publisher and the ledger only through the store; the
rule of the second is pure (ledger/core/other_writers.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ledger.coordinator import topics as topics_coordinator
from ledger.core.batch import Batch
from ledger.core.errors import InconsistencyError
from ledger.core.layout import QUARANTINE
from ledger.core.other_writers import (
    another_ledger_refusal,
    shared_topics_refusal,
    unattributed_rows_refusal,
)
from ledger.core.protocol import BatchState

if TYPE_CHECKING:
    from ledger.coordinator.two_phase import TwoPhaseCommit


def refuse_a_table_without_its_batches(tpc: TwoPhaseCommit) -> None:
    """Refuse a data table that lacks the newest batch the ledger has committed.

    The data table is published last, and the ledger says COMMITTED only after it: a table
    without that batch is not the one the batches went to. Deleted (the next commit would
    create it empty), moved, re-created from a backup older than the ledger, or a
    `delta.table_uri` that names another location (a relative path from another folder):
    going on would fill a table that lacks every earlier batch's records, and nothing would
    say so. (delta-spark's RESTORE keeps the app transactions of the versions it takes back,
    so a restored table still holds them here: README, "When the pipeline refuses".)"""
    newest = tpc.store.batches(
        app_id=tpc.app_id, states=(BatchState.COMMITTED, BatchState.ACKED), limit=1
    )
    if not newest or tpc.publisher.table_holds(newest[0]):
        return
    batch = newest[0]
    raise InconsistencyError(
        f"the ledger has batch {batch.label} committed, but the data table at "
        f"{tpc.publisher.table_location()} does not hold it: the table was deleted, moved or "
        "re-created, or delta.table_uri names another location; point "
        "delta.table_uri at the table that holds the pipeline's batches (to start a new "
        "table from the topics' first records, give the pipeline a new ledger.url too)"
    )


def refuse_before_commit(tpc: TwoPhaseCommit, batch: Batch) -> None:
    """Whether `batch` may be published into the data table as it is now: refused, the
    batch waiting voted, when the table lacks the batches before it (deleted under this
    process, the publish would create it again without them) or holds its id with another
    ledger's ranges."""
    refuse_a_table_without_its_batches(tpc)
    refuse_another_ledgers_batch(tpc, batch)


def refuse_another_ledgers_batch(tpc: TwoPhaseCommit, batch: Batch) -> None:
    """Before `batch`'s commit touches any output: refuse it when the data table holds its
    id already with other ranges (ledger/core/other_writers.py `another_ledger_refusal`).

    Cases: the table does not hold the id (the usual commit): one read of its app
    transaction, nothing else. It holds the id with the same ranges (this batch committed
    before a crash, the ledger not told): the commit goes on and is idempotent. It holds it
    with other ranges: another ledger's batch, refused here, before the quarantine or a
    derived output takes this batch's rows; the batch stays voted and the alert and the
    start's line say why. The commit is no longer in the log's newest entries (retention,
    a table far ahead): nothing to compare, the commit goes on as before. What this cannot
    see is two ledgers committing the same id at the same moment: each passes this check
    before the other's data-table commit; the second's publish then finds the id held and asks
    again (two_phase.py `commit`): refused then, its quarantine and derived outputs may hold
    its rows already."""
    if tpc.publisher.table_holds(batch):
        refusal = another_ledger_refusal(
            batch.label,
            tpc.publisher.table_location(),
            batch.ranges,
            tpc.publisher.committed_ranges(batch),
        )
        if refusal is not None:
            raise refusal


def refuse_a_quarantine_without_its_rows(tpc: TwoPhaseCommit) -> None:
    """At a start: refuse a quarantine table that does not hold the newest committed batch
    that quarantined records into it. It is committed only for batches with quarantined
    rows, so its app transaction says little about the others; the newest one with rows
    says whether it is the table those records went to. Missing, it was deleted or moved,
    and the next batch with a malformed record would create it anew; there but without
    that batch, it was dropped and created again (empty, or from an older backup), and
    the next batches would carry on without every record quarantined before. (Under a
    running process, the DeltaTarget that saw it refuses to create it again:
    resources/delta/table.py `ensure_table`.)"""
    newest = tpc.store.newest_with_rows_in(tpc.app_id, QUARANTINE)
    if newest is None:
        return
    missing = tpc.publisher.missing_quarantine()
    if missing is not None:
        raise InconsistencyError(
            f"committed batches of {tpc.app_id} quarantined records into {missing}, but "
            "there is no Delta table there: the quarantine was deleted or moved, or "
            "delta.quarantine_uri names another location; point delta.quarantine_uri at it "
            f"({_EVERY_RECORD})"
        )
    batch = tpc.store.get(tpc.app_id, newest)
    if batch is not None and QUARANTINE not in tpc.publisher.outputs_holding(batch):
        raise InconsistencyError(
            f"batch {batch.label} quarantined records, but the quarantine table at "
            f"{tpc.publisher.quarantine_location()} does not hold batch {batch.batch_id}: it "
            "was dropped and created again, or restored from an older copy; put back the "
            "quarantine that holds the pipeline's batches, or point delta.quarantine_uri at "
            f"it ({_EVERY_RECORD})"
        )


#: Why a quarantine without its rows is refused, and how to drop such rows instead.
_EVERY_RECORD = (
    "every record read is in the table or the quarantine, invariant 1; to drop quarantined "
    "records, delete their rows, not the table"
)


def refuse_other_writers(tpc: TwoPhaseCommit, own_app_ids: Iterable[str]) -> None:
    """Before a pipeline's first commit (its live application id holds no batch in any
    output): refuse tables another application id writes from a topic this one reads (a
    renamed or copied pipeline, ledger/core/other_writers.py), by the commits in their
    logs; and, while none of the pipeline's other application ids (`own_app_ids`: the
    backfills') holds one either, by their rows, for what the logs no longer name."""
    reads = topics_coordinator.topics_read(tpc.source)
    others = tpc.publisher.other_writers()
    if others:
        location = tpc.publisher.table_location()
        refusal = shared_topics_refusal(tpc.pipeline, location, reads, others)
        if refusal is not None:
            raise refusal
    if any(tpc.publisher.committed_version(app_id) is not None for app_id in own_app_ids):
        return
    refusal = unattributed_rows_refusal(tpc.pipeline, tpc.publisher.topics_in_rows(reads))
    if refusal is not None:
        raise refusal
