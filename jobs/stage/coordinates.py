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

import numpy as np
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
        problems += _staged_problems(staged, ranges)
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


@dataclass(frozen=True)
class _Positions:
    """The batch's ranges laid end to end: the coordinate (t, p, o) inside range i sits at
    `base[i] + o - start[i]`, one int64 per coordinate, ordered as the coordinates are
    (ranges sorted by topic and partition). So a repeat is a repeated position, and the
    coordinates' three columns, a string among them, are hashed by no one."""

    ranges: list[OffsetRange]
    start: np.ndarray
    end: np.ndarray
    base: np.ndarray
    #: the positions there are: the ranges' offsets together
    span: int

    @classmethod
    def of(cls, ranges: Sequence[OffsetRange]) -> _Positions:
        ordered = sorted(ranges, key=lambda r: (r.topic, r.partition))
        start = np.array([r.start for r in ordered], dtype=np.int64)
        end = np.array([r.end for r in ordered], dtype=np.int64)
        spans = np.maximum(end - start, 0)
        return cls(ordered, start, end, np.cumsum(spans) - spans, int(spans.sum()))

    def locate(self, staged: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        """Each staged row's position, and the rows (indices) inside no range: a topic or
        partition the batch did not read, an offset outside its range, or a null part."""
        topics = sorted({r.topic for r in self.ranges})
        topic = _topic_codes(staged[TOPIC], topics)
        partition = _ints(staged[PARTITION], PARTITION)
        offset = _ints(staged[OFFSET], OFFSET)
        most = max(r.partition for r in self.ranges)
        which = np.full((len(topics), most + 1), -1, dtype=np.int64)
        code = {t: i for i, t in enumerate(topics)}
        for i, r in enumerate(self.ranges):
            which[code[r.topic], r.partition] = i
        known = (topic >= 0) & (partition >= 0) & (partition <= most) & (offset >= 0)
        index = np.full(len(offset), -1, dtype=np.int64)
        index[known] = which[topic[known], partition[known]]
        # index -1 reads the last range's bounds: `index >= 0` keeps those rows outside
        start = self.start[index]
        inside = (index >= 0) & (offset >= start) & (offset < self.end[index])
        return (self.base[index] + offset - start)[inside], np.flatnonzero(~inside)

    def coordinate(self, position: int) -> str:
        i = int(np.searchsorted(self.base, position, side="right")) - 1
        r = self.ranges[i]
        return f"{r.topic}-{r.partition}@{r.start + position - int(self.base[i])}"


def _topic_codes(values: pa.ChunkedArray, topics: list[str]) -> np.ndarray:
    """Each row's index in `topics`, -1 for another topic or a null; a column that holds no
    strings is refused like `_ints`'s."""
    kind = values.type.value_type if pa.types.is_dictionary(values.type) else values.type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise RefusedBatchError(
            f"the staged column {TOPIC} is {values.type}, not a string: a transform must keep "
            "the Kafka coordinates as they were read (invariant 13)"
        )
    return _ints(pc.index_in(values, value_set=pa.array(topics, pa.string())), TOPIC)


def _ints(values: pa.ChunkedArray | pa.Array, name: str) -> np.ndarray:
    """An integer column as int64, a null as -1 (no coordinate part is negative).

    Any other type is refused rather than converted: a transform that turned the partition
    into a double could stage 1.5, which a truncation would read as partition 1."""
    if not pa.types.is_integer(values.type):
        raise RefusedBatchError(
            f"the staged column {name} is {values.type}, not an integer: a transform must keep "
            "the Kafka coordinates as they were read (invariant 13)"
        )
    return np.asarray(pc.fill_null(values, -1).to_numpy(), dtype=np.int64)


def _staged_problems(staged: pa.Table, ranges: Sequence[OffsetRange]) -> list[str]:
    """Coordinates staged more than once, and staged coordinates outside every range of the
    batch (or with a null part)."""
    if not ranges:
        return _never_read(staged)
    layout = _Positions.of(ranges)
    positions, outside = layout.locate(staged)
    return _repeated(layout, positions) + _never_read(staged.take(outside))


def _repeated(layout: _Positions, positions: np.ndarray) -> list[str]:
    """Positions seen more than once: counted in one array of the ranges' span when the
    ranges are dense, by a sort when they are not (a compacted topic's range can span far
    more offsets than it holds records)."""
    if layout.span <= 4 * len(positions) + 1_000_000:
        counts = np.bincount(positions, minlength=layout.span)
        repeated = np.flatnonzero(counts > 1)
        times = counts[repeated]
    else:
        values, counts = np.unique(positions, return_counts=True)
        repeated, times = values[counts > 1], counts[counts > 1]
    if not repeated.size:
        return []
    examples = ", ".join(
        f"{layout.coordinate(int(p))} (staged {int(n)} times)"
        for p, n in zip(repeated[:_EXAMPLES], times[:_EXAMPLES], strict=True)
    )
    return [f"{repeated.size} coordinate(s) staged more than once, e.g. {examples}"]


def _never_read(outside: pa.Table) -> list[str]:
    """Staged coordinates outside every range of the batch (or with a null part)."""
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
