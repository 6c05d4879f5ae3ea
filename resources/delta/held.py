"""The application transaction versions one DeltaTarget has seen, which never go down.

An application's transaction version is the compare-and-set every commit of a batch is
decided by (resources/delta/commit.py): at or past the batch's id, the table holds it. In one
table nothing lowers it: checkpoints carry it, compaction, vacuum and the log's clean-up
keep it, and delta-spark's RESTORE keeps the app transactions of the versions it takes back.
So a table whose version for an application id is lower than this process saw before, or
gone, is not the table the batches went to: it was dropped and created again, or replaced
by an older copy, under the running process (a table re-created *between* processes is the
start's to find: ledger/coordinator/table_history.py). Committed into, it would take the
next batch alone, every earlier one missing, and its compare-and-set would be satisfied.

The kept table is one delta-rs table per thread, brought up to date at each load; two
threads may read a moment apart. A version lower than the one seen is therefore read again
from storage, freshly, before it is refused: only a table that says so twice went back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ledger.core.errors import InconsistencyError


class HeldVersions:
    """The highest version this process saw for each application id in one table."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()

    def check(self, app_id: str, version: int | None, fresh: Callable[[], int | None]) -> None:
        """Refuse `version`, read for `app_id`, if it is lower than one seen before (or
        gone) and a fresh read (`fresh`) of the table agrees; remember it otherwise."""
        seen = self._seen.get(app_id)
        if seen is not None and (version is None or version < seen):
            version = fresh()
            if version is None or version < seen:
                now = "none" if version is None else f"only batch {version}"
                raise InconsistencyError(
                    f"{self.uri}: the table went back under this process: it held batch "
                    f"{seen} of {app_id} and holds {now} now, so it was dropped and created "
                    "again, or replaced by an older copy; put back the table that holds the "
                    "batches (the batch waits, voted, and is published there)"
                )
        self.saw(app_id, version)

    def saw(self, app_id: str, version: int | None) -> None:
        """`app_id` holds `version` in the table now (read, or just committed)."""
        if version is None:
            return
        with self._lock:
            self._seen[app_id] = max(version, self._seen.get(app_id, version))
