"""Publishing staged files to a Delta table with delta-rs: the commit half of the protocol.

The commit is a compare-and-set on the table's application transaction version: read the
version, publish only if the batch id is above it, and let the commit fail (no automatic
retry) if anyone else committed in between; then read again and decide again. delta-rs does
not enforce the version for you (protocol.md, invariant 2).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import dagster as dg
import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.transaction import AddAction

from ledger.errors import InconsistencyError
from ledger.store import StagedFile

#: The key under which every exactly commit stores its batch in the commit info.
METADATA_KEY = "exactly"


def encode_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def decode_schema(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


@dataclass(frozen=True)
class CommitOutcome:
    """What one publish did. `published` is False when the table already had the batch."""

    published: bool
    table_version: int
    tries: int
    seconds: float


class DeltaTarget:
    """One Delta table location and the operations the protocol needs on it."""

    def __init__(self, uri: str, storage_options: Mapping[str, str] | None = None) -> None:
        self.uri = uri
        self.storage_options = dict(storage_options or {})

    def load(self) -> DeltaTable | None:
        try:
            return DeltaTable(self.uri, storage_options=self.storage_options or None)
        except TableNotFoundError:
            return None

    def transaction_version(self, app_id: str) -> int | None:
        """The last batch id committed by `app_id`, or None (no table, or never committed)."""
        table = self.load()
        return None if table is None else table.transaction_version(app_id)

    def _create(self, schema: pa.Schema) -> None:
        try:
            DeltaTable.create(
                self.uri,
                schema=schema,
                mode="ignore",
                storage_options=self.storage_options or None,
            )
        except Exception:
            if self.load() is None:
                raise

    def publish(
        self,
        *,
        app_id: str,
        batch_id: int,
        files: Iterable[StagedFile],
        schema: pa.Schema,
        metadata: Mapping[str, Any],
        max_tries: int = 50,
    ) -> CommitOutcome:
        """Add exactly `files` and the app transaction (app_id, batch_id) in one commit.

        Idempotent: a batch at or below the table's version for `app_id` publishes nothing.
        A lost race is re-checked against the freshly read table before the next try, so a
        concurrent commit of the same batch makes this call return `published=False`, never
        a second copy. Protects invariants 1, 2 and 3.
        """
        adds = [
            AddAction(f.path, f.size, {}, f.modification_time, True, f.stats)
            for f in files
            if f.records > 0
        ]
        started = time.perf_counter()
        last_error: Exception | None = None
        for tries in range(1, max_tries + 1):
            table = self.load()
            if table is None:
                self._create(schema)
                continue
            version = table.transaction_version(app_id)
            if version is not None and version >= batch_id:
                return CommitOutcome(False, table.version(), tries, time.perf_counter() - started)
            try:
                table.create_write_transaction(
                    adds,
                    "append",
                    schema,
                    commit_properties=CommitProperties(
                        app_transactions=[Transaction(app_id, batch_id)],
                        custom_metadata={METADATA_KEY: dict(metadata)},
                        max_commit_retries=0,
                    ),
                )
            except CommitFailedError as exc:
                last_error = exc
                time.sleep(min(0.05 * tries, 1.0))
                continue
            table.update_incremental()
            return CommitOutcome(True, table.version(), tries, time.perf_counter() - started)
        raise InconsistencyError(
            f"{self.uri}: batch {app_id}/{batch_id} lost {max_tries} commit races in a row; "
            f"last error: {last_error}"
        )

    def committed_batches(self, app_id: str) -> list[dict[str, Any]]:
        """The exactly metadata of every commit by `app_id` still in the log, oldest first.

        Enough to rebuild the ledger's committed history (invariant 7).
        """
        table = self.load()
        if table is None:
            return []
        found = []
        for entry in table.history():
            meta = entry.get(METADATA_KEY)
            if isinstance(meta, str):
                meta = json.loads(meta)
            if isinstance(meta, dict) and meta.get("app_id") == app_id:
                found.append({**meta, "table_version": entry.get("version")})
        found.sort(key=lambda m: m["batch_id"])
        return found


class DeltaResource(dg.ConfigurableResource):
    """Object-store settings shared by every table a pipeline writes."""

    storage_options: dict[str, str] = {}

    def target(self, uri: str) -> DeltaTarget:
        return DeltaTarget(uri, self.storage_options)
