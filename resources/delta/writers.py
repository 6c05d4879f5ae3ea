"""Who else commits batches into a table: asked of the snapshot a first commit goes onto.

A pipeline's start refuses tables another pipeline fills from a topic it reads
(ledger/coordinator/table_history.py), but it reads them as they were when the process
started: a copy of a config started while the first pipeline's first batch was still
staging found them empty, staged the same records, and committed them a second time. So the
first commit of an application id into a table asks again, of the very snapshot the commit
goes onto (resources/delta/commit.py commits it with no retry onto a newer one): of two such
first commits the one that lands second has read the other's, and is refused
(ledger/core/other_writers.py `first_commit_refusal`).

Only while no application id of the pipeline holds a batch in the table is it asked: once
one does, that one's first commit (or the start) asked it, and any other pipeline arriving
since is refused at its own first commit, which reads this one's batches. The log entries
are read through boto3 (storage.read_bytes: delta-rs's log reads hold the GIL while they
wait for the store, and the process's heartbeat is another thread), newest first, down to
the first one log retention removed (what only rows still say is the start's question,
`unattributed_rows_refusal`). One process keeps what it read of each table (`WritersSeen`,
on the DeltaTarget) and reads only the entries after it; a table re-created since (another
table id) or gone back below what was read is read whole again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from ledger.core.batch import BACKFILL_SUFFIX
from ledger.core.other_writers import first_commit_refusal
from resources.delta.log import commit_info, entry_uri, exactly_metadata, seen_writer
from resources.delta.options import store_failure
from resources.object_storage import storage


@dataclass
class WritersSeen:
    """Every application id's exactly batches one process read in a table's log: its
    pipeline, newest batch id and topics (resources/delta/log.py `other_writers`), through
    log version `upto` of the table whose metadata id is `table_id`."""

    table_id: str | None = None
    upto: int = -1
    found: dict[str, dict[str, Any]] = field(default_factory=dict)

    def through(self, table: DeltaTable, uri: str) -> Mapping[str, Mapping[str, Any]]:
        """The writers of `table`'s log through its snapshot's version."""
        table_id, version = table.metadata().id, table.version()
        if table_id != self.table_id or version < self.upto:
            self.table_id, self.upto, self.found = table_id, -1, {}
        for at in range(version, self.upto, -1):
            entry = storage.read_bytes(entry_uri(uri, at))
            if entry is None:
                break  # removed by log retention, and every entry before it too
            seen_writer(self.found, exactly_metadata(commit_info(entry)), at)
        self.upto = version
        return self.found


def refuse_other_writers(
    seen: WritersSeen, table: DeltaTable, uri: str, app_id: str, metadata: Mapping[str, Any]
) -> None:
    """Before the first commit of `app_id` into `table` (the snapshot the commit goes
    onto): refuse it when the log holds another pipeline's batches of a topic the batch
    read. Every application id of the pipeline itself (live, backfill, a derived
    output's) is its history, not another writer: told by the pipeline its commits name.
    A log that cannot be read is the store's failure, in the store's one line."""
    pipeline = str(metadata.get("pipeline") or app_id)
    if any(table.transaction_version(s) is not None for s in _siblings(app_id, pipeline)):
        return  # the pipeline is there already: module docstring
    try:
        found = seen.through(table, uri)
    except (DeltaError, OSError) as exc:
        raise store_failure(uri, exc) from exc
    others = {
        other: writer
        for other, writer in found.items()
        if other != app_id and (writer.get("pipeline") or other) != pipeline
    }
    refusal = first_commit_refusal({**metadata, "app_id": app_id}, uri, others)
    if refusal is not None:
        raise refusal


class _Target(Protocol):
    """A DeltaTarget, as `refuse_before_publish` needs it."""

    uri: str
    writers: WritersSeen

    def load(self) -> DeltaTable | None: ...


def refuse_before_publish(
    target: _Target, app_id: str, metadata: Mapping[str, Any]
) -> DeltaTable | None:
    """`refuse_other_writers` on the data table (`target`) before any output of the batch
    is published: the others go first (jobs/publish/delta_publisher.py), and a PostgreSQL
    output has no log to ask, so without this it took a copy's partial before the data
    table refused the copy. The data table's own commit asks again, without the window.
    Returns the snapshot it read, for the publisher's other checks before any output."""
    table = target.load()
    if table is not None and table.transaction_version(app_id) is None:
        refuse_other_writers(target.writers, table, target.uri, app_id, metadata)
    return table


def _siblings(app_id: str, pipeline: str) -> set[str]:
    """The application ids of `pipeline` that would commit into the same table as `app_id`:
    the live one and the backfills', each with the same derived output's suffix if any
    (resources/config/derived_spec.py `app_id`)."""
    if not app_id.startswith(pipeline):
        return set()
    tail = app_id[len(pipeline) :].removeprefix(BACKFILL_SUFFIX)
    return {pipeline + tail, pipeline + BACKFILL_SUFFIX + tail} - {app_id}
