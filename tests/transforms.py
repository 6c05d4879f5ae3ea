"""Transforms used by the backfill tests: a 'fixed' version of the page-view transform."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from jobs.examples.pageviews import transform as pageviews


def pageviews_v2(records: DataFrame) -> DataFrame:
    """The same parse, with the app name upper-cased: shows which rows a replace rewrote."""
    return pageviews(records).withColumn("app", F.upper("app"))
