"""Every write of an attempt to its batch, fenced by the attempt's (state, token).

Each is one compare-and-set UPDATE on the batch's row: a stale attempt that wakes up later
changes zero rows and learns it was fenced (invariant 6). The prepare vote writes the file
list and the new state in one transaction, so a crash leaves either no vote or a complete
one; a re-stage drops the vote's files and starts a new attempt in one. Every timestamp is
the database's (ledger/store/db_clock.py, invariant 17).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy.engine import Connection

from ledger.core.batch import RESTAGE, Batch, StagedFile
from ledger.core.errors import FencedError, InconsistencyError
from ledger.core.protocol import RESTAGE_MOVE, BatchState, Owner, check_transition
from ledger.host.process import this_owner
from ledger.store import reads
from ledger.store.connection import LedgerConnection
from ledger.store.db_clock import db_now
from ledger.store.schema import batches_table, files_table


class Fencing(LedgerConnection):
    """The attempt's writes: transitions, re-stage, takeover, metrics, heartbeat, and the
    check before publishing."""

    def transition(
        self,
        batch: Batch,
        target: BatchState,
        *,
        files: Iterable[StagedFile] = (),
        schemas: Mapping[str, str] | None = None,
        metrics: Mapping[str, Any] | None = None,
        error: str | None = None,
        table_version: int | None = None,
    ) -> Batch:
        """Move `batch` to `target` if nobody else moved it since it was read.

        For PREPARED, the file list is written in the same transaction: the vote is
        all-or-nothing (invariant 3: only these files are ever committed).
        """
        _check_move(batch, target, error)
        now = db_now()
        values: dict[str, Any] = {"heartbeat_at": now}
        if metrics is not None:
            values["metrics"] = {**batch.metrics, **metrics}
        if error is not None:
            values["error"] = error
        if schemas is not None:
            values["schemas"] = dict(schemas)
        if target is BatchState.PREPARED:
            values["prepared_at"] = now
        if target is BatchState.COMMITTED:
            values["committed_at"] = now
            values["table_version"] = table_version
        with self._tx() as conn:
            _cas(conn, batch, target, values)
            rows = _file_rows(batch, files)
            if rows:
                if target is not BatchState.PREPARED:
                    raise ValueError("files are recorded only by the prepare vote")
                conn.execute(files_table.insert(), rows)
            return _current(conn, batch)

    def restage(self, batch: Batch, *, reason: str, metrics: Mapping[str, Any]) -> Batch:
        """Send a PREPARED batch back to PLANNED to be staged again, in one transaction:
        a new attempt (the old token stops working), the old vote's file rows deleted, and
        `reason` and `metrics` (which must say which files were missing) recorded.

        The only way back from PREPARED (invariant 11). The batch keeps its id and ranges,
        so its range stays held and nothing is planned past it until it commits; and it
        stays marked (metrics RESTAGE) as a batch that voted, never abandoned (invariant 5).
        """
        check_transition(batch.label, batch.state, BatchState.PLANNED, reason=reason)
        if RESTAGE not in metrics:
            raise ValueError(f"re-staging {batch.label} must record metrics[{RESTAGE!r}]")
        with self._tx() as conn:
            now = db_now()
            _guarded_update(
                conn,
                batch,
                {
                    "state": str(BatchState.PLANNED),
                    "attempt": batch.attempt + 1,
                    "token": uuid.uuid4().hex,
                    "owner": str(this_owner()),
                    "heartbeat_at": now,
                    "updated_at": now,
                    "error": reason,
                    "metrics": {**batch.metrics, **metrics},
                },
                same_state=True,
                refused=f"fenced moving {batch.state} -> {BatchState.PLANNED} to re-stage",
            )
            conn.execute(
                files_table.delete().where(
                    files_table.c.app_id == batch.app_id, files_table.c.batch_id == batch.batch_id
                )
            )
            return _current(conn, batch)

    def record_metrics(self, batch: Batch, metrics: Mapping[str, Any]) -> Batch:
        """Merge metrics without changing state; fenced like any other write."""
        with self._tx() as conn:
            _guarded_update(
                conn,
                batch,
                {"metrics": {**batch.metrics, **metrics}, "updated_at": db_now()},
                same_state=False,
                refused="fenced while recording metrics",
            )
            return _current(conn, batch)

    def takeover(self, batch: Batch, owner: Owner | None = None) -> Batch:
        """Start a new attempt on `batch` (same state): the old attempt's token stops working.

        Used by recovery and re-drive: from here a zombie of the previous attempt can no
        longer move the batch.
        """
        with self._tx() as conn:
            now = db_now()
            _guarded_update(
                conn,
                batch,
                {
                    "attempt": batch.attempt + 1,
                    "token": uuid.uuid4().hex,
                    "owner": str(owner or this_owner()),
                    "heartbeat_at": now,
                    "updated_at": now,
                },
                same_state=True,
                refused="taken over by someone else first",
            )
            return _current(conn, batch)

    def require_current(self, batch: Batch) -> None:
        """Raise FencedError unless `batch` is still in the state and attempt it was read at.

        Checked before publishing, so a zombie learns it was replaced before it touches the
        table; the table's own version check still decides if the two race.
        """
        with self._read() as conn:
            current = reads.get(conn, batch.app_id, batch.batch_id)
            if current is None or (current.state, current.token) != (batch.state, batch.token):
                raise FencedError(
                    f"batch {batch.label} was fenced before publishing: "
                    f"{reads.describe(conn, batch)}"
                )

    def heartbeat(self, batch: Batch) -> None:
        """Renew the attempt's lease; any state, as long as the attempt still owns it."""
        with self._tx() as conn:
            _guarded_update(
                conn,
                batch,
                {"heartbeat_at": db_now()},
                same_state=False,
                refused="fenced (heartbeat refused)",
            )


