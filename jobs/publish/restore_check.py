"""Refusing to publish on top of a table restored behind the pipeline (resources/delta/restores.py
says what a RESTORE leaves: the table's application transactions claim batches whose rows
it no longer holds).

A batch a restore took out is back once the table holds rows in its offset ranges again:
the restore undone (restored to the version just before it), or its rows published again.
Until then every batch is refused before the vote (nothing is held, nothing is lost: the
records are still in Kafka and the positions are where the lost batches left them), with
the one action that brings the rows back, and a batch that voted before the restore is
refused at its commit and waits, voted: committed on top of the restored table, its rows
would be taken out again by that very action, which restores the version before the
restore. A batch that added no row to the table (every record quarantined) cannot be told
apart from one restored away, and is not asked about. The raw table and the quarantine are
asked here, by their rows, which carry the batch's coordinates (so a restore that names no
version, delta-spark's TO TIMESTAMP AS OF, is told too); a derived output's rows do not, and
its log alone tells (jobs/publish/derived_outputs.py `restored_reason`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from deltalake import DeltaTable

from jobs.publish.raw_rows import rows_held_in
from ledger.core.errors import InconsistencyError, RefusedBatchError
from ledger.core.protocol import OffsetRange
from resources.delta.table import DeltaTarget


def restore_refusal(
    target: DeltaTarget, own: Collection[str], table: DeltaTable | None = None
) -> str | None:
    """Why `target` cannot take a batch now, restored behind the pipeline of application
    ids `own` with batches of it still missing, or None. `table`: its snapshot as the
    caller just loaded it (a load costs two requests on S3), else loaded here."""
    table = target.load() if table is None else table
    if table is None:
        return None
    for restore in target.restores.through(table, target.uri, own):
        if restore.at in target.restores.resolved:
            continue
        gone = [meta for meta in restore.removed if _gone(table, meta)]
        if not gone:
            target.restores.resolved.add(restore.at)
            continue
        labels = ", ".join(f"{m['app_id']}/{m['batch_id']}" for m in gone)
        return (
            f"table {target.uri} was restored at log version {restore.at} (to version "
            f"{restore.to}), which took out the rows of batch(es) {labels} while its "
            "application transactions still say it holds them: publishing on would lose "
            f"their records for good. Restore it to version {restore.at - 1}, the version "
            "just before that restore, to bring them back (delta-spark: RESTORE TABLE ... "
            f"TO VERSION AS OF {restore.at - 1}){_after(table, restore.at)}; batches wait "
            "until then, nothing is lost"
        )
    return None


def refuse_restored(
    target: DeltaTarget,
    own: Collection[str],
    table: DeltaTable | None = None,
    *,
    voted: bool = False,
) -> None:
    """Refuse while `target` (the quarantine or the data table) is restored behind the
    pipeline (`restore_refusal`): before the vote a RefusedBatchError, which abandons the
    batch; before a voted batch's first commit an InconsistencyError, and it waits, voted
    (resources/delta/features.py's rule)."""
    if (restored := restore_refusal(target, own, table)) is None:
        return
    if voted:
        raise InconsistencyError(f"{restored}; the batch voted before it, and waits")
    raise RefusedBatchError(restored)


def _after(table: DeltaTable, at: int) -> str:
    """What restoring to the version before `at` would also undo: the commits after the
    restore (another writer's, a compaction, a later restore; the pipeline's own are
    refused), said so the operator decides knowing it; empty when the restore is newest."""
    newest = table.version()
    if newest <= at:
        return ""
    return (
        f"; that also undoes log version(s) {at + 1} to {newest}, committed after it "
        "(rows another writer added there must be written again)"
    )


def _gone(table: DeltaTable, meta: Mapping[str, Any]) -> bool:
    """Whether a batch that added rows to the table has none left in its offset ranges."""
    if meta.get("rows_added") == 0:
        return False
    ranges = [OffsetRange.from_dict(r) for r in meta.get("ranges") or ()]
    return rows_held_in(table, ranges) == 0
