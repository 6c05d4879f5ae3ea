"""A batch's partial for a derived output, computed from the table's staged files in Arrow,
on the driver, without a Spark job.

Why not Spark. A Spark job per derived output, reading the staged files back, cost the stage
about 0.35 s per output and batch whatever the batch's size (docs/derived-tables.md,
"Measured in a real pipeline"): job scheduling and a shuffle for a few hundred groups. The
staged files are a batch's table rows already checked (invariant 9 and the coordinate
check), on the stage's own storage, in a handful of files (one per write task), so reading
them one by one in Arrow and merging the files' partials costs a few tens of
milliseconds and holds one file and the groups in memory, never the batch.

The same result as Spark's. The partial is voted and merged as Spark's was
(jobs/derived/partials.py is the definition), so this computes it only where Arrow's
arithmetic and grouping provably give Spark's answer, and says no otherwise
(`arrow_computes`, `_SumBound`); the stage then runs Spark's job as before
(jobs/stage/staged_partials.py). Where they could differ:

- an integer or decimal sum that may overflow: Spark (ANSI, on by default in Spark 4) fails
  the batch, or gives null with ANSI off; Arrow's sum wraps. A sum is computed here only
  when the sum of the absolute values stays below half the result type's range, so neither
  can overflow;
- a float's min or max over NaN: Spark orders NaN above every number, Arrow skips it. A
  file holding NaN in such a column sends the output to Spark;
- grouping by a float (Spark normalises NaN and -0.0, Arrow hashes their bits), by a string
  with a collation (Spark 4 compares by it), or by a nested value: Spark;
- a window over a column that is not a timestamp: Spark casts strings and dates in the
  session's time zone; Arrow would not parse the same strings. Spark.

The partial's schema is Spark's own (`spark_schema`, analysis only, no job), and the Arrow
result is cast to it: the vote records the same schema a Spark partial had (invariant 14
compares them batch after batch), decimal widening (`sum` of decimal(p, s) is
decimal(p + 10, s)) included.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from jobs.derived.invariants import latest_of, latest_records, recompute_aggregate
from resources.config.derived_spec import AggregateOutput, AnyOutput, PostgresOutput, UpsertOutput
from resources.config.partitioning import partition_values
from resources.object_storage import storage

Aggregation = AggregateOutput | PostgresOutput
#: Errors of an Arrow cast or kernel that Spark may not share: Spark's answer is asked for.
_ARROW_REFUSALS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError)
_INTEGERS = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)


def _groups_alike(kind: T.DataType) -> bool:
    """Whether Arrow groups (and orders keys of) values of Spark type `kind` as Spark does:
    not floats (Spark normalises NaN and -0.0, Arrow hashes their bits), not a string with
    a collation (Spark 4 compares by it), not a nested value."""
    if isinstance(kind, T.StringType):
        return kind == T.StringType()  # the binary collation only
    plain = (*_INTEGERS, T.BinaryType, T.BooleanType, T.DecimalType, T.DateType,
             T.TimestampType, T.TimestampNTZType)  # fmt: skip
    return isinstance(kind, plain)


def arrow_computes(spec: AnyOutput, rows: T.StructType) -> bool:
    """Whether Arrow gives Spark's partial for `spec` over rows of Spark schema `rows`,
    whatever their values; the cases that depend on the values are `_SumBound`'s and
    `_nan_free`'s."""
    types = {f.name: f.dataType for f in rows.fields}
    keys = spec.key if isinstance(spec, UpsertOutput) else spec.group_by
    used = list(keys)
    if not isinstance(spec, UpsertOutput):
        used += [m.column for m in spec.measures if m.column]
        used += [spec.window.column] if spec.window is not None else []
    if any(c not in types for c in used):
        return False  # Spark's partial refuses the output in one line (partials.py `_missing`)
    if not all(_groups_alike(types[k]) for k in keys):
        return False
    if isinstance(spec, UpsertOutput):
        return True
    if spec.window is not None and not isinstance(types[spec.window.column], T.TimestampType):
        return False
    for m in spec.measures:
        kind = types.get(m.column) if m.column else None
        if m.fn == "sum" and not isinstance(kind, (*_INTEGERS, T.DecimalType, T.FloatType,
                                                   T.DoubleType)):  # fmt: skip
            return False
        if m.fn in ("min", "max") and not (
            _groups_alike(kind) or isinstance(kind, (T.FloatType, T.DoubleType))  # type: ignore[arg-type]
        ):
            return False
    return True


def _limit(kind: pa.DataType) -> float:
    """Half the largest magnitude a sum of type `kind` (the partial's) holds: below it, no
    file's sum, no combined sum and no Arrow intermediate can overflow."""
    if pa.types.is_decimal(kind):
        return 0.5 * 10.0 ** (kind.precision - kind.scale)
    return 2.0**62  # bigint, Spark's sum of any integer


@dataclass
class _SumBound:
    """The running sum of the absolute values of each summed column, file after file."""

    limits: Mapping[str, float]
    totals: dict[str, float] = field(default_factory=dict)

    def holds(self, rows: pa.Table) -> bool:
        for column, limit in self.limits.items():
            magnitudes = pc.abs(pc.cast(rows[column], pa.float64(), safe=False))
            absolute = pc.sum(magnitudes).as_py() or 0.0
            self.totals[column] = self.totals.get(column, 0.0) + absolute
            if not self.totals[column] < limit:  # also false for inf and NaN
                return False
        return True


def _nan_free(rows: pa.Table, columns: Sequence[str]) -> bool:
    return not any(pc.any(pc.is_nan(rows[c])).as_py() for c in columns)


