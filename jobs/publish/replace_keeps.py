"""The rows a replace would remove against the rows it staged: what the rule
(ledger/core/backfill.py `check_replace_keeps`) is given, read with delta-rs and pyarrow.

Both sides are one batch's worth of coordinates, three columns: the tables' files are
pruned by partition and offset (jobs/publish/raw_rows.py `offsets_filter`), and only the
staged files of the data table and the quarantine are read. The difference is an Arrow
anti-join, not Python sets: a replace of millions of offsets stays a few vectors.
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

#: one type per coordinate column, whatever a file or a table wrote
COORDINATES = pa.schema([(KEY[0], pa.string()), (KEY[1], pa.int32()), (KEY[2], pa.int64())])


def refuse_replace_losing_rows(
    batch: Batch, files: Sequence[StagedFile], outputs: Iterable[tuple[str, DeltaTarget]]
) -> None:
    """Raise RefusedBatchError when `batch`, a replace, would delete a row of `outputs`
    (the quarantine and the data table, by target) whose record its `files` do not stage
    again; nothing for any other batch."""
    if batch.params.get("mode") != BackfillMode.REPLACE:
        return
    held: list[pa.Table] = []
    staged: list[pa.Table] = []
    for target, delta in outputs:
        table = delta.load()
        if table is not None:
            held.append(rows_in_ranges(table.to_pyarrow_dataset(), batch.ranges, KEY))
        staged += [
            storage.read_parquet(storage.join(delta.uri, f.path), columns=KEY)
            for f in files
            if f.target == target and f.records
        ]
    lost = _coordinates(held).join(_coordinates(staged), keys=list(KEY), join_type="left anti")
    first = lost.sort_by([(c, "ascending") for c in KEY]).slice(0, 1).to_pylist()
    check_replace_keeps(lost.num_rows, tuple(first[0].values()) if first else None)


def _coordinates(parts: list[pa.Table]) -> pa.Table:
    """The coordinate columns of `parts` as one table of COORDINATES' types."""
    return pa.concat_tables(
        [p.select(list(KEY)).cast(COORDINATES) for p in parts] or [COORDINATES.empty_table()]
    )
