"""The rows a replace would remove against the rows it staged: what the pure rule
(ledger/core/backfill.py `check_replace_keeps`) is given, read with delta-rs and pyarrow.

Both sides are one batch's worth of coordinates: the tables' files are pruned by partition
and offset (jobs/publish/raw_rows.py `offsets_filter`), and only the staged files of the
data table and the quarantine are read, three columns each.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pyarrow as pa

from jobs.publish.raw_rows import rows_in_ranges
from ledger.core.backfill import BackfillMode, check_replace_keeps
from ledger.core.batch import Batch, StagedFile
from ledger.core.layout import KEY
from resources.delta.table import DeltaTarget
from resources.object_storage import storage


def refuse_replace_losing_rows(
    batch: Batch, files: Sequence[StagedFile], outputs: Iterable[tuple[str, DeltaTarget]]
) -> None:
    """Raise RefusedBatchError when `batch`, a replace, would delete a row of `outputs`
    (the quarantine and the data table, by target) whose record its `files` do not stage
    again; nothing for any other batch."""
    if batch.params.get("mode") != BackfillMode.REPLACE:
        return
    held: set[tuple[str, int, int]] = set()
    staged: set[tuple[str, int, int]] = set()
    for target, delta in outputs:
        table = delta.load()
        if table is not None:
            held |= _coordinates(rows_in_ranges(table.to_pyarrow_dataset(), batch.ranges, KEY))
        for f in files:
            if f.target == target and f.records:
                path = storage.join(delta.uri, f.path)
                staged |= _coordinates(storage.read_parquet(path, columns=KEY))
    check_replace_keeps(held, staged)


def _coordinates(rows: pa.Table) -> set[tuple[str, int, int]]:
    return set(zip(*(rows[c].to_pylist() for c in KEY), strict=True))
