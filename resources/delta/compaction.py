"""Compacting a Delta table: delta-rs OPTIMIZE compact, planned again on every lost race.

Its own module because compaction is the one commit to a table that carries no application
transaction: it changes no row and no app's version, so it needs none of the batch commit's
compare-and-set (resources/delta/commit.py), only a fresh plan after a conflict.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from deltalake import CommitProperties
from deltalake.exceptions import CommitFailedError

from ledger.core.errors import InconsistencyError
from resources.delta.commit import Committable
from resources.delta.writer_stats import sound_writer_properties


@dataclass(frozen=True)
class Compaction:
    """What one compaction of a table did."""

    files_removed: int
    files_added: int
    #: the table's version after it (the compaction's commit, when it made one)
    table_version: int
    tries: int


def compacted_text(target: str, done: Compaction | None) -> str:
    """One line for what compacting the output `target` did."""
    if done is None:
        return f"{target}: no table yet, nothing to compact"
    return (
        f"{target}: {done.files_removed} files merged into {done.files_added} "
        f"(version {done.table_version}, {done.tries} tries)"
    )


def compact(target: Committable, max_tries: int = 20) -> Compaction | None:
    """Merge the table's small files (delta-rs OPTIMIZE compact); None without a table.

    Safe beside commits (docs/protocol.md, invariants 1 and 2): the commit changes no
    row (dataChange false) and no application transaction, so every app's version, and
    with it the idempotence of a batch's commit, is as before. Its new files are written
    at the table's root, never under `staged/`, so the cleaner never lists them; the
    files it removes stay in the log as tombstones, which the cleaner keeps (rule 1 of
    ledger/core/cleaning.py). A replace that removed rows from a file this compaction read
    makes its commit fail (Delta's conflict check: a concurrent delete of data it read),
    never resurrect them: the compaction is then planned again from the table as it is,
    here, rather than retried by delta-rs, from a table loaded afresh (a failed commit
    drops the kept table, as in resources/delta/commit.py).
    """
    last_error: Exception | None = None
    for tries in range(1, max_tries + 1):
        table = target.load()
        if table is None:
            return None
        try:
            with target.commit_scope():
                done = table.optimize.compact(
                    # no float bounds for wide decimals (resources/delta/writer_stats.py)
                    writer_properties=sound_writer_properties(table.schema().to_arrow()),
                    commit_properties=CommitProperties(max_commit_retries=0),
                )
        except CommitFailedError as exc:
            last_error = exc
            time.sleep(min(0.05 * tries, 1.0))
            continue
        table.update_incremental()
        return Compaction(
            files_removed=int(done.get("numFilesRemoved", 0)),
            files_added=int(done.get("numFilesAdded", 0)),
            table_version=table.version(),
            tries=tries,
        )
    raise InconsistencyError(
        f"{target.uri}: compaction lost {max_tries} commit races in a row; last error: {last_error}"
    )
