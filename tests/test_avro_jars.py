"""The spark-avro jar `make setup` fetched is on the classpath every session is given
(resources/jvm/jars.py `spark_jars`: local, standalone through `spark.jars`, the Spark Connect
server), at pyspark's Spark version, and the Avro library it calls is pyspark's own copy, not
a second one whose classes would depend on classpath order."""

from __future__ import annotations

import pyspark

from resources.jvm.jars import artifact_name, pyspark_jars, spark_jars


def test_spark_avro_is_loaded_at_pysparks_version() -> None:
    names = [j.name for j in spark_jars() if artifact_name(j) == "spark-avro_2.13"]
    assert names == [f"spark-avro_2.13-{pyspark.__version__}.jar"]


def test_the_avro_library_is_pysparks_alone() -> None:
    assert any(artifact_name(j) == "avro" for j in pyspark_jars())
    assert not [j.name for j in spark_jars() if artifact_name(j) in ("avro", "avro-mapred")]
