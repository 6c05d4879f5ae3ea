"""What a derived output is: an aggregate or an upsert by key, kept beside the raw table.

Validated the way the pipeline config is (resources/config.py): unknown keys and bad values
are errors naming the field, in one line, because an output that silently aggregates the
wrong column is as bad as a lost record.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter, ValidationError, field_validator, model_validator

from ledger.errors import ConfigError
from resources.strict import _NAME, _Strict

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
#: Columns the partials add; an output may not use them for anything else.
DELETED = "_deleted"
#: Columns of the stage's frame that never reach a derived output (jobs/stage.py: Kafka's
#: value, the transform's error, the routed write's columns).
STAGE_ONLY = ("value", "_error", "_raw_value", "exactly_output")
#: The coordinates every partial reads (jobs/coordinates.py KEY, jobs/stage.py COORDINATES).
PARTITION, OFFSET = "_kafka_partition", "_kafka_offset"


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


class _Output(_Strict):
    name: str
    table_uri: str = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("must be letters, digits, '_', '.' or '-' (at most 128)")
        return value

    def app_id(self, pipeline_app_id: str) -> str:
        """The output's own application id in its Delta table's log: the pipeline's (live
        or backfill) with the output's name, so each output is idempotent on its own and a
        live batch and a backfill batch of the same id never shadow each other."""
        return f"{pipeline_app_id}.derived.{self.name}"


class AggregateOutput(_Output):
    """Group-by columns and measures, optionally per tumbling event-time window.

    The stage computes the batch's partial aggregate; the commit MERGEs it into the table:
    counts and sums add, min and max combine (derived/merge.py).
    """

    kind: Literal["aggregate"]
    group_by: list[str] = Field(min_length=1)
    measures: list[Measure] = Field(min_length=1)
    window: Window | None = None

    @field_validator("group_by")
    @classmethod
    def _plain(cls, value: list[str]) -> list[str]:
        return [_column(v) for v in value]

    @model_validator(mode="after")
    def _distinct_names(self) -> AggregateOutput:
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


OutputSpec = Annotated[AggregateOutput | UpsertOutput, Field(discriminator="kind")]
_ADAPTER: TypeAdapter[AggregateOutput | UpsertOutput] = TypeAdapter(OutputSpec)


def parse_output(data: Any, where: str = "derived") -> AggregateOutput | UpsertOutput:
    """Validate one output's spec; every problem named in one line (ConfigError)."""
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as exc:
        problems = []
        for item in exc.errors():
            # the discriminator's tag ("aggregate"/"upsert") is noise in a location
            loc = [str(p) for p in item["loc"] if p not in ("aggregate", "upsert")]
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


def replace_refusal(spec: AggregateOutput | UpsertOutput) -> str | None:
    """Why a `replace` backfill cannot keep this output right, or None if it can.

    A replace swaps a committed range's rows for a new stage's. An aggregate follows by a
    correction: subtract the old range's partial, add the new one. Counts and sums can be
    subtracted; a min or a max cannot (removing the row that was the minimum leaves no way
    to know the next one without reading every row of the group again), so an aggregate with
    one is refused. An upsert follows by rebuilding the affected keys from the raw table.
    """
    if isinstance(spec, UpsertOutput):
        return None
    lossy = [m.name for m in spec.measures if m.fn in ("min", "max")]
    if not lossy:
        return None
    return (
        f"derived output {spec.name}: a replace backfill would have to subtract the replaced "
        f"rows from measure(s) {', '.join(lossy)}, but min and max cannot be subtracted "
        "(only count and sum can); rebuild the output from the raw table instead"
    )
