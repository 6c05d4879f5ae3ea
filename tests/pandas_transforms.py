"""pandas transforms that break the contract, for tests/test_pandas_transform.py."""

from __future__ import annotations

import pandas as pd

from jobs.examples.pageviews_pandas import transform as example
from jobs.pandas_transform import pandas_transform

COLUMNS = "event_id string, app string, user string, url string, ts timestamp"


@pandas_transform(COLUMNS)
def drops_errors(records: pd.DataFrame) -> pd.DataFrame:
    """Loses every record that does not parse instead of quarantining it."""
    out = example.pandas_function(records)
    return out[out["_error"].isna()]


@pandas_transform(COLUMNS)
def forgets_error_column(records: pd.DataFrame) -> pd.DataFrame:
    return example.pandas_function(records).drop(columns=["_error"])