def _check_move(batch: Batch, target: BatchState, error: str | None) -> None:
    """Refuse a move the state table does not allow, or one only another call may make."""
    check_transition(batch.label, batch.state, target, reason=error)
    if (batch.state, target) == RESTAGE_MOVE:
        raise InconsistencyError(
            f"batch {batch.label}: a vote goes back to PLANNED only through "
            "LedgerStore.restage, which fences the attempt and drops its files (invariant 11)"
        )
    if target is BatchState.ABORTED and batch.voted_once:
        raise InconsistencyError(
            f"batch {batch.label} voted once and is being staged again: it cannot be "
            "abandoned (invariant 5); fix what fails its stage and run recover"
        )


def _file_rows(batch: Batch, files: Iterable[StagedFile]) -> list[dict[str, Any]]:
    """The vote's file list as rows of the files table."""
    return [
        {
            "app_id": batch.app_id,
            "batch_id": batch.batch_id,
            "target": f.target,
            "path": f.path,
            "size": f.size,
            "records": f.records,
            "modification_time": f.modification_time,
            "stats": f.stats,
        }
        for f in files
    ]


def _current(conn: Connection, batch: Batch) -> Batch:
    """The batch as the write just left it."""
    updated = reads.get(conn, batch.app_id, batch.batch_id)
    assert updated is not None
    return updated


def _guarded_update(
    conn: Connection,
    batch: Batch,
    values: Mapping[str, Any],
    *,
    same_state: bool,
    refused: str,
) -> None:
    """Write `values` to the batch's row only while `batch`'s attempt token (and, with
    `same_state`, its state) still hold there: every write of an attempt goes through
    here, so a stale attempt changes nothing and learns it was fenced (invariant 6).
    Transitions and takeovers start from the state they read; metrics and heartbeats
    belong to the attempt whatever its state.

    The FencedError reads "batch <label> was <refused>: <what the batch is now>".
    """
    guard = [
        batches_table.c.app_id == batch.app_id,
        batches_table.c.batch_id == batch.batch_id,
        batches_table.c.token == batch.token,
    ]
    if same_state:
        guard.append(batches_table.c.state == str(batch.state))
    result = conn.execute(batches_table.update().where(*guard).values(**values))
    if result.rowcount != 1:
        raise FencedError(f"batch {batch.label} was {refused}: {reads.describe(conn, batch)}")


def _cas(conn: Connection, batch: Batch, target: BatchState, values: dict[str, Any]) -> None:
    """The compare-and-set every transition goes through (invariant 6)."""
    _guarded_update(
        conn,
        batch,
        {**values, "state": str(target), "updated_at": db_now()},
        same_state=True,
        refused=f"fenced moving {batch.state} -> {target}",
    )
