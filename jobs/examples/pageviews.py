"""The shipped example transform: page-view JSON into typed columns.

A transform receives the batch's Kafka records as a DataFrame with `key`, `value` (binary)
and the coordinate columns `_kafka_topic`, `_kafka_partition`, `_kafka_offset`,
`_kafka_timestamp`, `_batch_id`. It returns a DataFrame that keeps the coordinate columns
and `value`, plus `_error`: null for a record that parsed, else why it did not. Rows with
an `_error` go to the quarantine table with their raw value; nothing is dropped.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ledger.core.layout import COORDINATES

PAGEVIEW = T.StructType(
    [
        T.StructField("event_id", T.StringType()),
        T.StructField("app", T.StringType()),
        T.StructField("user", T.StringType()),
        T.StructField("url", T.StringType()),
        T.StructField("ts", T.StringType()),
        T.StructField("_corrupt", T.StringType()),
    ]
)


def transform(records: DataFrame) -> DataFrame:
    text = F.col("value").cast("string")
    # a JSON object at the top, checked separately: from_json also accepts `[...]`
    is_object = F.ltrim(text).startswith("{")
    parsed = F.from_json(
        text, PAGEVIEW, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt"}
    )
    with_json = records.withColumn("_p", F.when(is_object, parsed))
    error = (
        F.when(F.col("value").isNull(), F.lit("record has no value"))
        .when(F.col("_p").isNull(), F.lit("value is not a JSON object"))
        .when(F.col("_p._corrupt").isNotNull(), F.lit("value is not valid JSON"))
        .when(F.col("_p.app").isNull(), F.lit("missing field: app"))
    )
    return with_json.select(
        F.col("_p.event_id").alias("event_id"),
        F.col("_p.app").alias("app"),
        F.col("_p.user").alias("user"),
        F.col("_p.url").alias("url"),
        F.try_to_timestamp(F.col("_p.ts")).alias("ts"),
        *COORDINATES,
        "value",
        error.alias("_error"),
    )
