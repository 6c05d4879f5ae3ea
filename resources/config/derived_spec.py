"""What a derived output is: an aggregate or an upsert by key, kept beside the raw table.

Validated the way the pipeline config is (resources/config/pipeline_config.py): unknown keys
and bad values are errors naming the field, in one line, because an output that silently
aggregates the wrong column is as bad as a lost record.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter, ValidationError, field_validator, model_validator
from sqlalchemy.engine import make_url

from ledger.core.errors import ConfigError, RefusedBatchError
from ledger.core.layout import ROUTE
from resources.config.env_values import EnvValue, OptionValue
from resources.config.partitioning import PartitionColumn, check_unique
from resources.config.strict import _NAME, _Strict

#: A column name the MERGE's SQL can name without surprises (quoted with backticks there).
_COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
#: A Spark window duration: "1 minute", "30 seconds", "2 hours".
_DURATION = re.compile(
    r"^\s*\d+\s+(microsecond|millisecond|second|minute|hour|day|week)s?\s*$", re.IGNORECASE
)
_UNIT_US = {
    "microsecond": 1,
    "millisecond": 1_000,
    "second": 1_000_000,
    "minute": 60_000_000,
    "hour": 3_600_000_000,
    "day": 86_400_000_000,
    "week": 7 * 86_400_000_000,
}
#: The columns an aggregate table gets for its window.
WINDOW_START, WINDOW_END = "window_start", "window_end"
#: Columns the partials add; an output may not use them for anything else. `_deleted` is
#: also an upsert table's column (its tombstone rows); `_absent` only marks, in a replace's
#: partial, a key left with no record, which the MERGE deletes (jobs/derived/replace.py).
DELETED = "_deleted"
ABSENT = "_absent"
#: Columns of the stage's frame that never reach a derived output (jobs/stage/routing.py: Kafka's
#: value, the transform's error, the routed write's columns).
STAGE_ONLY = ("value", "_error", "_raw_value", ROUTE)


def _column(value: str) -> str:
    if not _COLUMN.match(value):
        raise ValueError(
            f"{value!r} is not a plain column name (letters, digits, '_', not starting "
            "with a digit)"
        )
    return value


class Measure(_Strict):
    """One measure of an aggregate: `count` counts rows; the others fold one column."""

    name: str
    fn: Literal["count", "sum", "min", "max"]
    column: str | None = None

    @field_validator("name", "column")
    @classmethod
    def _plain(cls, value: str | None) -> str | None:
        return None if value is None else _column(value)

    @model_validator(mode="after")
    def _column_matches_fn(self) -> Measure:
        if self.fn == "count" and self.column is not None:
            raise ValueError(f"measure {self.name}: count counts rows, give it no column")
        if self.fn != "count" and self.column is None:
            raise ValueError(f"measure {self.name}: {self.fn} needs a column")
        return self


class Window(_Strict):
    """A tumbling event-time window: every row falls in exactly one [start, end)."""

    column: str
    size: str

    @field_validator("column")
    @classmethod
    def _plain(cls, value: str) -> str:
        return _column(value)

    @field_validator("size")
    @classmethod
    def _duration(cls, value: str) -> str:
        if not _DURATION.match(value):
            raise ValueError(f"{value!r} is not a duration like '1 minute' or '30 seconds'")
        if int(value.split()[0]) == 0:
            raise ValueError("a window of size 0 holds nothing")
        return " ".join(value.split())

    @property
    def micros(self) -> int:
        """The size in microseconds: fixed units only (no months), so every window of a
        spec is equally long and aligned to the epoch, as Spark's `window` aligns them."""
        number, unit = self.size.split()
        return int(number) * _UNIT_US[unit.lower().removesuffix("s")]


class _Named(_Strict):
    name: str

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("must be letters, digits, '_', '.' or '-' (at most 128)")
        return value

    def app_id(self, pipeline_app_id: str) -> str:
        """The output's own application id in its Delta table's log (or its PostgreSQL
        state row): the pipeline's (live or backfill) with the output's name, so each output
        is idempotent on its own and a live batch and a backfill batch of the same id never
        shadow each other."""
        return f"{pipeline_app_id}.derived.{self.name}"


class _Output(_Named):
    table_uri: str = Field(min_length=1)


