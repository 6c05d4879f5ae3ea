"""Spark sessions that load the project's own jars (Kafka source, Delta) and nothing else.

`local[*]` by default; any master URL, or a Spark Connect URL (`sc://host:port`), from
config. Parquet timestamps are written as TIMESTAMP_MICROS because delta-rs cannot read
Spark's default INT96.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

import dagster as dg

from resources.jars import spark_jars

#: Modest defaults for a 2-core, 24 GiB machine shared with a broker and Dagster.
DEFAULT_CONF: Mapping[str, str] = {
    "spark.driver.memory": "2g",
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.compression.codec": "snappy",
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.databricks.delta.schema.autoMerge.enabled": "false",
    # Kafka reads are bounded by explicit offsets; never wait on a consumer group.
    "spark.sql.streaming.kafka.useDeprecatedOffsetFetching": "false",
}


def build_session(
    master: str = "local[*]", conf: Mapping[str, str] | None = None, app_name: str = "exactly"
):  # -> pyspark.sql.SparkSession
    """Create (or return the running) Spark session with the project's jars and settings."""
    from pyspark.sql import SparkSession

    # the Python workers must run the interpreter that has our packages
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    settings = {**DEFAULT_CONF, **(conf or {})}
    if master.startswith("local"):
        # a local session talks only to itself: keep it on loopback
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        settings.setdefault("spark.driver.host", "127.0.0.1")
        settings.setdefault("spark.driver.bindAddress", "127.0.0.1")
    if master.startswith("sc://"):
        builder = SparkSession.builder.remote(master)
        # a Connect server owns its classpath and static settings; send only SQL settings
        settings = {
            k: v
            for k, v in settings.items()
            if k.startswith("spark.sql.")
            and k not in ("spark.sql.extensions", "spark.sql.catalog.spark_catalog")
        }
    else:
        jars = [str(j) for j in spark_jars()]
        classpath = os.pathsep.join(jars)
        builder = SparkSession.builder.master(master).appName(app_name)
        settings.update(
            {
                "spark.jars": ",".join(jars),
                "spark.driver.extraClassPath": classpath,
                "spark.executor.extraClassPath": classpath,
            }
        )
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    if not master.startswith("sc://"):
        session.sparkContext.setLogLevel("ERROR")
    return session


class SparkResource(dg.ConfigurableResource):
    """Spark for Dagster ops: the session is created on first use and reused in the run."""

    master: str = "local[*]"
    conf: dict[str, str] = {}

    def session(self):  # -> pyspark.sql.SparkSession
        return build_session(self.master, self.conf)
