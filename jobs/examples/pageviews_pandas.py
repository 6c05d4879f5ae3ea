"""The shipped example transform again, in pandas (jobs/stage/pandas_transform.py).

Same input, same columns and the same `_error` texts as the Spark transform
(jobs/examples/pageviews.py), so either can be named in a config: `transform:
jobs.examples.pageviews_pandas:transform`. tests/test_pandas_transform.py checks that both
land the same rows and quarantine the same records.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from jobs.stage.pandas_transform import pandas_transform
from ledger.core.layout import COORDINATES

FIELDS = ("event_id", "app", "user", "url", "ts")


def parse(value: bytes | None) -> tuple[dict[str, Any], str | None]:
    """One record's fields and its error (None if it parsed), as the Spark transform says."""
    if value is None:
        return {}, "record has no value"
    text = bytes(value).decode("utf-8", errors="replace")
    if not text.lstrip().startswith("{"):
        return {}, "value is not a JSON object"
    try:
        event = json.loads(text)
    except ValueError:
        return {}, "value is not valid JSON"
    fields = {f: None if event.get(f) is None else str(event[f]) for f in FIELDS}
    if fields["app"] is None:
        return fields, "missing field: app"
    return fields, None


@pandas_transform("event_id string, app string, user string, url string, ts timestamp")
def transform(records: pd.DataFrame) -> pd.DataFrame:
    parsed = [parse(v) for v in records["value"]]
    out = pd.DataFrame([fields for fields, _ in parsed], columns=list(FIELDS), index=records.index)
    out["ts"] = pd.to_datetime(out["ts"], utc=True, errors="coerce", format="ISO8601")
    out["_error"] = [error for _, error in parsed]
    for column in COORDINATES:
        out[column] = records[column]
    out["value"] = records["value"]
    return out
