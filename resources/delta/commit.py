"""The one compare-and-set loop every batch's commit to a Delta table goes through: the raw
table's publish and replace (resources/delta/table.py) and a derived output's MERGE
(resources/delta/merge.py); and the write publish and replace make through it.

One loop because invariant 2 rests on it, and delta-rs does not enforce the application
transaction's version for you (docs/protocol.md): read the table's version for the app id,
commit only if the batch id is above it, with no automatic retry, so that if anyone committed
in between the commit fails, and the next try reads again and decides again. A concurrent
commit of the same batch then ends as "already there", never a second copy. Retries must
stay off: delta-rs retrying a commit rebases it onto the newer version without asking our
question again (a MERGE re-run that way was planned before the other commit, so a batch's
counts could be added twice; the app transaction is checked by delta-rs only against a
concurrent commit of the same app id, never against the stored version).

A failed try may have committed all the same, so whose commit a batch found in the table is
decided by content, never by which error a try saw: the batch is this call's if the table
holds the very files a try of this call added (an attempt's staged paths are its own; fencing
keeps a second process off them), or, for a MERGE, which names no files before it runs, if
the commit that recorded the batch carries this call's token in its commit info
(`TOKEN_KEY`). Ways a try commits and still fails:
- the object store wrote the log entry and its answer was lost: the client retries the
  conditional PUT, which now finds its own entry there (412) and reports a commit conflict
  (CommitFailedError);
- delta-rs lists the log right after its own write to read the new snapshot, and a listing
  that lags the write (the loopback S3 server's can) fails that read (another DeltaError,
  counted against MAX_UNKNOWN_OUTCOMES);
- a post-commit hook fails after the entry is written (a MERGE's checkpoint that cannot be
  written: also a DeltaError; a publish writes its checkpoint apart,
  resources/delta/checkpoints.py).
After any failed try the table object the try went through is dropped (the target's
`commit_scope`), so the next try reads the table afresh: whether delta-rs moved that object
to the version it may have committed, or left it half-way, is as unknown as the commit
itself, and a conflict means the table moved on anyway.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.schema import ArrayType, MapType, StructType
from deltalake.transaction import AddAction, RemoveAction

from ledger.core.batch import StagedFile
from ledger.core.errors import InconsistencyError, RefusedBatchError
from resources.config.partitioning import partition_values
from resources.delta.checkpoints import NO_CHECKPOINT, after_commit
from resources.delta.features import refuse_unwritable
from resources.delta.held import HeldVersions
from resources.delta.log import METADATA_KEY, commit_info, entry_uri, user_metadata
from resources.delta.options import store_failure
from resources.delta.schema import table_widened
from resources.delta.writers import WritersSeen, refuse_other_writers
from resources.object_storage import storage

#: Commits in a row whose outcome is unknown (module docstring) before the error is raised:
#: a store that keeps failing that way has a problem a retry will not fix.
MAX_UNKNOWN_OUTCOMES = 5
#: The commit info key of a token that every try of one `commit_batch` call carries: a batch
#: found in the table after a try whose outcome was unknown is this call's if the commit that
#: recorded it carries the token. A MERGE's metrics in the ledger and the UI say whether
#: this run applied the batch or found it applied, so a lost answer must not turn the one
#: into the other (tests/test_derived_storage_faults.py).
TOKEN_KEY = "exactlyCommitToken"


@dataclass(frozen=True)
class CommitOutcome:
    """What one publish or replace did. `published` is False when the table already had the
    batch (a MERGE reports it as merge.py's MergeOutcome)."""

    published: bool
    table_version: int
    tries: int
    seconds: float


class Committable(Protocol):
    """What the loop needs of a table location: DeltaTarget (resources/delta/table.py)."""

    uri: str
    storage_options: Mapping[str, str]
    #: the app transaction versions seen in the table, which never go down (held.py)
    held: HeldVersions
    #: the other writers read in the table's log so far (writers.py)
    writers: WritersSeen

    #: the generated columns its staged files hold as the table computes them (features.py)
    generated_columns: Mapping[str, str]

    def load(self) -> DeltaTable | None: ...

    def open_afresh(self) -> DeltaTable | None: ...

    def ensure_table(self, schema: pa.Schema) -> None: ...

    def commit_scope(self) -> contextlib.AbstractContextManager[None]: ...

    def checkpointed(self, version: int) -> None: ...


@dataclass(frozen=True)
class Try:
    """One try's commit, planned on the table as the loop read it."""

    #: the data files the commit adds, as the log names them: a batch the loop later finds
    #: in the table is this call's if they are all there; empty for a commit whose files
    #: are not known before it runs (a MERGE writes its own), whose batch found later is
    #: this call's if the commit that recorded it carries the call's `TOKEN_KEY`
    adds: frozenset[str]
    #: makes the commit on that table with the given properties (the app transaction, the
    #: commit info, no retries); returns what it did (delta-rs's metrics; empty for a
    #: write), or None when it only prepared the table (`_write`'s schema widening before a
    #: replace), and the loop reads again and decides again, at once
    commit: Callable[[CommitProperties], Mapping[str, Any] | None]


def commit_batch(
    target: Committable,
    *,
    app_id: str,
    batch_id: int,
    schema: pa.Schema,
    metadata: Mapping[str, Any],
    plan: Callable[[DeltaTable, int], Try],
    max_tries: int,
    subject: str,
    give_up: Callable[[Exception, int], Exception] | None = None,
) -> tuple[CommitOutcome, Mapping[str, Any]]:
    """Commit batch (`app_id`, `batch_id`) once (module docstring): the outcome, and the
    metrics of the try that committed (empty when none did).

    Each try loads the table (creating it with `schema` when there is none); if its version
    for `app_id` is at or past `batch_id` the batch is already there; with none at all,
    another pipeline's batches there of a topic this one read refuse it
    (resources/delta/writers.py); else `plan(table, try)` plans the commit on that table
    (outside the commit scope: what it raises propagates and keeps the table) and its
    `commit` runs inside it with the app transaction and `metadata` as the commit info.
    A lost race (CommitFailedError) and an unknown outcome (any other DeltaError, an
    OSError) are decided by the next try's read; MAX_UNKNOWN_OUTCOMES of the latter in a
    row raise `give_up(error, count)`: by default the store's failure (a publish's
    DeltaError is the store failing); a MERGE passes its own, as a MERGE that cannot be
    planned fails the same way every time, and that is no store failure.
    `subject` names the batch in the error after `max_tries` lost races.
    """
    started = time.perf_counter()
    last_error: Exception | None = None
    unknown = 0
    ours: frozenset[str] = frozenset()
    token = uuid.uuid4().hex
    custom = {METADATA_KEY: dict(metadata), "userMetadata": user_metadata(metadata)}
    custom[TOKEN_KEY] = token
    first_read: int | None = None
    for tries in range(1, max_tries + 1):
        table = target.load()
        if table is None:
            target.ensure_table(schema)
            continue
        first_read = table.version() if first_read is None else first_read
        version = table.transaction_version(app_id)
        target.held.check(app_id, version, lambda: _fresh_version(target, app_id))
        if version is not None and version >= batch_id:
            published = _ours(target.uri, table, ours, token, first_read)
            seconds = time.perf_counter() - started
            return CommitOutcome(published, table.version(), tries, seconds), {}
        if version is None:
            refuse_other_writers(target.writers, table, target.uri, app_id, metadata)
        planned = plan(table, tries)
        ours = planned.adds
        properties = CommitProperties(
            app_transactions=[Transaction(app_id, batch_id)],
            custom_metadata=custom,
            max_commit_retries=0,
        )
        try:
            with target.commit_scope():
                done = planned.commit(properties)
        except CommitFailedError as exc:
            last_error = exc
            time.sleep(min(0.05 * tries, 1.0))
            continue
        except (DeltaError, OSError) as exc:
            unknown += 1
            if unknown > MAX_UNKNOWN_OUTCOMES:
                raise (give_up or _store_failed(target.uri))(exc, unknown) from exc
            last_error = exc
            time.sleep(min(0.05 * tries, 1.0))
            continue
        if done is None:
            continue
        target.held.saw(app_id, batch_id)
        return CommitOutcome(True, table.version(), tries, time.perf_counter() - started), done
    raise InconsistencyError(
        f"{target.uri}: {subject} lost {max_tries} commit races in a row; last error: {last_error}"
    )


def _fresh_version(target: Committable, app_id: str) -> int | None:
    """`app_id`'s version in the table read afresh from storage, not through a kept table
    (a store's failure said in the target's one line, as every read of it is)."""
    table = target.open_afresh()
    return None if table is None else table.transaction_version(app_id)


def _store_failed(uri: str) -> Callable[[Exception, int], Exception]:
    return lambda exc, _count: store_failure(uri, exc)


def _ours(uri: str, table: DeltaTable, adds: frozenset[str], token: str, first_read: int) -> bool:
    """Whether the batch found in `table` was committed by this call: a publish's by its
    files, a MERGE's by `token` in the commit info of a version after `first_read`, the
    version this call read first (a batch there already then was someone else's). The log
    entries are read only when the table moved on since, that is after a try of this call
    failed, and through the store's own client (storage.read_bytes says why)."""
    if adds:
        return adds <= _paths(table)
    return any(
        commit_info(storage.read_bytes(entry_uri(uri, version))).get(TOKEN_KEY) == token
        for version in range(table.version(), first_read, -1)
    )


def _paths(table: DeltaTable) -> set[str]:
    """The data files of the table's snapshot, as its add actions name them."""
    return set(pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist())


def add_actions(
    files: Iterable[StagedFile], partition_columns: Sequence[str] = ()
) -> list[AddAction]:
    """The add actions of `files` with records, each with its partition values (from its
    partition folders: resources/config/partitioning.py `partition_values`)."""
    return [
        AddAction(
            f.path,
            f.size,
            partition_values(f.path, partition_columns),
            f.modification_time,
            True,
            f.stats,
        )
        for f in files
        if f.records > 0
    ]


def appending(table: DeltaTable, actions: list[Any], schema: pa.Schema, target: Committable) -> Try:
    """The try of a publish or a replace: `actions` in one commit on `table` (`_write`),
    then the table object brought up to the version it committed, and the checkpoint that
    version is due written beside the batch (resources/delta/checkpoints.py); `target` is
    the DeltaTarget (its uri, storage options, and `checkpointed`, told when it is done)."""

    def commit(properties: CommitProperties) -> Mapping[str, Any] | None:
        before = table.version()
        if not _write(table, actions, schema, properties, target.uri, target.generated_columns):
            return None
        table.update_incremental()
        checkpoint_if_due(target, table, before)
        return {}

    return Try(frozenset(a.path for a in actions if isinstance(a, AddAction)), commit)


def checkpoint_if_due(target: Committable, table: DeltaTable, before: int) -> None:
    """After a commit made with `NO_CHECKPOINT` moved `table` on from version `before`: the
    checkpoint that makes due, written beside the batch (resources/delta/checkpoints.py)."""
    after_commit(target.uri, table, before, target.storage_options, target.checkpointed)


def _write(
    table: DeltaTable,
    actions: list[Any],
    schema: pa.Schema,
    properties: CommitProperties,
    uri: str,
    generated: Mapping[str, str],
) -> bool:
    """One commit of `actions` with `properties` (the app transaction) on `table`'s snapshot;
    `generated`, the generated columns the staged files hold as the table computes them
    (resources/delta/features.py `generated_refusal`).

    A batch that brings new columns widens the table's schema in that same commit
    (invariant 14): readers see the new files and the new columns together, or neither.
    delta-rs 1.6 writes a metaData action only in mode "overwrite" (mode "append"
    ignores the schema it is given), so the widening commit is an overwrite whose file
    filter matches no file, checked on this very snapshot first, so that it removes
    nothing (invariant 1); the log records it as a WRITE in mode Overwrite.
    delta-rs takes RemoveActions only in mode "append", so a replace that widens the
    schema first adds the new nullable columns in a commit of their own (older rows read
    them as null, no row changes) and returns False: the caller re-reads and decides
    again, and then the replace fits the widened table as it is.
    """
    refuse_unwritable(table, uri, voted=True, generated=generated)
    try:
        widened = table_widened(table, schema, uri)
    except RefusedBatchError as exc:
        raise InconsistencyError(
            f"{exc}; the batch voted with this schema, so the table changed after its "
            "vote: make the table take the batch's schema, then recover"
        ) from exc
    if widened is None:
        table.create_write_transaction(
            actions,
            "append",
            schema,
            commit_properties=properties,
            post_commithook_properties=NO_CHECKPOINT,
        )
        return True
    if any(isinstance(a, RemoveAction) for a in actions):
        present = {f.name for f in table.schema().fields}
        table.alter.add_columns(
            [f for f in widened.fields if f.name not in present],
            commit_properties=CommitProperties(max_commit_retries=0),
        )
        return False
    no_file = _no_file_filter(table)
    doomed = table.file_uris(file_pruning_predicate=no_file)
    if doomed:
        raise InconsistencyError(
            f"{uri}: the schema-widening commit's filter {no_file} would remove "
            f"{len(doomed)} file(s), e.g. {doomed[0]}; refusing to commit (invariant 1)"
        )
    table.create_write_transaction(
        actions,
        "overwrite",
        widened,
        partition_filters=no_file,
        commit_properties=properties,
        post_commithook_properties=NO_CHECKPOINT,
    )
    return True


def _no_file_filter(table: DeltaTable) -> list[tuple[str, str, list[str]]]:
    """A file filter that matches no file: an empty IN list, false with or without statistics.

    delta-rs 1.6 commits a new schema (a metaData action) only in mode "overwrite", which
    also removes every file its partition filter matches; with this filter, none.
    """
    for field in table.schema().fields:
        if not isinstance(field.type, ArrayType | MapType | StructType):
            return [(field.name, "in", [])]
    raise InconsistencyError(f"{table.table_uri}: no primitive column to filter files by")
