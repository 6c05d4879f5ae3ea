"""Spark Connect: a server started by `start_connect_server` serves remote sessions that read
exact Kafka ranges and write Delta that delta-rs reads, beside the classic session fixture.

Real server, broker and tables; no mocks. One server per module (its JVM takes 15-30 s to
start here); each test opens and stops its own remote session, which costs milliseconds.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import functions as F
from pyspark.sql.utils import is_remote

from ledger.core.errors import ConfigError, ExactlyError, UnreachableError
from resources.jvm.process import free_port
from resources.kafka.client import KafkaClient
from resources.spark.connect_server import (
    ConnectServer,
    start_connect_server,
    start_on_a_free_port,
)
from resources.spark.session import build_session, stop_session
from tests.fixtures.spark_conf import TINY_TABLES_CONF
from tests.test_spark_kafka_delta import assert_reads_exact_ranges

pytestmark = pytest.mark.integration

# Generous: the 2 cores are shared with the broker, a classic Spark JVM and other engineers.
SERVER_START_TIMEOUT = 600.0


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    folder = tmp_path_factory.mktemp("connect")
    server = start_on_a_free_port(
        lambda port: start_connect_server(port, work_dir=folder, timeout=SERVER_START_TIMEOUT)
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def remote(connect_server: ConnectServer) -> Iterator[Any]:
    """A remote session of its own; stopping it returns the process to classic mode."""
    session = build_session(connect_server.url)
    for key, value in TINY_TABLES_CONF.items():
        session.conf.set(key, value)
    try:
        yield session
    finally:
        stop_session(session)


def test_server_listens_on_loopback_and_answers_a_query(
    connect_server: ConnectServer, remote: Any
) -> None:
    assert connect_server.url.startswith("sc://127.0.0.1:")
    assert connect_server.running()
    assert is_remote()
    assert remote.version == "4.2.0"
    assert remote.range(5).selectExpr("sum(id) AS s").collect()[0]["s"] == 10
    # the server was started with Delta's extension and the project's Parquet settings
    assert remote.conf.get("spark.sql.extensions") == "io.delta.sql.DeltaSparkSessionExtension"
    assert remote.conf.get("spark.sql.parquet.outputTimestampType") == "TIMESTAMP_MICROS"
    assert remote.conf.get("spark.sql.session.timeZone") == "UTC"


def test_same_url_reuses_the_open_session(connect_server: ConnectServer, remote: Any) -> None:
    assert build_session(connect_server.url) is remote


def test_remote_delta_table_reads_back_remotely_and_through_delta_rs(
    remote: Any, tmp_path: Path
) -> None:
    uri = str(tmp_path / "t")
    ts = datetime(2026, 1, 1, tzinfo=UTC)
    df = remote.createDataFrame(
        [(1, "web", ts), (2, "ios", ts), (3, None, ts)], "id long, app string, ts timestamp"
    ).withColumn("day", F.to_date("ts"))  # a Connect column: F follows the session's mode
    df.write.format("delta").save(uri)

    back = remote.read.format("delta").load(uri).orderBy("id").collect()
    assert [(r["id"], r["app"]) for r in back] == [(1, "web"), (2, "ios"), (3, None)]
    assert {r["ts"].timestamp() for r in back} == {1767225600.0}

    table = DeltaTable(uri).to_pyarrow_table().sort_by("id")
    assert table.column("id").to_pylist() == [1, 2, 3]
    assert table.column("app").to_pylist() == ["web", "ios", None]
    assert table.schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert {t.timestamp() for t in table.column("ts").to_pylist()} == {1767225600.0}
    # written as INT64 microseconds, not Spark's default INT96
    for name in DeltaTable(uri).file_uris():
        column = pq.ParquetFile(name).schema.column(pq.ParquetFile(name).schema.names.index("ts"))
        assert column.physical_type == "INT64"


def test_remote_session_reads_exact_kafka_ranges(
    remote: Any, kafka_client: KafkaClient, topic_factory: Any
) -> None:
    assert_reads_exact_ranges(remote, kafka_client, topic_factory(3))


def test_classic_session_works_beside_and_after_a_remote_one(
    spark: Any, connect_server: ConnectServer
) -> None:
    mode_before = "SPARK_CONNECT_MODE_ENABLED" in os.environ
    session = build_session(connect_server.url)
    try:
        assert session.range(3).count() == 3
        assert spark.range(4).count() == 4  # the classic session keeps running meanwhile
        with pytest.raises(ConfigError, match="one API mode per process"):
            build_session("local[2]")
    finally:
        stop_session(session)
    assert ("SPARK_CONNECT_MODE_ENABLED" in os.environ) == mode_before
    assert not is_remote()
    # classic column functions are classic again
    assert spark.range(4).select(F.sum(F.col("id"))).first()[0] == 6


def test_unreachable_url_fails_at_once() -> None:
    with pytest.raises(UnreachableError, match="no Spark Connect server listens"):
        build_session(f"sc://127.0.0.1:{free_port()}")
    assert not is_remote()


def test_start_refuses_a_port_in_use(connect_server: ConnectServer, tmp_path: Path) -> None:
    with pytest.raises(ExactlyError, match="already in use"):
        start_connect_server(connect_server.port, work_dir=tmp_path)


def test_a_server_that_cannot_start_reports_its_log(tmp_path: Path) -> None:
    # an invalid driver memory makes the launcher fail before the JVM listens
    with pytest.raises(UnreachableError, match="exited") as failure:
        start_connect_server(free_port(), {"spark.driver.memory": "lots"}, work_dir=tmp_path)
    assert str(tmp_path / "connect-server.log") in str(failure.value)


def test_a_port_taken_while_the_server_starts_is_an_error_not_a_server(tmp_path: Path) -> None:
    """The port is free when the start checks it and taken before the JVM binds it (in CI,
    by the server's own Spark driver, whose RPC took the same ephemeral port). The port then
    answers, but not as our server: the start must fail naming the port, not hand out a URL
    whose clients retry for ten minutes."""
    port = free_port()
    taken = socket.socket()

    def take(_pid: int) -> None:
        taken.bind(("127.0.0.1", port))
        taken.listen()

    try:
        with pytest.raises(UnreachableError, match=f"127.0.0.1:{port}") as failure:
            start_connect_server(
                port, work_dir=tmp_path, on_launch=take, timeout=SERVER_START_TIMEOUT
            )
    finally:
        taken.close()
    assert "could not bind" in str(failure.value)
    assert str(tmp_path / "connect-server.log") in str(failure.value)


def test_a_whole_batch_stages_and_commits_through_spark_connect(
    remote: Any, kafka_client: KafkaClient, pipeline_factory: Any
) -> None:
    """The product's own stage job, not only reads: `spark.master: sc://...` must run the
    pipeline end to end, quarantine included (every 50th record is malformed)."""
    from jobs.examples.sample_data import pageviews
    from jobs.wiring.pipeline import build
    from tests.fixtures.pipeline import assert_exactly_once

    config = pipeline_factory(2)
    kafka_client.produce(config.kafka.topic, pageviews(400, malformed_every=50))
    tpc = build(config, spark_factory=lambda: remote)
    report = tpc.run_batch()
    assert report is not None
    assert report.output.records_read == 400
    table_rows, quarantined = assert_exactly_once(config, kafka_client)
    assert (table_rows, quarantined) == (392, 8)


def test_progress_is_sampled_from_what_the_server_streams(remote: Any, tmp_path: Path) -> None:
    """The stage's progress line on a shared server (resources/spark/progress.py): the
    figures come from the progress the server streams with the query, tasks done of all."""
    import threading
    import time

    from resources.spark.progress import StageProgress, watch

    samples: list[StageProgress] = []
    lock = threading.Lock()

    def keep(sample: StageProgress) -> None:
        with lock:
            samples.append(sample)

    # 8 tasks of 50 rows at 25 ms a row on 2 cores: about 5 s, several progress reports
    frame = remote.range(0, 400, numPartitions=8).select(
        F.col("id"), F.expr("reflect('java.lang.Thread', 'sleep', cast(25 as bigint))").alias("z")
    )
    with watch(remote, keep, 0.2):
        frame.write.parquet(str(tmp_path / "out"))
    count = len(samples)
    assert count >= 2, samples
    assert all(s.tasks == 8 and s.records_written is None for s in samples), samples
    done = [s.tasks_done for s in samples]
    assert done == sorted(done) and done[-1] > done[0], done
    time.sleep(0.5)
    assert len(samples) == count  # the handler is removed with the watch
    remote.range(10).collect()
    assert len(samples) == count
