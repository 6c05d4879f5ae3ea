"""Where the JVM jars fetched by `mvn` (jvm/pom.xml) live, and which of them to load.

Nothing resolves packages at run time: Spark and the broker load only these files.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ledger.core.errors import ConfigError

_REPO_ROOT = Path(__file__).resolve().parents[2]
_VERSIONED = re.compile(r"^(?P<name>.+?)-\d[\w.\-]*\.jar$")


def jars_dir() -> Path:
    """The folder holding `spark/`, `s3a/`, `kafka/` and `s3proxy/`; EXACTLY_JARS_DIR overrides
    the repo's `.jars`."""
    return Path(os.environ.get("EXACTLY_JARS_DIR", _REPO_ROOT / ".jars")).resolve()


def _jar_files(kind: str) -> list[Path]:
    folder = jars_dir() / kind
    jars = sorted(folder.glob("*.jar"))
    if not jars:
        raise ConfigError(
            f"no {kind} jars in {folder}: run `make setup` (mvn -f jvm/pom.xml "
            "dependency:copy-dependencies) first"
        )
    return jars


def artifact_name(jar: Path) -> str:
    """`jackson-core-2.13.5.jar` -> `jackson-core`."""
    match = _VERSIONED.match(jar.name)
    return match.group("name") if match else jar.stem


def pyspark_jars() -> list[Path]:
    """The jars pyspark ships: Spark and the Hadoop client it was built with."""
    import pyspark

    return sorted((Path(pyspark.__file__).parent / "jars").glob("*.jar"))


def spark_jars(object_store: bool = False) -> list[Path]:
    """Jars for Spark's classpath: Kafka source, spark-avro and Delta, minus what pyspark ships;
    with `object_store`, also Hadoop's s3a filesystem and the AWS SDK it calls.

    Transitive dependencies such as Hadoop, Jackson, Parquet or Scala are in pyspark's own
    `jars/` folder at the versions Spark was built with; loading a second copy would make the
    class that wins depend on classpath order. The s3a jars (the SDK bundle is ~690 MB) are
    loaded only by sessions whose tables are in object storage.
    """
    shipped = {artifact_name(j) for j in pyspark_jars()}
    kinds = ["spark", "s3a"] if object_store else ["spark"]
    return [j for kind in kinds for j in _jar_files(kind) if artifact_name(j) not in shipped]


def pyspark_hadoop_version() -> str:
    """The Hadoop version pyspark was built with, read from its hadoop-client-api jar: the
    only hadoop-aws version whose classes match the Hadoop classes Spark loads."""
    for jar in pyspark_jars():
        match = re.fullmatch(r"hadoop-client-api-(?P<version>\d[\w.\-]*)\.jar", jar.name)
        if match:
            return match.group("version")
    raise ConfigError("pyspark ships no hadoop-client-api jar: cannot tell its Hadoop version")


def kafka_classpath() -> str:
    """The embedded broker's classpath, kept apart from Spark's."""
    return os.pathsep.join(str(j) for j in _jar_files("kafka"))
