"""A Delta table location (DeltaTarget): the table kept open between calls, its creation,
and the operations the protocol needs on it, through delta-rs.

The table is the one object every Delta operation of a batch starts from, so it owns what
must hold for all of them: which snapshot is current (a kept table is used only while it can
be vouched for, `load`), how the table is created (partition columns, protocol features),
and its layout against the config's. What a batch does to the table is other modules':
its commit is the compare-and-set of resources/delta/commit.py (docs/protocol.md, invariant
2), the rows a replace removes resources/delta/rewrite.py's, what the log says of past
commits resources/delta/log.py's, compaction resources/delta/compaction.py's.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import DeltaError

from ledger.core.batch import StagedFile
from ledger.core.errors import InconsistencyError
from ledger.core.protocol import OffsetRange
from resources.config.partitioning import (
    PartitionColumn,
    check_layout,
    generation_expressions,
    names,
    with_generation,
)
from resources.delta import log
from resources.delta.commit import CommitOutcome, Try, add_actions, appending, commit_batch
from resources.delta.compaction import Compaction, compact
from resources.delta.features import refuse_replace, refuse_unwritable, replace_refusal
from resources.delta.figures import TableLayout, TableStats, layout_of, stats_of
from resources.delta.held import HeldVersions
from resources.delta.kept import Answers, Kept
from resources.delta.opening import open_table
from resources.delta.options import storage_options_for
from resources.delta.restores import LogWalk, RestoresSeen
from resources.delta.rewrite import remove_rows
from resources.delta.schema import table_widened, with_legacy_features
from resources.delta.writers import WritersSeen
from resources.object_storage import storage

#: Tries of a publish or a replace before its lost races are an error (commit_batch).
_MAX_TRIES = 50


class DeltaTarget:
    """One Delta table location and the operations the protocol needs on it.

    The table is kept open between calls, one delta-rs table per thread (load says why and
    when it is dropped); a DeltaTarget may be shared between threads.
    """

    def __init__(
        self,
        uri: str,
        storage_options: Mapping[str, str] | None = None,
        partition_by: Sequence[PartitionColumn] | None = None,
        *,
        generated: bool = True,
        layout_words: tuple[str, str] = ("delta.partition_by", "give its own, or a new table_uri"),
    ) -> None:
        self.uri = uri
        #: the config field a refused layout names, and what the operator can do about it
        #: (resources/config/partitioning.py `check_layout`)
        self.layout_words = layout_words
        #: whether the partition columns are created as Delta generated columns: not for a
        #: table delta-rs MERGEs into (resources/delta/window_dates.py says why)
        self.generated = generated
        #: the partition columns the config gives this table (a new table is created with
        #: them; an existing one must have them), or None: take the table's as they are
        self.partition_by = None if partition_by is None else tuple(partition_by)
        #: the generated columns a publish of staged files writes right, by the expression
        #: the stage computes them with: the config's partition columns (features.py)
        self.generated_columns = generation_expressions(partition_by or ()) if generated else {}
        self.storage_options = storage_options_for(uri, storage_options or {})
        #: `kept`, `answers`: this thread's Kept and Answers (kept.py). Per thread: a delta-rs
        #: table is not safe to use from two threads at once, and one thread's update or
        #: failed commit must never change the table another thread is deciding on.
        self._local = threading.local()
        #: the newest version a checkpoint was written at by this process, beside the
        #: commits (resources/delta/checkpoints.py): a kept table loaded before it is
        #: loaded afresh, from that checkpoint, or its log replay grows with every commit
        self._checkpointed = -1
        #: whether this object ever read the table: then it never creates it again
        self._existed = False
        self.held = HeldVersions(uri)  # what commits check the table has not gone back on
        self.writers = WritersSeen()  # who else commits there, as read so far (writers.py)
        self.restores = RestoresSeen()  # the restores of its log, as read so far (restores.py)
        self.log_walk = LogWalk()  # its batch commits a restore took out (restores.py)

    def load(self) -> DeltaTable | None:
        """The table's latest snapshot, None if there is no table.

        The table is kept open between calls (one per thread) and brought up to date with
        update_incremental(), which reads only the log entries committed since: a fresh
        load replays the log from the last checkpoint on every call, so a commit's cost
        grew with history (issue 13). The table returned is this thread's kept one: use it
        until the next load, and never time-travel it (stats opens a table of its own).

        An update lists the log even when nothing is new (3 ms at 150 versions, 9 at 3,000
        here), so it runs only when the next version's entry is there: entries are written
        in order, each only if absent, so without it the kept table is the latest; one
        landing just after the look is refused by commit.py's compare-and-set, as ever.

        update_incremental() trusts that the log it continues is the log it read. When the
        table was deleted and created again underneath it, that is false, and it does not
        always say so (tests/test_delta_commit.py):
        - the new table has fewer versions: delta-rs raises (a DeltaError);
        - as many: there is nothing newer to read, and the old snapshot (old files, old
          schema) is returned as current;
        - more: the new table's later entries are replayed on top of the old one's
          files, a mixture of both tables that no fresh load would ever read.
        So a kept table is used only while the log entry of a version it read is still the
        very file it read (storage.fingerprint; a new table writes new files, even at the
        same names). The check comes after the update, so that whatever the update read
        is covered: a new table can write an entry at or past that version only after
        the old entry was deleted, so if the old entry is still there after the update,
        every entry the update read was the old table's. The newest entry's fingerprint,
        taken before that check, is what the next load checks.
        The kept table is dropped, and the table loaded afresh, when:
        - that entry changed or vanished (re-created, deleted, or its log cleaned up
          by retention after the process kept the table for longer than it keeps logs);
        - update_incremental() raised (a DeltaError or OSError: a re-created table, or
          the store failing; a fresh load then says which);
        - a commit through the table raised (`commit_scope`: its outcome, and what delta-rs
          left in the table object, are unknown), or anything else went wrong between.
        This assumes a re-created table is written after the old log was deleted (or at
        least its entry of the kept version), as deleting and creating a table does; a
        tool that overwrote a live table's log in place, file by file, could be read as
        a mixture, as any reader of that table could.

        delta-rs retries the store itself (resources/object_storage/s3.py sizes its budget); a
        failure that outlasts it is an UnreachableError naming the table, one line.
        """
        kept: Kept | None = getattr(self._local, "kept", None)
        if kept is not None and kept.loaded_at < self._checkpointed:
            kept = None  # a checkpoint came since: load from it
        if kept is not None:
            table = self._brought_up_to_date(kept)
            if table is not None:
                return table
        return self._load_fresh()

    def _brought_up_to_date(self, kept: Kept) -> DeltaTable | None:
        """The kept table updated, or None (then dropped) when it cannot be vouched for."""
        self._forget()  # kept again below only once vouched for, whatever is raised
        try:
            if storage.exists(self._log_entry(kept.table.version() + 1)):
                kept.table.update_incremental()
        except (DeltaError, OSError):
            return None
        version = kept.table.version()
        try:
            latest = (
                kept.fingerprint
                if version == kept.version
                else storage.fingerprint(self._log_entry(version))
            )
            unchanged = storage.fingerprint(self._log_entry(kept.version)) == kept.fingerprint
        except OSError:
            return None  # a log entry we cannot read is no proof: a fresh load decides
        if not unchanged or latest is None:
            return None
        self._local.kept = Kept(kept.table, version, latest, kept.loaded_at)
        return kept.table

    def _load_fresh(self) -> DeltaTable | None:
        """A fresh load of the latest snapshot, kept for the next loads if it can be vouched for.

        Its newest log entry is fingerprinted after the load read it, so a table
        re-created in between would be fingerprinted with the new table's entry and its
        old snapshot kept for good. A second fresh load after the fingerprint closes that:
        a table's metadata id is random at creation, so if the second load's id is the
        first's, the table was never replaced between the two, and the entry
        fingerprinted in between is the first load's. This doubles the cost of a fresh
        load, which happens once per thread and after a failure, never per batch. A table
        that cannot be vouched for is returned all the same (it is what a fresh load
        reads, as before tables were kept), and the next load is fresh again.
        """
        self._forget()
        table = self.open_afresh()
        if table is None:
            return None
        version = table.version()
        try:
            fingerprint = storage.fingerprint(self._log_entry(version))
        except OSError:
            return table
        if fingerprint is None:
            return table
        try:
            again = DeltaTable(self.uri, storage_options=self.storage_options or None)
        except (DeltaError, OSError):
            # no proof either way (a table being deleted, a store that fails, a read racing
            # a concurrent commit on a store whose listing lags): the first load stands,
            # unkept, as any fresh load did before tables were kept
            return table
        if again.metadata().id == table.metadata().id:
            self._local.kept = Kept(table, version, fingerprint, version)
        return table

    def checkpointed(self, version: int) -> None:
        """A checkpoint at `version` was written (from another thread): kept tables loaded
        before it are loaded afresh at their next load."""
        self._checkpointed = max(self._checkpointed, version)

    def _forget(self) -> None:
        """Drop this thread's kept table: the next load is fresh."""
        self._local.kept = None

    def open_afresh(self, version: int | None = None) -> DeltaTable | None:
        """A new table object, at `version` or the latest; None if there is no table
        (resources/delta/opening.py says what a failure to open means)."""
        table = open_table(self.uri, self.storage_options, version)
        self._existed = self._existed or table is not None
        return table

    def _log_entry(self, version: int) -> str:
        return log.entry_uri(self.uri, version)

    def transaction_version(self, app_id: str) -> int | None:
        """`app_id`'s last batch id, or None; read once per snapshot (kept.py `Answers`)."""
        if (table := self.load()) is None:
            return None
        self._local.answers = Answers.of(getattr(self._local, "answers", None), table)
        return self._local.answers.transaction_version(app_id)

    def stats(self, app_id: str, version: int | None = None) -> TableStats | None:
        """The table's version, its row count (from the files' statistics) and `app_id`'s
        last batch, as of `version` (default: the latest), so a batch's history shows the
        table it committed, not the table as it is now; None while the table does not exist.
        """
        # time travel on a table of its own: the kept one stays at the latest version
        table = self.load() if version is None else self.open_afresh(version)
        return None if table is None else stats_of(table, app_id)

    def layout(self) -> TableLayout | None:
        """The snapshot's file count and bytes, what compaction brings down; None while the
        table does not exist."""
        table = self.load()
        return None if table is None else layout_of(table)

    def compact(self, max_tries: int = 20) -> Compaction | None:
        """Merge the table's small files (delta-rs OPTIMIZE compact, safe beside commits:
        resources/delta/compaction.py); None without a table."""
        return compact(self, max_tries)

    def check_schema(
        self, schema: pa.Schema, table: DeltaTable | None = None
    ) -> DeltaSchema | None:
        """Refuse (RefusedBatchError) a staged schema this table cannot take (invariant 14),
        or a table whose features exactly cannot honour (resources/delta/features.py).
        `table`: the snapshot the caller just loaded, else loaded here.

        Returns the widened schema the batch's commit will carry, or None when the batch
        fits as it is or the table does not exist yet (its first commit creates it).
        """
        table = self.load() if table is None else table
        if table is None:
            return None
        self._partition_columns(table)  # the layout first: a generated column is one of it
        refuse_unwritable(table, self.uri, voted=False, generated=self.generated_columns)
        return table_widened(table, schema, self.uri)

    def replace_refusal(self) -> str | None:
        """Why a replace cannot commit into this table as it is now, or None (also for a
        table not created yet): resources/delta/features.py `replace_refusal`."""
        table = self.load()
        return None if table is None else replace_refusal(table, self.uri)

    def _partition_columns(self, table: DeltaTable) -> list[str]:
        """The table's partition columns, once checked against the config's: a staged file
        is added under the table's own layout or not at all (resources/config/partitioning.py)."""
        columns = list(table.metadata().partition_columns)
        check_layout(self.uri, columns, self.partition_by, *self.layout_words)
        return columns

    def named_files(self) -> set[str]:
        """Every data file the table's log still names, '/'-separated and relative to the
        table's root, tombstones included (resources/delta/log.py `named_files`). Empty
        while the table does not exist."""
        table = self.load()
        return set() if table is None else log.named_files(table, self.uri)

    def ensure_table(self, schema: pa.Schema) -> None:
        """Create the table with `schema` unless it exists; a concurrent creator wins
        harmlessly. The commit loop (resources/delta/commit.py) calls it before a batch's
        first commit, whichever writer's. Never a table this object has read before: one
        deleted under a running process is created again by no commit of it, which would
        hold that batch without every batch before it."""
        if self._existed and self.load() is None:
            raise InconsistencyError(
                f"the Delta table at {self.uri} was deleted while this process used it; "
                "restore it (a new one would lack every batch committed before)"
            )
        try:
            DeltaTable.create(
                self.uri,
                schema=with_generation(schema, self.partition_by or ())
                if self.generated
                else schema,
                partition_by=names(self.partition_by or ()) or None,
                mode="ignore",
                storage_options=self.storage_options or None,
            )
        except Exception:
            if self.load() is None:
                raise
        table = self.load()
        if table is not None:
            with_legacy_features(table)
            self._forget()  # the table object moved on by a commit of its own: load afresh

    @contextlib.contextmanager
    def commit_scope(self) -> Iterator[None]:
        """Around a commit through the table `load` returned (the commit loop of
        resources/delta/commit.py, compaction): if it raises (whatever the error), the kept
        table is dropped and the next load is fresh, for the reasons commit.py gives."""
        try:
            yield
        except BaseException:
            self._forget()
            raise

    def publish(
        self,
        *,
        app_id: str,
        batch_id: int,
        files: Iterable[StagedFile],
        schema: pa.Schema,
        metadata: Mapping[str, Any],
    ) -> CommitOutcome:
        """Add exactly `files` and the app transaction (app_id, batch_id) in one commit.

        Idempotent: a batch at or below the table's version for `app_id` publishes nothing.
        Protects invariants 1, 2 and 3.
        """
        files = list(files)

        def plan(table: DeltaTable, _try: int) -> Try:
            actions = add_actions(files, self._partition_columns(table))
            return appending(table, actions, schema, self)

        return self._commit(app_id, batch_id, schema, metadata, plan)

    def replace(
        self,
        *,
        app_id: str,
        batch_id: int,
        files: Iterable[StagedFile],
        schema: pa.Schema,
        metadata: Mapping[str, Any],
        ranges: Sequence[OffsetRange],
        rewrite_dir: str,
    ) -> CommitOutcome:
        """In one commit: remove every row whose coordinates fall in `ranges` and add `files`.

        Rows are removed by predicate, not by file: a file that also holds rows outside the
        ranges (after compaction merged several batches, say) is rewritten without them
        into `rewrite_dir`, and the commit swaps it. Readers see the old rows or the new
        ones, never both and never neither. Which files to rewrite is decided again on
        every try, from the table as it is then.
        """
        files = list(files)

        def plan(table: DeltaTable, attempt: int) -> Try:
            refuse_replace(table, self.uri)  # change data feed turned on after the vote
            partitions = self._partition_columns(table)
            removes = remove_rows(table, self.uri, ranges, rewrite_dir, attempt, partitions)
            actions = [*add_actions(files, partitions), *removes]
            return appending(table, actions, schema, self)

        return self._commit(app_id, batch_id, schema, metadata, plan)

    def _commit(
        self,
        app_id: str,
        batch_id: int,
        schema: pa.Schema,
        metadata: Mapping[str, Any],
        plan: Callable[[DeltaTable, int], Try],
    ) -> CommitOutcome:
        """A publish or a replace through the one commit loop (resources/delta/commit.py)."""
        outcome, _metrics = commit_batch(
            self,
            app_id=app_id,
            batch_id=batch_id,
            schema=schema,
            metadata=metadata,
            plan=plan,
            max_tries=_MAX_TRIES,
            subject=f"batch {app_id}/{batch_id}",
        )
        return outcome

    def offset_reach(self, topic: str) -> dict[int, int]:
        """Per partition, one past the highest `_kafka_offset` of `topic` in the table's rows
        (resources/delta/log.py `offset_reach`); empty while the table does not exist."""
        table = self.load()
        return {} if table is None else log.offset_reach(table, self.uri, topic)

    def batch_commit(self, app_id: str, batch_id: int) -> dict[str, Any] | None:
        """The exactly metadata of the commit of `app_id`'s batch `batch_id`, if the log has
        it (resources/delta/log.py `batch_commit`)."""
        table = self.load()
        return None if table is None else log.batch_commit(self.uri, table, app_id, batch_id)

    def committed_batches(self, app_id: str) -> list[dict[str, Any]]:
        """The exactly metadata of every commit by `app_id` still in the log, oldest first
        (resources/delta/log.py `committed_batches`); empty while the table does not exist."""
        table = self.load()
        return [] if table is None else log.committed_batches(table, app_id)