def _with_partitions(
    rows: pa.Table, path: str, schema: pa.Schema, partitions: Sequence[str]
) -> pa.Table:
    """The file's rows with its partition columns, read from its `<name>=<value>` folders
    (the file does not hold them: jobs/stage/routing.py `write_routed`)."""
    for name, value in (partition_values(path, partitions) if partitions else {}).items():
        kind = schema.field(name).type
        rows = rows.append_column(
            pa.field(name, kind), pa.array([value] * rows.num_rows, pa.string()).cast(kind)
        )
    return rows.select(schema.names)


def _combine(partials: Sequence[pa.Table], spec: Aggregation, schema: pa.Schema) -> pa.Table:
    """One partial from the files' partials: counts and sums add up, minima and maxima are
    taken again; the groups are the same keys (a null key is one group, as in Spark)."""
    again = {"count": "sum", "sum": "sum", "min": "min", "max": "max"}
    grouped = (
        pa.concat_tables(partials)
        .group_by(spec.key_columns, use_threads=False)
        .aggregate([(m.name, again[m.fn]) for m in spec.measures])
    )
    columns = {k: grouped[k] for k in spec.key_columns}
    columns.update({m.name: grouped[f"{m.name}_{again[m.fn]}"] for m in spec.measures})
    return pa.table(columns).select(schema.names).cast(schema)


def _summed_as(rows: pa.Table, spec: Aggregation, partial: pa.Schema) -> pa.Table:
    """`rows` with each summed decimal or float column in the sum's own type (a decimal
    widened as Spark widens it, a float as a double), so Arrow adds in that type."""
    for m in spec.measures:
        result = partial.field(m.name).type
        if m.fn == "sum" and m.column and not pa.types.is_integer(result):
            rows = rows.set_column(
                rows.schema.get_field_index(m.column), m.column, rows[m.column].cast(result)
            )
    return rows


def partials_from_files(
    files: Sequence[tuple[str, str]],
    outputs: Sequence[tuple[AnyOutput, pa.Schema]],
    rows: T.StructType,
    partitions: Sequence[str] = (),
) -> list[pa.Table | None]:
    """Each output's partial over the staged table files `files` ((uri, path below the
    table's root) each), with Spark's schema (`outputs`: (spec, partial schema) each); None
    for an output where Arrow might not give Spark's answer for these rows (module
    docstring), which the caller asks Spark for instead.

    One pass: each file is read once, for every output (a read per output was a third of
    the partials' cost with the demo's three outputs), and memory holds one file's rows and
    each output's groups, never the batch."""
    schema = to_arrow_schema(rows, timezone="UTC")
    stored = [n for n in schema.names if n not in partitions]
    folds: list[_Fold | None] = [
        (_Latest(spec, partial) if isinstance(spec, UpsertOutput)
         else _Aggregate(spec, schema, partial))
        if arrow_computes(spec, rows) else None
        for spec, partial in outputs
    ]  # fmt: skip
    for uri, path in files:
        if not any(folds):
            break
        table = _with_partitions(storage.read_parquet(uri, stored), path, schema, partitions)
        for i, fold in enumerate(folds):
            if fold is not None and not fold.add(table):
                folds[i] = None
    return [fold.result() if fold is not None else None for fold in folds]


class _Fold:
    """One output's partial, file after file: `add` says False once Arrow's answer might
    not be Spark's (the output then goes to Spark), `result` is the partial."""

    def __init__(self, partial: pa.Schema) -> None:
        self.partial = partial
        self.per_file: list[pa.Table] = []

    def add(self, rows: pa.Table) -> bool:
        try:
            return self._add(rows)
        except _ARROW_REFUSALS:
            return False

    def _add(self, rows: pa.Table) -> bool:
        raise NotImplementedError

    def result(self) -> pa.Table | None:
        if not self.per_file:
            return self.partial.empty_table()
        try:
            return self._combined()
        except _ARROW_REFUSALS:
            return None

    def _combined(self) -> pa.Table:
        raise NotImplementedError


class _Latest(_Fold):
    """Each file's latest record per key, then the latest of those (Kafka order is total)."""

    def __init__(self, spec: UpsertOutput, partial: pa.Schema) -> None:
        super().__init__(partial)
        self.spec = spec

    def _add(self, rows: pa.Table) -> bool:
        self.per_file.append(latest_records(rows, self.spec))
        return True

    def _combined(self) -> pa.Table:
        latest = latest_of(pa.concat_tables(self.per_file), self.spec)
        return latest.select(self.partial.names).cast(self.partial)


class _Aggregate(_Fold):
    """Each file's partial aggregate, combined; refused once a file's values leave what
    Arrow computes as Spark does (`_SumBound`, `_nan_free`)."""

    def __init__(self, spec: Aggregation, schema: pa.Schema, partial: pa.Schema) -> None:
        super().__init__(partial)
        self.spec = spec
        # a double's sum never wraps (it reaches inf, as Spark's does): only exact sums bounded
        summed = [m for m in spec.measures if m.fn == "sum" and m.column]
        self.bound = _SumBound(
            {
                m.column: _limit(partial.field(m.name).type)
                for m in summed
                if m.column and not pa.types.is_floating(partial.field(m.name).type)
            }
        )
        extremes = [m.column for m in spec.measures if m.fn in ("min", "max") and m.column]
        self.floats = [c for c in extremes if pa.types.is_floating(schema.field(c).type)]

    def _add(self, rows: pa.Table) -> bool:
        if not self.bound.holds(rows) or not _nan_free(rows, self.floats):
            return False
        summed = _summed_as(rows, self.spec, self.partial)
        self.per_file.append(
            recompute_aggregate(summed, self.spec)  # type: ignore[arg-type]
            .select(self.partial.names)
            .cast(self.partial)
        )
        return True

    def _combined(self) -> pa.Table:
        return _combine(self.per_file, self.spec, self.partial)
