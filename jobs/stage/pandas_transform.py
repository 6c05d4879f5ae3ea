"""Transforms written in pandas: `pandas.DataFrame -> pandas.DataFrame`, run by Spark.

A pipeline's transform is named in the config (`transform: module:function`) and takes and
returns a Spark DataFrame. Decorating a pandas function with `@pandas_transform(columns)`
makes it one: Spark runs it on Arrow batches of the records (`mapInPandas`), so it scales
like any Spark job while the logic is plain pandas, testable without Spark.

The contract is the Spark transform's (jobs/examples/pageviews.py): the function receives
`key`, `value` (bytes) and the coordinate columns, and must return the coordinate columns
and `value` unchanged, plus `_error` (None for a record that parsed, else why not) and the
columns it declares in `columns` (Spark DDL, e.g. `"app string, ts timestamp"`). Rows are
never dropped or duplicated silently: the stage's per-coordinate check (jobs/stage/coordinates.py)
fails a batch whose output does not hold every coordinate read exactly once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import pandas as pd
from pyspark.sql import DataFrame

from ledger.core.layout import BATCH_ID, OFFSET, PARTITION, TIMESTAMP, TOPIC

#: What every transform keeps or adds, with its Spark type (jobs/stage/routing.py's contract).
CONTRACT = (
    (TOPIC, "string"),
    (PARTITION, "int"),
    (OFFSET, "bigint"),
    (TIMESTAMP, "timestamp"),
    (BATCH_ID, "bigint"),
    ("value", "binary"),
    ("_error", "string"),
)

PandasFunction = Callable[[pd.DataFrame], pd.DataFrame]
SparkTransform = Callable[[DataFrame], DataFrame]


def column_names(ddl: str) -> list[str]:
    """The top-level column names of a Spark DDL column list (`a string, b map<string,int>`)."""
    names, depth, field = [], 0, ""
    for char in f"{ddl},":
        depth += char in "<("
        depth -= char in ">)"
        if char == "," and depth == 0:
            field = field.strip()
            if field.startswith("`"):
                names.append(field[1 : field.index("`", 1)])
            elif field:
                names.append(field.split()[0])
            field = ""
        else:
            field += char
    return names


def pandas_transform(columns: str) -> Callable[[PandasFunction], SparkTransform]:
    """Declare a pandas function as a transform that adds `columns` (Spark DDL)."""
    declared = column_names(columns)
    clash = sorted(set(declared) & {name for name, _ in CONTRACT})
    if clash:
        raise ValueError(f"pandas_transform columns {clash} are the contract's own; drop them")
    schema = ", ".join([columns.strip(), *(f"`{name}` {kind}" for name, kind in CONTRACT)])
    order = [*declared, *(name for name, _ in CONTRACT)]

    def decorate(function: PandasFunction) -> SparkTransform:
        name = f"{function.__module__}:{function.__qualname__}"

        def each_batch(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
            for batch in batches:
                out = function(batch)
                missing = [c for c in order if c not in out.columns]
                if missing:
                    raise ValueError(
                        f"pandas transform {name} returned no column(s) {missing}: it must "
                        "keep the _kafka_* and _batch_id columns and `value`, add `_error` "
                        f"and the columns it declares ({', '.join(declared)})"
                    )
                yield out[order]

        @functools.wraps(function)
        def spark_transform(records: DataFrame) -> DataFrame:
            return records.mapInPandas(each_batch, schema)

        spark_transform.pandas_function = function  # type: ignore[attr-defined]
        return spark_transform

    return decorate
