"""A whole pipeline on S3: the real broker, Spark through s3a, delta-rs committing on a real
S3-compatible server (s3proxy on loopback), pointed at it by the standard AWS variables alone.

Every produced record ends up exactly once in table + quarantine, read back through delta-rs
and through delta-spark (s3a). The server's secret key is made up per start and planted as
AWS_SECRET_ACCESS_KEY; it must appear nowhere the product writes: the CLI's output, Spark's
event log, the ledger database, both tables' Delta logs (read through boto3), and a Dagster
micro-batch run's run config, event log and compute logs.

Spark runs in child processes (`exactly run`, a read-back script, a Dagster run worker): a
session with s3a's jars cannot be made in a process whose Spark session started without them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from jobs.examples.sample_data import pageviews
from resources.config.loading import load_config
from resources.config.pipeline_config import PipelineConfig
from resources.object_storage.embedded_s3 import S3Server
from resources.object_storage.s3 import S3Access
from tests.fixtures.pipeline import assert_exactly_once, coordinates

RUN_TIMEOUT = 600
NAME = "s3pv"
DAGSTER_EXECUTE = [str(Path(sys.executable).parent / "dagster"), "job", "execute"]
JOB = f"{NAME}_next_batch"

#: Reads both tables through delta-spark over s3a, in a Spark session made as the pipeline's.
READ_BACK = """
import json, sys
from jobs.stage.spark_stager import SharedSpark
from resources.object_storage import storage
from resources.config.loading import load_config

config = load_config(sys.argv[1])
spark = SharedSpark.for_config(config)()
# tests/fixtures/spark_conf.py TINY_TABLES_CONF (this child imports nothing from tests/)
spark.conf.set("spark.databricks.delta.snapshotPartitions", "2")
found = {}
for name, uri in (("table", config.delta.table_uri), ("quarantine", config.delta.quarantine_uri)):
    rows = spark.read.format("delta").load(storage.spark_uri(uri))
    found[name] = [[r[0], r[1]] for r in rows.select("_kafka_partition", "_kafka_offset").collect()]
print("READ_BACK " + json.dumps(found))
"""


def write_config(
    folder: Path,
    bucket: str,
    bootstrap: str,
    topic: str,
    max_records: int = 150,
    prefix: str = "",
) -> PipelineConfig:
    """A pipeline with both tables in `bucket` (below `prefix`), its ledger and Spark event
    log in `folder`: nothing about the store but the s3:// URIs (the AWS variables say where
    and who)."""
    events = folder / "spark-events"
    events.mkdir(parents=True, exist_ok=True)
    doc = {
        "pipeline": NAME,
        "kafka": {"bootstrap_servers": bootstrap, "topic": topic},
        "delta": {
            "table_uri": f"s3://{bucket}/{prefix}{NAME}",
            "quarantine_uri": f"s3://{bucket}/{prefix}{NAME}_quarantine",
        },
        "ledger": {"url": f"sqlite:///{folder / 'ledger.db'}"},
        "spark": {
            "master": "local[2]",
            "conf": {"spark.eventLog.enabled": "true", "spark.eventLog.dir": events.as_uri()},
        },
        "batch": {"max_records_per_partition": max_records, "lease_seconds": 30},
        "transform": "jobs.examples.pageviews:transform",
    }
    path = folder / f"{NAME}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_config(path)


def exactly(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exactly_cli", *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )


def delta_log_bytes(access: S3Access, uri: str) -> bytes:
    """Every object of a table's `_delta_log/`, concatenated, read through boto3."""
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    client = access.boto3_client()
    listed = client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/_delta_log/")
    keys = [o["Key"] for o in listed.get("Contents", [])]
    assert any(k.endswith(".json") for k in keys), f"no Delta log under {uri}: {keys}"
    return b"".join(client.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys)


def files_holding(folder: Path, secret: bytes) -> list[str]:
    """Every file below `folder` whose bytes contain `secret`."""
    return sorted(str(p) for p in folder.rglob("*") if p.is_file() and secret in p.read_bytes())


