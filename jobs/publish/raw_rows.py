"""The raw table's rows: published (`publish_rows`, the data table's and the quarantine's),
and found by their coordinates or keys with pyarrow: what the publisher counts to say which
rows an output holds of a batch (`rows_held_in`), and what a replace's correction subtracts and
adds (jobs/publish/derived_outputs.py).

Files are pruned by partition and offset only: a topic name longer than the statistics keep
(resources/delta/table.py) has no min/max, and delta-rs 1.6 then prunes every file on a
topic filter (it compares with null), so the topic is matched on the rows read.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from jobs.derived.replace import in_ranges
from jobs.stage.staging import attempt_folder
from ledger.core.batch import Batch, StagedFile
from ledger.core.layout import BATCH_ID, OFFSET, PARTITION, TOPIC
from ledger.core.protocol import OffsetRange
from resources.delta.commit import CommitOutcome
from resources.delta.schema import decode_schema
from resources.delta.table import DeltaTarget
from resources.object_storage import storage


def publish_rows(
    batch: Batch,
    target: str,
    delta: DeltaTarget,
    files: Sequence[StagedFile],
    metadata: Mapping[str, Any],
) -> CommitOutcome:
    """Publish the batch's voted files to the data table or the quarantine (`target`):
    appended, or for a replace backfill with the old rows of its ranges removed in the same
    commit (resources/delta/table.py `replace`)."""
    common: dict[str, Any] = {
        "app_id": batch.app_id,
        "batch_id": batch.batch_id,
        "files": files,
        "schema": decode_schema(batch.schemas[target]),
        "metadata": metadata,
    }
    if batch.params.get("mode") != "replace":
        return delta.publish(**common)
    rewrites = attempt_folder(delta.uri, batch.app_id, batch.batch_id, batch.attempt, batch.token)
    return delta.replace(**common, ranges=batch.ranges, rewrite_dir=f"{rewrites}-rewrites")


def offsets_filter(ranges: Iterable[OffsetRange]) -> pc.Expression | None:
    """A dataset filter on partition and offset only, which prunes files by their
    statistics; the topic is matched on the rows read (module docstring)."""
    wanted = None
    for r in ranges:
        one = (
            (pc.field(PARTITION) == r.partition)
            & (pc.field(OFFSET) >= r.start)
            & (pc.field(OFFSET) < r.end)
        )
        wanted = one if wanted is None else wanted | one
    return wanted


def rows_held_in(
    table: DeltaTable | None, ranges: Sequence[OffsetRange], not_by: Collection[int] = ()
) -> int:
    """Rows of `table` whose coordinates fall in `ranges` (a batch's), leaving out rows
    written by the batches `not_by` (their `_batch_id`); 0 without a table.

    Files are pruned by partition and offset only (`offsets_filter`), the topic matched on
    the rows read (the module's docstring says why).
    """
    if table is None:
        return 0
    dataset = table.to_pyarrow_dataset()
    held = 0
    for topic in sorted({r.topic for r in ranges if r.span}):
        wanted = offsets_filter(r for r in ranges if r.span and r.topic == topic)
        if not_by and wanted is not None:
            wanted = wanted & ~pc.field(BATCH_ID).isin(sorted(not_by))
        rows = dataset.to_table(columns=[TOPIC], filter=wanted)
        held += pc.sum(pc.equal(rows[TOPIC], topic).cast("int64")).as_py() or 0
    return held


def rows_in_ranges(
    dataset: Any, ranges: Sequence[OffsetRange], columns: Sequence[str] | None = None
) -> pa.Table:
    """The raw rows whose coordinates fall in `ranges` (jobs/derived/replace.py `in_ranges`, the
    raw table's replace's own rule), files pruned by partition and offset first; `columns`
    (the coordinates among them) or every column."""
    wanted = None if columns is None else list(columns)
    rows = dataset.to_table(columns=wanted, filter=offsets_filter(ranges))
    return rows.filter(in_ranges(rows, ranges))


def rows_of_keys(dataset: Any, keys: list[str], tables: Sequence[pa.Table]) -> pa.Table:
    """The raw rows whose key is one of those `tables` hold (a superset, per column: the
    caller ignores other keys), null keys included."""
    wanted = None
    for k in keys:
        values = pa.concat_arrays(
            [t[k].combine_chunks().cast(dataset.schema.field(k).type) for t in tables]
        )
        present = pc.unique(values.drop_null())
        one = pc.field(k).isin(present)
        if values.null_count:
            one = one | pc.field(k).is_null()
        wanted = one if wanted is None else wanted & one
    return dataset.to_table(filter=wanted)


def staged_rows(root: str, files: Sequence[StagedFile], like: pa.Schema) -> pa.Table:
    """A batch's voted raw-table files below `root` read back (its new rows), the columns
    the raw table has cast to its types; a staged file's own columns (`routed`) kept as they
    are (the derived functions drop them)."""
    parts = [storage.read_parquet(storage.join(root, f.path)) for f in files if f.records]
    if not parts:
        return like.empty_table()
    rows = pa.concat_tables(parts, promote_options="default")
    for i, name in enumerate(rows.column_names):
        if name in like.names:
            rows = rows.set_column(i, name, rows[name].cast(like.field(name).type))
    return rows
