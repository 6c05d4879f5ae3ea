"""Transforms used by the backfill tests: a 'fixed' version of the page-view transform."""

from __future__ import annotations

import os

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from jobs.examples.pageviews import transform as pageviews


def pageviews_v2(records: DataFrame) -> DataFrame:
    """The same parse, with the app name upper-cased: shows which rows a replace rewrote."""
    return pageviews(records).withColumn("app", F.upper("app"))


#: Set (to anything) to make `pageviews_or_fail` fail the way a transient Spark error does.
FAIL_STAGE_ENV = "EXACTLY_TEST_FAIL_STAGE"


def pageviews_or_fail(records: DataFrame) -> DataFrame:
    """The page-view transform, or, while $EXACTLY_TEST_FAIL_STAGE is set, a stage that dies:
    a run that fails between plan and vote, as a lost executor or a Kafka timeout makes it."""
    if os.environ.get(FAIL_STAGE_ENV):
        raise RuntimeError("simulated transient stage failure (EXACTLY_TEST_FAIL_STAGE is set)")
    return pageviews(records)
