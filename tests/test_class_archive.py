"""resources/jvm/class_archive.py: the driver maps its classes from the archive `make setup`
writes, and an archive that does not fit the classpath costs time, never a line or a run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from resources.jvm import class_archive
from resources.jvm.jars import jars_dir

#: A driver started as `exactly run` starts one, then one small job; prints "rows N".
DRIVER = """
import sys
from resources.spark.session import build_session
session = build_session("local[1]", conf={"spark.driver.extraJavaOptions": sys.argv[1]})
print("rows", session.range(7).count())
"""


def start_driver(own_options: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", DRIVER, own_options],
        capture_output=True, text=True, timeout=300, env={**os.environ, **env},
    )  # fmt: skip


def fake_jars(root: Path) -> Path:
    (root / "spark").mkdir(parents=True)
    jar = root / "spark" / "exactly-test-1.0.jar"
    jar.write_bytes(b"one")
    return jar


def test_the_archive_is_named_for_its_classpath_and_a_changed_jar_names_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jar = fake_jars(tmp_path)
    monkeypatch.setenv("EXACTLY_JARS_DIR", str(tmp_path))
    before = class_archive.archive_path(object_store=False)
    assert before.parent == tmp_path / "class-archives"
    jar.write_bytes(b"two, longer")
    assert class_archive.archive_path(object_store=False) != before


def test_options_name_the_archive_only_when_it_is_there_and_wanted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_jars(tmp_path)
    monkeypatch.setenv("EXACTLY_JARS_DIR", str(tmp_path))
    monkeypatch.delenv(class_archive.ARCHIVE_ENV, raising=False)
    assert class_archive.driver_java_options(object_store=False) is None
    path = class_archive.archive_path(object_store=False)
    path.parent.mkdir()
    path.write_bytes(b"an archive")
    options = class_archive.driver_java_options(object_store=False)
    assert options is not None
    assert f"-XX:SharedArchiveFile={path}" in options
    assert class_archive.QUIET in options
    monkeypatch.setenv(class_archive.ARCHIVE_ENV, "0")
    assert class_archive.driver_java_options(object_store=False) is None


@pytest.mark.integration
def test_a_driver_maps_sparks_classes_from_the_archive_setup_wrote(tmp_path: Path) -> None:
    """Before the archive, every class came from a jar ("source: jar:file:..." or
    "source: file:..."); with it, Spark's own classes come from the archive."""
    class_archive.build(object_store=False)
    loads = tmp_path / "class-load.log"
    done = start_driver(f"-Xlog:class+load=info:file={loads}", {})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rows 7" in done.stdout
    spark = [line for line in loads.read_text().splitlines() if "org.apache.spark." in line]
    shared = [line for line in spark if "shared objects file (top)" in line]
    assert len(shared) > len(spark) / 2, spark[:5]
    assert "org.apache.spark.SparkContext source: shared objects file (top)" in "\n".join(spark)


@pytest.mark.integration
def test_an_archive_that_does_not_fit_the_classpath_is_passed_over_without_a_word(
    tmp_path: Path,
) -> None:
    """The archive of the s3a classpath, found under the name of the plain one (the JDK's
    own check is the last guard against a stale archive): the JVM would say so on stdout."""
    other = class_archive.build(object_store=True)
    (tmp_path / "spark").symlink_to(jars_dir() / "spark")
    env = {"EXACTLY_JARS_DIR": str(tmp_path)}
    named = subprocess.run(
        [sys.executable, "-c",
         "from resources.jvm.class_archive import archive_path; print(archive_path(False))"],
        capture_output=True, text=True, check=True, env={**os.environ, **env},
    ).stdout.strip()  # fmt: skip
    Path(named).parent.mkdir()
    shutil.copyfile(other, named)
    loads = tmp_path / "class-load.log"
    done = start_driver(f"-Xlog:class+load=info:file={loads}", env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "rows 7", done.stdout
    assert "cds" not in done.stderr.lower(), done.stderr
    assert "shared objects file (top)" not in loads.read_text()
