"""A Spark standalone cluster on loopback (`resources.spark.standalone_cluster`): it starts with its
workers on 127.0.0.1, says why when it cannot, and runs the product's batches with the
stage job's tasks in executors (derived outputs' partials included), through a classic driver
(`exactly run` with `spark.master: spark://...`) and through a Spark Connect server whose
master is the cluster.

Real cluster, broker and tables; no mocks. Classic sessions on the cluster run in `exactly`
child processes: this process already holds the suite's local session, and pyspark allows
one SparkContext per process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from jobs.examples.sample_data import pageviews
from jobs.wiring.pipeline import build
from ledger.core.errors import ExactlyError, UnreachableError
from ledger.core.protocol import BatchState
from ledger.store.ledger_store import LedgerStore
from resources.failures.causes import WORKER_IMPORT
from resources.kafka.client import KafkaClient
from resources.object_storage.s3 import S3Access
from resources.spark.connect_server import start_connect_server, start_on_a_free_port
from resources.spark.session import build_session, driver_settings, stop_session
from resources.spark.standalone_cluster import SparkCluster, start_spark_cluster
from tests.fixtures.derived import TRANSFORM, assert_derived_match, derived_outputs, user_events
from tests.fixtures.pipeline import assert_exactly_once, config_path
from tests.test_cli import exactly
from tests.test_failure_lines import assert_one_clean_line, cli
from tests.transforms import KILL_MARKER_ENV

# Generous: the 2 cores are shared with the broker, the cluster and other engineers.
CONNECT_START_TIMEOUT = 600.0


@pytest.mark.parametrize(
    "master",
    ["local[2]", "local[*]", "spark://127.0.0.1:7077", "spark://localhost:7077"],
)
def test_a_driver_on_this_machine_listens_on_loopback_only(master: str) -> None:
    # executors of a loopback cluster are on this machine too: they reach the driver there
    assert driver_settings(master) == {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
    }


@pytest.mark.parametrize(
    "master", ["spark://10.0.0.5:7077", "spark://127.0.0.1:7077,10.0.0.6:7077", "yarn"]
)
def test_a_driver_of_a_remote_cluster_keeps_spark_s_own_address(master: str) -> None:
    # a driver bound to 127.0.0.1 would be unreachable from executors on other machines
    assert driver_settings(master) == {}


@pytest.mark.integration
def test_the_cluster_runs_its_workers_on_loopback(spark_cluster: SparkCluster) -> None:
    state = spark_cluster.state()
    assert state["status"] == "ALIVE"
    assert state["url"] == spark_cluster.url
    assert spark_cluster.url.startswith("spark://127.0.0.1:")
    workers = spark_cluster.alive_workers()
    assert [(w["host"], w["cores"], w["memory"]) for w in workers] == [("127.0.0.1", 1, 1024)] * 2


@pytest.mark.integration
def test_start_refuses_a_port_in_use(spark_cluster: SparkCluster, tmp_path: Path) -> None:
    with pytest.raises(ExactlyError, match="already in use"):
        start_spark_cluster(port=spark_cluster.port, work_dir=tmp_path)


@pytest.mark.integration
def test_a_worker_that_cannot_start_reports_its_log(tmp_path: Path) -> None:
    with pytest.raises(UnreachableError, match="worker-1 exited") as failure:
        start_spark_cluster(1, memory="lots", work_dir=tmp_path)
    message = str(failure.value)
    assert "\n" not in message
    assert str(tmp_path / "worker-1.log") in message
    # the master that did start was stopped with it
    assert "RECEIVED SIGNAL TERM" in (tmp_path / "master.log").read_text()


@pytest.mark.integration
def test_exactly_run_commits_on_the_cluster_with_its_driver_on_loopback(
    spark_cluster: SparkCluster, kafka_client: KafkaClient, pipeline_factory: Any, tmp_path: Path
) -> None:
    """A pipeline with one derived output of each kind (their partials computed in the
    executors too) staged on the cluster: every record once, every output equal to its
    recomputation."""
    derived = derived_outputs(tmp_path / "derived")
    config = pipeline_factory(2, master=spark_cluster.url, transform=TRANSFORM, derived=derived)
    kafka_client.produce_records(config.kafka.topic, user_events(0, 400, 2, malformed_every=50))
    before = set(spark_cluster.executor_logs())

    result = exactly("run", "-c", str(config_path(config)), "--until-caught-up")

    assert result.returncode == 0, result.stdout + result.stderr
    table, quarantined = assert_exactly_once(config, kafka_client)
    assert (table + quarantined, quarantined) == (400, 8)
    sizes = assert_derived_match(config)
    assert all(sizes.values()), sizes
    # the Kafka reads and Parquet writes ran in the workers' executors, which got the
    # project's jars from the driver and reached it on loopback
    executors = sorted(set(spark_cluster.executor_logs()) - before)
    assert len(executors) == 2, executors
    for log in executors:
        command = log.read_text(errors="replace").splitlines()[0:3]
        assert any("CoarseGrainedScheduler@127.0.0.1:" in line for line in command), command


@pytest.mark.integration
@pytest.mark.wide  # Connect (test_spark_connect.py) and S3 (test_s3_pipeline.py) on the cluster
def test_a_batch_stages_and_commits_to_s3_through_spark_connect_on_the_cluster(
    spark_cluster: SparkCluster,
    kafka_client: KafkaClient,
    pipeline_factory: Any,
    s3_env: dict[str, str],
    s3_bucket: str,
    tmp_path: Path,
) -> None:
    # the executors get the keys from the Connect server's settings, whatever environment
    # the workers were started with, as on a cluster of other machines
    server = start_on_a_free_port(
        lambda port: start_connect_server(
            port,
            master=spark_cluster.url,
            work_dir=tmp_path / "connect",
            timeout=CONNECT_START_TIMEOUT,
            object_store=S3Access.from_env(),
        )
    )
    with server:
        remote = build_session(server.url)
        try:
            config = pipeline_factory(2, master=server.url, table_root=f"s3://{s3_bucket}/connect")
            kafka_client.produce(config.kafka.topic, pageviews(400, malformed_every=50))
            report = build(config, spark_factory=lambda: remote).run_batch()
            active = spark_cluster.state()["activeapps"]
            apps = [a for a in active if a["name"] == "exactly-connect"]
        finally:
            stop_session(remote)
    assert report is not None
    assert report.output.records_read == 400
    assert assert_exactly_once(config, kafka_client) == (392, 8)
    # the server ran the stage job's tasks in the cluster's executors, not in its own JVM
    assert [a["cores"] for a in apps] == [2], apps
    assert list(spark_cluster.work_dir.glob(f"worker-*/{apps[0]['id']}/*/stderr"))


@pytest.mark.integration
def test_a_lost_executor_is_one_line_and_a_retried_task_lands_each_record_once(
    spark_cluster: SparkCluster, kafka_client: KafkaClient, pipeline_factory: Any, tmp_path: Path
) -> None:
    """The first task attempt SIGKILLs its executor JVM. With no task retries that ends the
    run with one line naming the lost executor (exit code 2, the batch not voted); with
    Spark's retries the task runs again in a new executor, and the killed attempt's
    half-written output must not reach the table: every record once."""
    config = pipeline_factory(
        2, master=spark_cluster.url, transform="tests.transforms:pageviews_killing_its_executor"
    )
    kafka_client.produce(config.kafka.topic, pageviews(200, malformed_every=50))
    path = config_path(config)
    doc = yaml.safe_load(path.read_text())
    marker = f"spark.executorEnv.{KILL_MARKER_ENV}"
    state = tmp_path / "state"

    doc["spark"]["conf"] = {marker: str(tmp_path / "killed-1"), "spark.task.maxFailures": "1"}
    path.write_text(yaml.safe_dump(doc))
    line = assert_one_clean_line(cli("run", "-c", str(path), state_dir=state))
    assert line.startswith(
        f"exactly: error: a Spark executor was lost: Spark at {spark_cluster.url} "
        "(ExecutorLostFailure (executor "
    ), line
    assert (tmp_path / "killed-1").exists()

    doc["spark"]["conf"] = {marker: str(tmp_path / "killed-2")}
    path.write_text(yaml.safe_dump(doc))
    again = cli("run", "-c", str(path), "--until-caught-up", state_dir=state)
    assert again.returncode == 0, again.stdout + again.stderr
    assert (tmp_path / "killed-2").exists()  # an executor did die under this run
    assert assert_exactly_once(config, kafka_client) == (196, 4)


@pytest.mark.integration
def test_a_module_the_workers_cannot_import_is_one_line_saying_what_to_do(
    spark_cluster: SparkCluster, kafka_client: KafkaClient, pipeline_factory: Any, tmp_path: Path
) -> None:
    """The driver imports the transform's module (the suite's folder is its working
    directory); the cluster's Python workers do not have it. One line naming the module and
    what to do, exit code 2, and nothing voted (that a run after a failed stage commits
    every record once is the lost-executor test's)."""
    config = pipeline_factory(
        1, master=spark_cluster.url, transform="tests.transforms:pageviews_via_a_top_level_udf"
    )
    kafka_client.produce(config.kafka.topic, pageviews(20), partition=0)
    path = config_path(config)
    state = tmp_path / "state"

    line = assert_one_clean_line(cli("run", "-c", str(path), state_dir=state))
    assert line.startswith(
        f"exactly: error: {WORKER_IMPORT}: Spark at {spark_cluster.url} "
        "(No module named 'tests'); install it where Spark runs its Python workers"
    ), line

    store = LedgerStore(config.ledger.url)
    assert [b.state for b in store.batches(pipeline=config.pipeline)] == [BatchState.PLANNED]
    store.dispose()
