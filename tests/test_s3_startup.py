"""`exactly run` on S3 checks, before anything runs, that the table's and the quarantine's
buckets exist and that our credentials may use them: else one line naming the bucket and
the problem, exit code 2 (through the real command line, with only AWS variables set)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from resources.jvm.process import free_port
from resources.object_storage.embedded_s3 import S3Server

REPO = Path(__file__).resolve().parent.parent


def run(config: Path, env: dict[str, str]) -> str:
    """The one error line `exactly run` prints, after checking it exited with 2."""
    result = subprocess.run(
        [sys.executable, "-m", "exactly_cli", "run", "-c", str(config), "--batches", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, **env},
    )
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def config_on(tmp_path: Path, table_bucket: str, quarantine_bucket: str) -> Path:
    doc = yaml.safe_load((REPO / "pipelines" / "pageviews.yaml").read_text())
    # nothing listens there: the bucket check must come before any broker connection
    doc["kafka"]["bootstrap_servers"] = f"127.0.0.1:{free_port()}"
    doc["delta"] = {
        "table_uri": f"s3://{table_bucket}/tables/pageviews",
        "quarantine_uri": f"s3://{quarantine_bucket}/tables/pageviews_quarantine",
    }
    doc["ledger"] = {"url": f"sqlite:///{tmp_path / 'ledger.db'}"}
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_missing_bucket_is_one_line_naming_it(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str
) -> None:
    line = run(config_on(tmp_path, s3_bucket, "no-such-bucket"), s3_server.env())

    assert f"bucket no-such-bucket does not exist at {s3_server.endpoint_url}" in line
    assert s3_server.secret_access_key not in line


def test_wrong_credentials_are_one_line_naming_the_bucket(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str
) -> None:
    env = {**s3_server.env(), "AWS_SECRET_ACCESS_KEY": "planted-wrong-secret-81c2"}

    line = run(config_on(tmp_path, s3_bucket, s3_bucket), env)

    assert f"bucket {s3_bucket}: access denied at {s3_server.endpoint_url}" in line
    assert "planted-wrong-secret-81c2" not in line


def test_an_endpoint_that_does_not_answer_is_one_line(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str
) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    env = {**s3_server.env(), "AWS_ENDPOINT_URL": nobody}

    line = run(config_on(tmp_path, s3_bucket, s3_bucket), env)

    assert f"bucket {s3_bucket}: {nobody} does not answer" in line
