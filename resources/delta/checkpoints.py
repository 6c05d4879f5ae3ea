"""Delta checkpoints written beside a batch's commit, not inside it.

Why: delta-rs writes a checkpoint in the post-commit hook of every commit whose version is a
multiple of `delta.checkpointInterval` (100 when a table sets none, where this module takes
10: `DEFAULT_INTERVAL`), and at 100 that batch paid 75 to 110 ms more for its commit
(BENCHMARKS.md, "Commit latency over history"): a freshness spike and a commit-time outlier
for no row's sake. A checkpoint changes no row and no app transaction; it only spares
readers replaying the log. So the publish and the derived
outputs' MERGEs commit with that hook off (`NO_CHECKPOINT`) and ask here for the checkpoint
of the version they made (resources/delta/commit.py `checkpoint_if_due`), which a thread of
its own writes from a table loaded at that version, while the batch goes on to its ack. In
the commit, a store that did not answer the checkpoint's PUT held the batch's commit for as
long as delta-rs retried (120 s), silently.

Failure cases, each harmless to the table:
- the checkpoint cannot be written (a full disk, a store down): a warning; readers replay
  the log from the previous checkpoint, and the next multiple of the interval, or the next
  process's first commit (`after_commit`), writes one;
- the process ends while the thread writes: it waits for the thread up to
  `EXIT_WAIT_SECONDS`, then ends and says which checkpoint it left. A checkpoint takes tens
  of milliseconds; a store that does not answer would otherwise hold a process whose
  batches are all committed for as long as delta-rs retries (120 s), and with it the next
  scheduled run. What it left is either no checkpoint or a whole one (the object store's put
  of the file is atomic, and `_last_checkpoint`, a hint, is written after it), and the next
  process's first commit finds the table behind and writes it;
- another writer commits meanwhile: the checkpoint is of the version asked for, whatever
  came after;
- two writers of the same table ask for the same version: both write the same content.
As delta-rs's hook does, expired log entries are cleaned after the checkpoint unless the
table says `delta.enableExpiredLogCleanup=false`.
"""

from __future__ import annotations

import atexit
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping

from deltalake import DeltaTable, PostCommitHookProperties

from resources.object_storage import storage

log = logging.getLogger(__name__)

#: The post-commit hooks of a batch's commit: no checkpoint in it (`checkpoint_later`).
NO_CHECKPOINT = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)
#: The interval of a table that sets no `delta.checkpointInterval`: Delta's own default, the
#: one delta-spark writes by, not delta-rs's 100. A kept table's update and a commit through
#: it replay every commit since the table's checkpoint (delta-rs 1.6), so at 100 each commit
#: cost a third of a millisecond more than the one before it until the next checkpoint, a
#: median of 18 to 30 ms over 1,000 commits against 8 to 15 at 10, checkpoints included
#: (BENCHMARKS.md, "Checkpoints every ten versions"). A checkpoint is written in a thread
#: beside the batch, and spares every reader of the table the same replay.
DEFAULT_INTERVAL = 10

#: How long an ending process waits for the checkpoints it asked for (module docstring).
EXIT_WAIT_SECONDS = 10.0

_pending: list[threading.Thread] = []
_lock = threading.Lock()
#: the tables this process has committed to: its first commit to one also looks for a
#: checkpoint an earlier process missed (`after_commit`)
_seen: set[str] = set()


def due_version(table: DeltaTable, before: int, newest: int | None = None) -> int | None:
    """The version to checkpoint now that `table` moved from version `before` to its own: its
    version if a multiple of the checkpoint interval was passed on the way, or since its
    newest checkpoint (`newest`, -1 for none, None when unknown): one an earlier process
    missed. Else None."""
    interval = int(table.metadata().configuration.get("delta.checkpointInterval", DEFAULT_INTERVAL))
    now = table.version()
    if interval <= 0:
        return None
    since = max(before, 0) if newest is None else min(max(before, 0), max(newest, 0))
    return now if now // interval > since // interval else None