def test_a_whole_pipeline_on_s3_commits_every_record_once_and_leaks_no_secret(
    s3_server: S3Server,
    s3_bucket: str,
    s3_env: dict[str, str],
    kafka_broker: str,
    kafka_client: Any,
    topic_factory: Any,
    tmp_path: Path,
) -> None:
    secret = s3_env["AWS_SECRET_ACCESS_KEY"]
    assert secret == s3_server.secret_access_key and len(secret) >= 32
    # keys as people name folders: a space, a '%', an accent (tests/test_table_paths.py
    # has the same on local disk), one spelling for s3a, delta-rs and boto3 alike
    config = write_config(
        tmp_path, s3_bucket, kafka_broker, topic_factory(3), prefix="data lake 100% é/"
    )
    kafka_client.produce(config.kafka.topic, pageviews(900, malformed_every=50))

    run = exactly("run", "-c", str(tmp_path / "s3pv.yaml"), "--until-caught-up")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "caught up" in run.stdout + run.stderr
    ledger = exactly("ledger", "-c", str(tmp_path / "s3pv.yaml"), "--json")
    assert ledger.returncode == 0, ledger.stdout + ledger.stderr

    # through delta-rs (the AWS variables alone point it at the server)
    assert assert_exactly_once(config, kafka_client) == (882, 18)
    # through delta-spark, over s3a
    read = subprocess.run(
        [sys.executable, "-c", READ_BACK, str(tmp_path / "s3pv.yaml")],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    assert read.returncode == 0, read.stdout + read.stderr
    found = json.loads(read.stdout.split("READ_BACK ", 1)[1])
    table, quarantine = (Counter(map(tuple, found[t])) for t in ("table", "quarantine"))
    # the very rows delta-rs reads: the same coordinates, each once
    assert table == coordinates(config.delta.table_uri)
    assert quarantine == coordinates(config.delta.quarantine_uri)

    planted = secret.encode()
    for name, text in (("run", run.stdout + run.stderr), ("ledger", ledger.stdout)):
        assert secret not in text, f"the secret is in `exactly {name}`'s output"
    assert secret not in read.stdout + read.stderr
    assert list((tmp_path / "spark-events").iterdir()), "Spark wrote no event log"
    assert files_holding(tmp_path, planted) == []  # ledger.db, event logs, config
    access = S3Access.from_env()
    for uri in (config.delta.table_uri, config.delta.quarantine_uri):
        log = delta_log_bytes(access, uri)
        assert b'"appId":"s3pv"' in log.replace(b" ", b"")
        assert planted not in log, f"the secret is in {uri}'s Delta log"


def test_a_dagster_micro_batch_run_on_s3_keeps_the_secret_out_of_the_instance(
    s3_server: S3Server,
    s3_bucket: str,
    s3_env: dict[str, str],
    kafka_broker: str,
    kafka_client: Any,
    topic_factory: Any,
    tmp_path: Path,
) -> None:
    secret = s3_env["AWS_SECRET_ACCESS_KEY"].encode()
    folder = tmp_path / "pipelines"
    # one run is one batch: all the records in it
    config = write_config(folder, s3_bucket, kafka_broker, topic_factory(2), max_records=1000)
    kafka_client.produce(config.kafka.topic, pageviews(300, malformed_every=50))
    home = tmp_path / "dagster_home"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        # the code location's next-batch job, run by Dagster's CLI in a process of its own
        # (Spark starts there, with s3a) on this instance (DAGSTER_HOME is its folder)
        run = subprocess.run(
            [*DAGSTER_EXECUTE, "-m", "orchestration.definitions", "-a", "defs", "-j", JOB],
            env={**os.environ, "EXACTLY_PIPELINES_DIR": str(folder), "DAGSTER_HOME": str(home)},
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
        )
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        runs = instance.get_runs()
        assert len(runs) == 1 and runs[0].status == dg.DagsterRunStatus.SUCCESS
        stored = json.dumps(runs[0].run_config) + "".join(
            str(e) for e in instance.all_logs(runs[0].run_id)
        )
        assert "s3pv_commit" in stored
        assert secret.decode() not in stored
    assert secret.decode() not in run.stdout + run.stderr
    assert assert_exactly_once(config, kafka_client) == (294, 6)
    assert files_holding(home, secret) == []  # run storage, event logs, compute logs
    assert files_holding(folder, secret) == []  # ledger, Spark's event log


def test_a_session_started_without_s3a_is_refused_for_s3_tables(
    spark: Any, s3_env: dict[str, str]
) -> None:
    """getOrCreate would hand back the process's running session, whose classpath has no
    s3a: refused at once, not after Spark has staged a batch."""
    from ledger.core.errors import ConfigError
    from resources.spark.session import build_session

    with pytest.raises(ConfigError, match="without the s3a filesystem is already running"):
        build_session("local[2]", object_store=S3Access.from_env())
