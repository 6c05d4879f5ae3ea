"""resources/jvm/options.py: EXACTLY_JVM_OPTIONS reaches every JVM the project starts, after
the project's own options, and a value that is not a list of options is one line.

The suite sets it for every JVM it starts (tests/conftest.py, `SUITE_JVM_OPTIONS`), so the
integration tests here look at the JVMs the shared fixtures started: the broker, the S3
server, the Spark driver, a Connect server and a standalone cluster's daemons.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from ledger.core.errors import ConfigError
from resources.jvm.options import JVM_OPTIONS_ENV, operator_jvm_options, with_operator_options
from resources.jvm.process import process_args
from resources.spark.session import java_options
from tests.conftest import SUITE_JVM_OPTIONS


def test_options_are_split_as_a_shell_splits_them() -> None:
    env = {JVM_OPTIONS_ENV: "-Xmx2g  -Djavax.net.ssl.trustStore='/etc/my store.jks'"}
    assert operator_jvm_options(env) == ["-Xmx2g", "-Djavax.net.ssl.trustStore=/etc/my store.jks"]
    assert operator_jvm_options({}) == []


@pytest.mark.parametrize(
    ("value", "named"),
    [("-Xmx2g com.example.Main", "'com.example.Main' is not a JVM option"),
     ("-Dx='unclosed", "cannot be split into options")],
)  # fmt: skip
def test_a_value_that_is_not_options_is_one_line_naming_the_variable(
    value: str, named: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        operator_jvm_options({JVM_OPTIONS_ENV: value})
    assert JVM_OPTIONS_ENV in str(refused.value) and named in str(refused.value)


def test_sparks_options_put_the_archive_first_and_the_configs_own_last() -> None:
    env = {JVM_OPTIONS_ENV: "-XX:TieredStopAtLevel=1 -Dmark='a b'"}
    assert with_operator_options("-Xss4m", env) == "-XX:TieredStopAtLevel=1 '-Dmark=a b' -Xss4m"
    assert with_operator_options(None, {}) is None
    assert with_operator_options("-Xss4m", {}) == "-Xss4m"


def test_a_session_gives_the_driver_the_archive_and_both_the_operators_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(JVM_OPTIONS_ENV, "-Dfrom=operator")
    own = {"spark.driver.extraJavaOptions": "-Dfrom=config"}
    found = java_options(own, archive="-XX:SharedArchiveFile=/a.jsa")
    assert found["spark.driver.extraJavaOptions"] == (
        "-XX:SharedArchiveFile=/a.jsa -Dfrom=operator -Dfrom=config"
    )
    assert found["spark.executor.extraJavaOptions"] == "-Dfrom=operator"
    monkeypatch.delenv(JVM_OPTIONS_ENV)
    assert java_options({}) == {}


def listening_command_line(port: int) -> list[str]:
    """The command line of the process listening on `port` over IPv4 or IPv6: its socket's
    inode from the kernel's table of TCP sockets, then the process holding that inode."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            listening = fields[3] == "0A"
            if listening and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            fds = list(fd_dir.iterdir())
        except OSError:
            continue  # gone, or not ours to read
        for fd in fds:
            try:
                if os.readlink(fd) in inodes:
                    return process_args(int(fd_dir.parent.name))
            except OSError:
                continue  # closed since it was listed: a busy JVM opens and closes many
    raise AssertionError(f"nothing listens on port {port}")


def has_suite_options(command: list[str]) -> bool:
    return all(option in command for option in SUITE_JVM_OPTIONS.split())


def test_the_suite_sets_its_options_for_every_jvm() -> None:
    assert os.environ[JVM_OPTIONS_ENV] == SUITE_JVM_OPTIONS


def test_the_broker_and_the_s3_server_run_with_the_operators_options(
    kafka_broker: str, s3_server: Any
) -> None:
    assert has_suite_options(listening_command_line(int(kafka_broker.rsplit(":", 1)[1])))
    port = urlparse(s3_server.endpoint_url).port
    assert port is not None and has_suite_options(listening_command_line(port))


def test_the_spark_driver_runs_with_the_operators_options(spark: Any) -> None:
    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    assert has_suite_options(list(runtime.getInputArguments()))


@pytest.mark.wide  # the driver's, broker's and S3 server's options above are `make test`'s
def test_a_standalone_clusters_daemons_run_with_the_operators_options(spark_cluster: Any) -> None:
    assert has_suite_options(listening_command_line(spark_cluster.port))


@pytest.mark.integration
@pytest.mark.wide
def test_a_connect_server_runs_with_the_operators_options(tmp_path: Path) -> None:
    from resources.spark.connect_server import start_connect_server, start_on_a_free_port

    server = start_on_a_free_port(
        lambda port: start_connect_server(port, work_dir=tmp_path, timeout=180)
    )
    try:
        assert has_suite_options(listening_command_line(server.port))
    finally:
        server.stop()


def test_a_run_whose_jvm_options_are_not_options_is_one_line_and_the_next_run_finishes(
    kafka_client: Any, pipeline_factory: Any
) -> None:
    import subprocess
    import sys

    from jobs.examples.sample_data import pageviews
    from tests.fixtures.pipeline import assert_exactly_once, config_path

    config = pipeline_factory(2, max_records=100)
    kafka_client.produce(config.kafka.topic, pageviews(150))
    command = [sys.executable, "-m", "exactly_cli", "run", "-c", str(config_path(config))]
    refused = subprocess.run(
        [*command, "--until-caught-up"], capture_output=True, text=True, timeout=300,
        env={**os.environ, JVM_OPTIONS_ENV: "-Xmx1g org.example.Main"},
    )  # fmt: skip
    assert refused.returncode == 2, refused.stdout + refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert JVM_OPTIONS_ENV in line and "'org.example.Main' is not a JVM option" in line, line
    done = subprocess.run(
        [*command, "--until-caught-up"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert_exactly_once(config, kafka_client)
