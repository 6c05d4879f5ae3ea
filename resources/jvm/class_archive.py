"""A class-data archive for the Spark driver's JVM: every `exactly run` starts ~3 s sooner.

A Spark driver loads some 15,000 classes before its first job, parsing and verifying each
from pyspark's jars and ours; on this project's 2-core machine that is a third of a small
batch's run. The JDK can map those classes from an archive written by an earlier JVM with
the same classpath (AppCDS, JDK 13+: one run with `-XX:ArchiveClassesAtExit`, then every run
with `-XX:SharedArchiveFile`). `make setup` writes one archive per driver classpath (with and
without the s3a jars), and `resources.spark.session.build_session` hands it to the driver.

What can go wrong, and why none of it can fail a run:
- The archive is stale (a jar or the JDK changed since it was written): the file name
  carries a digest of the JDK and every jar's path, size and time, so a changed classpath
  names a file that does not exist, and the driver starts without one. Should a stale file
  still be named (a jar rewritten within the same second, at the same size), the JVM checks
  the classpath and the JDK itself and loads classes the usual way; its warning, which it
  would print on stdout, is turned off with `-Xlog:cds`.
- The archive is missing, unreadable or truncated: the JVM starts without it, silently.
- Two set-ups write at once: each writes its own temporary file and renames it into place.
- `EXACTLY_CLASS_ARCHIVE=0` turns the archive off, for anyone who wants to rule it out.

Only the classes of the JDK's own loaders are archived (pyspark's jars and ours, all on the
driver's classpath), and only the driver's: executors of a standalone cluster and Spark
Connect servers start the usual way.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from resources.jvm.jars import jars_dir, pyspark_jars, spark_jars
from resources.jvm.process import java_executable

#: Set to 0 to start every driver without the archive.
ARCHIVE_ENV = "EXACTLY_CLASS_ARCHIVE"
#: The JVM's own messages about the archive (a stale one, classes it cannot store) go to
#: stdout, where the command line promises only its own lines.
QUIET = "-Xlog:cds=off,cds+dynamic=off"
#: How long writing one archive may take: a driver's start, one small job, and the dump.
BUILD_TIMEOUT = 600


def archive_path(object_store: bool) -> Path:
    """Where the archive for this JDK and this classpath lives (it may not exist)."""
    # The resolved path: an alternatives symlink switched to another JDK must change the name.
    digest = hashlib.sha256(os.path.realpath(java_executable()).encode())
    for jar in [*spark_jars(object_store), *pyspark_jars()]:
        stat = jar.stat()
        digest.update(f"\0{jar}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    kind = "s3a" if object_store else "plain"
    return jars_dir() / "class-archives" / f"{kind}-{digest.hexdigest()[:16]}.jsa"


def enabled() -> bool:
    return os.environ.get(ARCHIVE_ENV, "").strip() != "0"


def driver_java_options(object_store: bool) -> str | None:
    """The driver's JVM options that map the archive, or None when there is none to map."""
    if not enabled():
        return None
    try:
        path = archive_path(object_store)
    except OSError:
        return None  # a jar vanished under us: the session's own start says so
    if not path.is_file():
        return None
    return f"-XX:SharedArchiveFile={path} {QUIET}"


#: The training run: a driver started as `build_session` starts one, one small write and
#: read (Spark SQL, Parquet, Hadoop's filesystem), then a clean exit, at which the JVM dumps
#: every class it loaded.
_TRAIN = """
import sys
from pyspark.core.context import SparkContext
from resources.object_storage.s3 import S3Access
from resources.spark.session import build_session

target, out, object_store = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
access = S3Access(region="us-east-1", endpoint_url="http://127.0.0.1:9", allow_http=True)
session = build_session(
    "local[2]",
    conf={"spark.driver.extraJavaOptions": f"-XX:ArchiveClassesAtExit={target} " + sys.argv[4]},
    object_store=access if object_store else None,
)
frame = session.createDataFrame([(i, str(i)) for i in range(100)], "a long, b string")
frame.write.mode("overwrite").parquet(out)
assert session.read.parquet(out).count() == 100
proc = SparkContext._gateway.proc
session.stop()
proc.stdin.close()  # the gateway exits on end of input, and dumps the archive as it does
proc.wait(timeout=300)
"""


def build(object_store: bool) -> Path:
    """Write this classpath's archive unless it is there already; return its path."""
    path = archive_path(object_store)
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as work:
        target = Path(work) / path.name
        env = {**os.environ, ARCHIVE_ENV: "0"}
        done = subprocess.run(
            [sys.executable, "-c", _TRAIN, str(target), str(Path(work) / "out"),
             "1" if object_store else "0", QUIET],
            capture_output=True, text=True, timeout=BUILD_TIMEOUT, env=env,
        )  # fmt: skip
        if done.returncode != 0 or not target.is_file():
            raise RuntimeError(
                f"writing the class-data archive {path.name} failed "
                f"(exit {done.returncode}):\n{done.stderr[-3000:]}"
            )
        os.replace(target, path)
    for old in path.parent.glob(f"{path.name.rsplit('-', 1)[0]}-*.jsa"):
        if old != path:
            old.unlink(missing_ok=True)  # a former classpath's: no driver can map it again
    return path


def main() -> int:
    """`python -m resources.jvm.class_archive`: both archives, as `make setup` writes them
    (side by side: each is mostly one JVM's start, which uses one core)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        for path in pool.map(build, (False, True)):
            print(f"[setup] class-data archive: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
