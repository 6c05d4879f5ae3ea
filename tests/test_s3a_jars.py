"""The s3a jars match the Hadoop that pyspark ships, and load only for object storage.

hadoop-aws calls into Hadoop classes that pyspark loads from its own jars; a hadoop-aws of
another version fails at run time (NoSuchMethodError) on the first s3a:// path, after Spark
has started. These tests catch that before: the pom's default against pyspark's jar, and the
jars `make setup` fetched against both.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from resources.jvm.jars import artifact_name, pyspark_hadoop_version, spark_jars

_POM = Path(__file__).resolve().parent.parent / "jvm" / "s3a" / "pom.xml"
_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def test_the_poms_hadoop_version_is_the_one_pyspark_ships() -> None:
    declared = ET.parse(_POM).getroot().find("m:properties/m:hadoop.version", _NS)
    assert declared is not None, f"{_POM} declares no hadoop.version"
    assert declared.text == pyspark_hadoop_version()


def test_the_fetched_hadoop_aws_is_the_one_pyspark_ships() -> None:
    aws = [j.name for j in spark_jars(object_store=True) if artifact_name(j) == "hadoop-aws"]
    assert aws == [f"hadoop-aws-{pyspark_hadoop_version()}.jar"]


def test_only_object_storage_sessions_load_the_aws_sdk() -> None:
    local = {artifact_name(j) for j in spark_jars()}
    remote = {artifact_name(j) for j in spark_jars(object_store=True)}
    assert "hadoop-aws" not in local and "bundle" not in local
    assert {"hadoop-aws", "bundle"} <= remote
    # nothing pyspark ships twice (Hadoop's own client jars come from pyspark)
    assert not any(name.startswith("hadoop-client") for name in remote)