def after_commit(
    uri: str,
    table: DeltaTable,
    before: int,
    storage_options: Mapping[str, str] | None,
    done: Callable[[int], None] = lambda _version: None,
) -> None:
    """After this process's commit moved `table` (at `uri`) on from version `before`: the
    checkpoint that makes due, written in a thread of its own (`checkpoint_later`).

    Due when a multiple of the interval was passed on the way. On the process's first commit
    to the table, also when one was passed since the table's newest checkpoint: one an
    earlier process missed (it ended first, or the store failed it). The thread, not the
    commit, reads the newest checkpoint's version, so a store slow to answer that read holds
    no batch; a table younger than one interval is not looked at.
    """
    version = table.version()
    with _lock:
        first = uri not in _seen
        _seen.add(uri)
    if due_version(table, before) is not None:
        checkpoint_later(uri, version, storage_options, done)
    elif first and due_version(table, before, newest=-1) is not None:
        checkpoint_later(uri, version, storage_options, done, only_if_missed=True)


def newest_checkpoint(uri: str) -> int | None:
    """The version `_last_checkpoint` names (-1 when there is none), or None when it cannot
    be read: a hint, read once per table and process, never a reason to fail a commit."""
    try:
        hint = storage.read_bytes(storage.join(uri, "_delta_log", "_last_checkpoint"))
        return -1 if hint is None else int(json.loads(hint)["version"])
    except Exception as exc:
        log.warning("the newest checkpoint of %s is unknown: %s", uri, exc)
        return None


def checkpoint_later(
    uri: str,
    version: int,
    storage_options: Mapping[str, str] | None,
    done: Callable[[int], None] = lambda _version: None,
    *,
    only_if_missed: bool = False,
) -> None:
    """Write the checkpoint of `uri` at `version` in a thread of its own (with
    `only_if_missed`, only if the table's newest checkpoint is a multiple of the interval
    behind it); `done(version)` once it is written (the DeltaTarget then loads its kept
    tables afresh from it: a kept table replays every commit since its own load, and would
    grow slower with each)."""

    def write() -> None:
        try:
            table = DeltaTable(uri, version=version, storage_options=dict(storage_options or {}))
            if only_if_missed and due_version(table, version, newest_checkpoint(uri)) is None:
                return
            table.create_checkpoint()
            done(version)
            if table.metadata().configuration.get("delta.enableExpiredLogCleanup") != "false":
                table.cleanup_metadata()
        except Exception as exc:  # a missing checkpoint costs reads time, never a row
            log.warning("checkpoint of %s at version %s not written: %s", uri, version, exc)

    # a daemon: an ending process waits for it only up to EXIT_WAIT_SECONDS (_wait_at_exit)
    thread = threading.Thread(target=write, name=f"checkpoint of {uri} at version {version}")
    thread.daemon = True
    with _lock:
        _pending[:] = [t for t in _pending if t.is_alive()]
        _pending.append(thread)
    thread.start()


def wait_for_checkpoints(timeout: float | None = None) -> bool:
    """Wait for every checkpoint asked for so far, `timeout` seconds at most in all; True if
    none is still being written."""
    with _lock:
        pending = list(_pending)
    deadline = None if timeout is None else time.monotonic() + timeout
    for thread in pending:
        thread.join(None if deadline is None else max(deadline - time.monotonic(), 0))
    return not any(t.is_alive() for t in pending)


@atexit.register
def _wait_at_exit() -> None:
    """As the process ends: the checkpoints still being written get EXIT_WAIT_SECONDS, and
    each one left is named in a warning (the next commit writes it: module docstring)."""
    if wait_for_checkpoints(EXIT_WAIT_SECONDS):
        return
    with _lock:
        left = [t.name for t in _pending if t.is_alive()]
    for name in left:
        log.warning(
            "%s was still being written %.0f s after the process's work ended: left to the "
            "next commit (readers replay the log meanwhile)",
            name,
            EXIT_WAIT_SECONDS,
        )