class _Aggregation(_Strict):
    """Group-by columns and measures, optionally per window: what an aggregate output
    keeps, whichever store holds it (a Delta table, a PostgreSQL table)."""

    group_by: list[str] = Field(min_length=1)
    measures: list[Measure] = Field(min_length=1)
    window: Window | None = None

    @field_validator("group_by")
    @classmethod
    def _plain(cls, value: list[str]) -> list[str]:
        return [_column(v) for v in value]

    @model_validator(mode="after")
    def _distinct_names(self) -> _Aggregation:
        names = [*self.group_by, *(m.name for m in self.measures)]
        if self.window is not None:
            names += [WINDOW_START, WINDOW_END]
        seen: set[str] = set()
        for name in names:
            # Delta column names are case-insensitive
            if name.lower() in seen:
                raise ValueError(
                    f"column {name} appears twice in the output (group_by, measure names"
                    f"{', window_start/window_end' if self.window else ''})"
                )
            seen.add(name.lower())
        return self

    @property
    def key_columns(self) -> list[str]:
        """The columns that identify a row of the aggregate table."""
        window = [WINDOW_START, WINDOW_END] if self.window is not None else []
        return [*self.group_by, *window]


class AggregateOutput(_Output, _Aggregation):
    """Group-by columns and measures, optionally per tumbling event-time window.

    The stage computes the batch's partial aggregate; the commit MERGEs it into the table:
    counts and sums add, min and max combine (resources/delta/merge.py).
    """

    kind: Literal["aggregate"]
    #: the table's partition columns: the date of `window_start` in a time zone
    #: (resources/delta/window_dates.py); empty: unpartitioned
    partition_by: list[PartitionColumn] = Field(default_factory=list)

    @model_validator(mode="after")
    def _partitioned_by_window_dates(self) -> AggregateOutput:
        """Only a windowed aggregate is partitioned, by its window's start: the one source
        that is part of every row's key, so a group stays in its partition."""
        if not self.partition_by:
            return self
        if self.window is None:
            raise ValueError("partition_by needs a window (it partitions by the window's date)")
        check_unique(self.partition_by)
        taken = {c.lower() for c in [*self.key_columns, *(m.name for m in self.measures)]}
        for column in self.partition_by:
            if column.date_of != WINDOW_START:
                raise ValueError(
                    f"partition_by {column.name}: date_of must be {WINDOW_START}, not "
                    f"{column.date_of}"
                )
            if column.name.lower() in taken:
                raise ValueError(f"column {column.name} appears twice in the output")
        return self


class UpsertOutput(_Output):
    """The latest record per key by Kafka order; a tombstone (null Kafka value) deletes it."""

    kind: Literal["upsert"]
    key: list[str] = Field(min_length=1)

    @field_validator("key")
    @classmethod
    def _plain(cls, value: list[str]) -> list[str]:
        value = [_column(v) for v in value]
        if len({v.lower() for v in value}) != len(value):
            raise ValueError("a key column appears twice")
        return value

    @property
    def key_columns(self) -> list[str]:
        return list(self.key)


#: PostgreSQL cuts longer identifiers silently (NAMEDATALEN - 1), so two long names could
#: become one column.
PG_MAX_IDENTIFIER = 63
#: A table name, optionally schema-qualified: `views_per_app`, `dash.views_per_app`.
_PG_TABLE = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]{0,62}\.)?[A-Za-z_][A-Za-z0-9_]{0,62}$")


class PostgresOutput(_Named, _Aggregation):
    """An aggregate kept in a PostgreSQL table, for dashboards that read a database.

    Each batch's partial is applied in one SQL transaction together with the batch id in
    `exactly_output_state`, a compare-and-set on the batch id (resources/postgres/apply.py).

    `url` is a SQLAlchemy URL. A URL that holds a password must be given as `{env: NAME}`
    (resources/config/env_values.py `EnvValue`), so the config, the Dagster UI, the logs and
    the ledger never hold it; a URL without one (trust, peer or a `.pgpass`) may be written
    out.
    """

    kind: Literal["postgres"]
    url: OptionValue
    table: str

    @field_validator("url")
    @classmethod
    def _no_password_in_the_config(cls, value: OptionValue) -> OptionValue:
        if isinstance(value, EnvValue):
            return value
        try:
            parsed = make_url(value)
        except Exception:
            raise ValueError("is not a database URL") from None
        if not parsed.drivername.startswith("postgresql"):
            raise ValueError(f"is a {parsed.drivername} URL, not a postgresql one")
        if parsed.password is not None:
            raise ValueError(
                "holds a password: give the URL as {env: NAME}, the environment variable "
                "that holds it"
            )
        return value

    @field_validator("table")
    @classmethod
    def _table(cls, value: str) -> str:
        if not _PG_TABLE.match(value):
            raise ValueError(
                f"{value!r} is not a plain table name (letters, digits, '_', at most "
                f"{PG_MAX_IDENTIFIER}, optionally schema.table)"
            )
        return value

    @model_validator(mode="after")
    def _short_names(self) -> PostgresOutput:
        names = [*self.group_by, *(m.name for m in self.measures)]
        for name in names:
            if len(name) > PG_MAX_IDENTIFIER:
                raise ValueError(
                    f"column {name} is longer than PostgreSQL's {PG_MAX_IDENTIFIER} "
                    "characters (it would be cut silently)"
                )
        return self


