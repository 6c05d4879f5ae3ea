"""Delta checkpoints written beside a batch's commit, not inside it.

Why: delta-rs writes a checkpoint in the post-commit hook of every commit whose version is a
multiple of `delta.checkpointInterval` (100 by default), so one batch in a hundred paid 75 to
110 ms more for its commit (BENCHMARKS.md, "Commit latency over history"): a freshness
spike and a commit-time outlier for no row's sake. A checkpoint changes no row and no app
transaction; it only spares readers replaying the log. So the publish commits with that
hook off (`NO_CHECKPOINT`) and asks here for the checkpoint of the version it made, which a
thread of its own writes from a table loaded at that version, while the batch goes on to its
ack.

Failure cases, each harmless to the table:
- the checkpoint cannot be written (a full disk, a store down): a warning; readers replay
  the log from the previous checkpoint, and the next due version tries again;
- the process ends while the thread writes: the threads are not daemons, so a normal exit
  waits for them (a checkpoint takes tens of milliseconds); a killed process leaves either
  no checkpoint or a whole one (the object store's put of the file is atomic,
  and `_last_checkpoint`, a hint, is written after it);
- another writer commits meanwhile: the checkpoint is of the version asked for, whatever
  came after;
- two writers of the same table ask for the same version: both write the same content.
As delta-rs's hook does, expired log entries are cleaned after the checkpoint unless the
table says `delta.enableExpiredLogCleanup=false`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from deltalake import DeltaTable, PostCommitHookProperties

log = logging.getLogger(__name__)

#: The post-commit hooks of a batch's commit: no checkpoint in it (`checkpoint_later`).
NO_CHECKPOINT = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)
#: delta-rs's default `delta.checkpointInterval`.
DEFAULT_INTERVAL = 100

_pending: list[threading.Thread] = []
_lock = threading.Lock()


def due_version(table: DeltaTable, before: int) -> int | None:
    """The version to checkpoint now that `table` moved from version `before` to its own: its
    version if a multiple of the checkpoint interval was passed on the way, else None."""
    interval = int(table.metadata().configuration.get("delta.checkpointInterval", DEFAULT_INTERVAL))
    now = table.version()
    return now if interval > 0 and now // interval > max(before, 0) // interval else None


def checkpoint_later(
    uri: str,
    version: int,
    storage_options: Mapping[str, str] | None,
    done: Callable[[int], None] = lambda _version: None,
) -> None:
    """Write the checkpoint of `uri` at `version` in a thread of its own; `done(version)`
    once it is written (the DeltaTarget then loads its kept tables afresh from it: a kept
    table replays every commit since its own load, and would grow slower with each)."""

    def write() -> None:
        try:
            table = DeltaTable(uri, version=version, storage_options=dict(storage_options or {}))
            table.create_checkpoint()
            done(version)
            if table.metadata().configuration.get("delta.enableExpiredLogCleanup") != "false":
                table.cleanup_metadata()
        except Exception as exc:  # a missing checkpoint costs reads time, never a row
            log.warning("checkpoint of %s at version %s not written: %s", uri, version, exc)

    thread = threading.Thread(target=write, name=f"checkpoint {uri}@{version}")
    with _lock:
        _pending[:] = [t for t in _pending if t.is_alive()]
        _pending.append(thread)
    thread.start()


def wait_for_checkpoints(timeout: float | None = None) -> bool:
    """Wait for every checkpoint asked for so far; True if none is still being written."""
    with _lock:
        pending = list(_pending)
    for thread in pending:
        thread.join(timeout)
    return not any(t.is_alive() for t in pending)
