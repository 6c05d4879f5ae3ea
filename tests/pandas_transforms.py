"""pandas transforms that break the contract, for tests/test_pandas_transform.py, and one
that types JSON orders, for tests/test_types.py."""

from __future__ import annotations

import json
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import pandas as pd

from jobs.examples.pageviews_pandas import transform as example
from jobs.stage.pandas_transform import pandas_transform

COLUMNS = "event_id string, app string, user string, url string, ts timestamp"


@pandas_transform(COLUMNS)
def drops_errors(records: pd.DataFrame) -> pd.DataFrame:
    """Loses every record that does not parse instead of quarantining it."""
    out = example.pandas_function(records)
    return out[out["_error"].isna()]


@pandas_transform(COLUMNS)
def forgets_error_column(records: pd.DataFrame) -> pd.DataFrame:
    return example.pandas_function(records).drop(columns=["_error"])


#: JSON orders as a data engineer's pandas transform types them (tests/test_types.py).
ORDER_COLUMNS = (
    "order_id bigint, amount decimal(12,2), total decimal(38,10), placed date, "
    "at timestamp, local_at timestamp_ntz, rate double"
)


@pandas_transform(ORDER_COLUMNS)
def orders(records: pd.DataFrame) -> pd.DataFrame:
    """Decimals parsed exactly (`parse_float=Decimal`), dates and timestamps from ISO text,
    kept as Python objects: pandas' own datetime64[ns] ends in 2262, and these reach 9999."""
    rows = [json.loads(bytes(v), parse_float=Decimal) for v in records["value"]]

    def decimal(value: Any) -> Decimal | None:
        return None if value is None else Decimal(value)

    def stamp(value: str | None) -> datetime | None:
        return None if value is None else datetime.fromisoformat(value)

    out = pd.DataFrame(index=records.index)
    out["order_id"] = [r["order_id"] for r in rows]
    out["amount"] = pd.Series(
        [decimal(r.get("amount")) for r in rows], index=records.index, dtype=object
    )
    out["total"] = pd.Series(
        [decimal(r.get("total")) for r in rows], index=records.index, dtype=object
    )
    out["placed"] = pd.Series(
        [None if r.get("placed") is None else date.fromisoformat(r["placed"]) for r in rows],
        index=records.index,
        dtype=object,
    )
    out["at"] = pd.Series([stamp(r.get("at")) for r in rows], index=records.index, dtype=object)
    out["local_at"] = pd.Series(
        [stamp(r.get("local_at")) for r in rows], index=records.index, dtype=object
    )
    out["rate"] = [None if r.get("rate") is None else float(r["rate"]) for r in rows]
    out["_error"] = None
    for column in ("_kafka_topic", "_kafka_partition", "_kafka_offset", "_kafka_timestamp"):
        out[column] = records[column]
    out["_batch_id"] = records["_batch_id"]
    out["value"] = records["value"]
    return out