OutputSpec = Annotated[AggregateOutput | UpsertOutput | PostgresOutput, Field(discriminator="kind")]
AnyOutput = AggregateOutput | UpsertOutput | PostgresOutput
_ADAPTER: TypeAdapter[AnyOutput] = TypeAdapter(OutputSpec)
_KINDS = ("aggregate", "upsert", "postgres")


def parse_output(data: Any, where: str = "derived") -> AnyOutput:
    """Validate one output's spec; every problem named in one line (ConfigError)."""
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as exc:
        problems = []
        for item in exc.errors():
            # the discriminator's tag ("aggregate"/"upsert"/...) is noise in a location,
            # and so is the union's member ("str", "EnvValue") of `url`
            loc = [str(p) for p in item["loc"] if p not in (*_KINDS, "str", "EnvValue")]
            if item["type"] in ("union_tag_invalid", "union_tag_not_found"):
                loc.append("kind")
            at = ".".join([where, *loc])
            if item["type"] == "extra_forbidden":
                problems.append(f"{at}: unknown key")
            elif item["type"] == "missing":
                problems.append(f"{at}: required key is missing")
            else:
                problems.append(f"{at}: {item['msg'].removeprefix('Value error, ')}")
        raise ConfigError(f"invalid derived output: {'; '.join(problems)}") from None


def replace_refusal(spec: AnyOutput) -> str | None:
    """Why a `replace` backfill cannot keep this output right, or None if it can.

    A replace swaps a committed range's rows for a new stage's. An aggregate follows by a
    correction: subtract the old range's partial, add the new one. Counts and sums can be
    subtracted; a min or a max cannot (removing the row that was the minimum leaves no way
    to know the next one without reading every row of the group again), so an aggregate with
    one is refused. An aggregate without a count is refused too: a replace that removes the
    last rows of a group must delete the group, and only a count says when that happens (a
    sum can reach 0 with rows left). An upsert follows by rebuilding the affected keys from
    the raw table.

    A PostgreSQL output is refused whatever its measures: min and max for the reason above,
    counts and sums because the correction partial (negated, groups deleted at count 0) is
    not written for it yet, and a replace that left the dashboard's table as it was would
    be silently wrong.
    """
    if isinstance(spec, UpsertOutput):
        return None
    lossy = [m.name for m in spec.measures if m.fn in ("min", "max")]
    if lossy:
        return (
            f"derived output {spec.name}: a replace backfill would have to subtract the "
            f"replaced rows from measure(s) {', '.join(lossy)}, but min and max cannot be "
            "subtracted (only count and sum can); rebuild the output from the raw table "
            "instead"
        )
    if isinstance(spec, PostgresOutput):
        return (
            f"derived output {spec.name}: a replace backfill cannot correct PostgreSQL "
            f"table {spec.table} yet (subtracting the replaced rows' counts and sums is not "
            "written for PostgreSQL outputs); rebuild the table from the raw table instead"
        )
    if not any(m.fn == "count" for m in spec.measures):
        return (
            f"derived output {spec.name}: a replace backfill must delete a group it empties, "
            "and without a count measure nothing says when a group is empty; add a count "
            "measure or rebuild the output from the raw table instead"
        )
    return None


def correction_count(spec: AggregateOutput) -> str:
    """The count measure a replace's correction deletes emptied groups by (a group with no
    raw row left must not stay as a row of count 0: invariant 1 on the output). Refused
    with `replace_refusal`'s sentence for an output a correction cannot keep right."""
    reason = replace_refusal(spec)
    if reason is not None:
        raise RefusedBatchError(reason)
    return next(m.name for m in spec.measures if m.fn == "count")
