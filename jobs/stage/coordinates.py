"""Invariant 13 at the stage: every coordinate read appears exactly once across a batch's
table and quarantine, checked before the vote.

A transform that emits a record twice (a join fan-out, an explode, a union) would duplicate
data silently; one that drops a record and duplicates another keeps the counts equal. So the
check compares coordinates, not only counts, from facts gathered where they cost least:

- the count and a fingerprint of the coordinates read (XOR of xxhash64 over topic, partition
  and offset), observed in the job that writes the table, so the batch is not read twice;
- the same fingerprint of the coordinates written, observed in the two write jobs;
- the staged files' coordinate columns, read back with pyarrow (three columns of files this
  attempt just wrote), for repeats and for coordinates outside the batch's ranges.

Why the fingerprint makes it exact: the coordinates read are distinct. If the staged multiset
has as many rows as were read and the same XOR, every coordinate read must appear an odd
number of times, so at least once, and with the counts equal, exactly once, and nothing else
appears (up to a 64-bit hash collision). The pyarrow pass alone is exact for repeats and
out-of-range coordinates but cannot see a record relabelled to an offset that is in range but
was never read (a transaction marker's); the fingerprint alone gives no example to show. A
transform whose output does not derive from the observed source has no fingerprint; then the
pyarrow pass with the counts is the check.

One-to-many transforms are not supported: every row must carry the coordinates of exactly one
record, and a fan-out is refused with the error below.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column
from pyspark.sql import functions as F

from ledger.core.errors import RefusedBatchError
from ledger.core.layout import KEY, OFFSET, PARTITION, TOPIC
from ledger.core.protocol import OffsetRange
from resources.object_storage import storage

FINGERPRINT = "coordinates_fingerprint"
#: how many example coordinates an error shows per kind of problem
_EXAMPLES = 3


def fingerprint() -> Column:
    """The order-independent fingerprint of the coordinates of a frame's rows, as a metric.

    XOR of 64-bit hashes: a coordinate present twice cancels out, which the check accounts
    for (module docstring). Null for no rows.
    """
    return F.bit_xor(F.xxhash64(*KEY)).alias(FINGERPRINT)


def combine(*fingerprints: int | None) -> int:
    """The fingerprint of the union of disjoint parts (null, from no rows, counts as 0)."""
    result = 0
    for value in fingerprints:
        result ^= value or 0
    return result


@dataclass(frozen=True)
class Counts:
    """How many records the stage read, and how many rows it wrote to each output."""

    read: int
    table: int
    quarantine: int

    @property
    def staged(self) -> int:
        return self.table + self.quarantine

    def __str__(self) -> str:
        return (
            f"{self.read} records read, {self.staged} staged "
            f"({self.table} table + {self.quarantine} quarantine)"
        )


def check_exactly_once(
    counts: Counts,
    *,
    read_fingerprint: int | None,
    staged_fingerprint: int | None,
    staged_files: Sequence[str],
    ranges: Sequence[OffsetRange],
    read_coordinates: Callable[[], pa.Table],
) -> None:
    """Refuse the batch unless every coordinate read is staged exactly once (invariant 13).

    `read_fingerprint`/`staged_fingerprint` are None when Spark did not report them.
    `read_coordinates` re-reads the coordinates from Kafka; it is called only to find an
    example when the other facts prove a mismatch but cannot show one.
    """
    staged = _read_staged(staged_files)
    problems: list[str] = []
    if staged is not None and staged.num_rows:
        problems += _repeated(staged) + _never_read(staged, ranges)
    fingerprints_differ = (
        read_fingerprint is not None
        and staged_fingerprint is not None
        and read_fingerprint != staged_fingerprint
    )
    if not problems and (counts.read != counts.staged or fingerprints_differ):
        problems += _missing(staged, read_coordinates())
        if not problems:
            problems.append("the staged coordinates differ from those read")
    if problems:
        raise RefusedBatchError(
            f"{counts}: {'; '.join(problems)}. Every coordinate read must appear exactly once "
            "across table and quarantine (invariant 13): a transform may neither fan out "
            "(join, explode, union) nor drop or relabel records, and one-to-many transforms "
            "are not supported"
        )


def _read_staged(uris: Sequence[str]) -> pa.Table | None:
    """The coordinate columns of every staged file, table and quarantine together."""
    if not uris:
        return None
    parts = [storage.read_parquet(uri, KEY).replace_schema_metadata() for uri in uris]
    return pa.concat_tables(parts, promote_options="permissive")


def _name(row: dict[str, object]) -> str:
    return f"{row['_kafka_topic']}-{row['_kafka_partition']}@{row['_kafka_offset']}"


def _repeated(staged: pa.Table) -> list[str]:
    counted = staged.group_by(list(KEY)).aggregate([([], "count_all")])
    repeated = counted.filter(pc.greater(counted["count_all"], 1))
    if not repeated.num_rows:
        return []
    examples = ", ".join(
        f"{_name(r)} (staged {r['count_all']} times)"
        for r in repeated.sort_by([(k, "ascending") for k in KEY]).slice(0, _EXAMPLES).to_pylist()
    )
    return [f"{repeated.num_rows} coordinate(s) staged more than once, e.g. {examples}"]


def _never_read(staged: pa.Table, ranges: Sequence[OffsetRange]) -> list[str]:
    """Staged coordinates outside every range of the batch (or with a null part)."""
    bounds = pa.table(
        {
            TOPIC: pa.array([r.topic for r in ranges], staged.schema.field(TOPIC).type),
            PARTITION: pa.array([r.partition for r in ranges], staged.schema.field(PARTITION).type),
            "_start": pa.array([r.start for r in ranges], pa.int64()),
            "_end": pa.array([r.end for r in ranges], pa.int64()),
        }
    )
    joined = staged.join(bounds, keys=[TOPIC, PARTITION], join_type="left outer")
    offset = joined[OFFSET]
    inside = pc.and_(pc.greater_equal(offset, joined["_start"]), pc.less(offset, joined["_end"]))
    outside = joined.filter(pc.invert(pc.fill_null(inside, False))).select(list(KEY))
    if not outside.num_rows:
        return []
    examples = ", ".join(
        f"{_name(r)} (never read)"
        for r in outside.sort_by([(k, "ascending") for k in KEY]).slice(0, _EXAMPLES).to_pylist()
    )
    return [f"{outside.num_rows} staged coordinate(s) outside the batch's ranges, e.g. {examples}"]


def _missing(staged: pa.Table | None, read: pa.Table) -> list[str]:
    """Coordinates read but not staged, and staged but not read (both as sets)."""
    read = read.select(list(KEY))
    if staged is None:
        staged = read.schema.empty_table()
    staged = staged.select(list(KEY)).cast(read.schema)
    problems = []
    for label, left, right in (
        ("read but not staged", read, staged),
        ("staged but never read", staged, read),
    ):
        only = left.join(right, keys=list(KEY), join_type="left anti")
        if only.num_rows:
            examples = ", ".join(
                _name(r)
                for r in only.sort_by([(k, "ascending") for k in KEY])
                .slice(0, _EXAMPLES)
                .to_pylist()
            )
            problems.append(f"{only.num_rows} coordinate(s) {label}, e.g. {examples}")
    return problems
