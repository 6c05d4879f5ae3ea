"""A Spark Connect server for tests and development, run from pyspark's own Spark distribution.

It gets the project's jars and the same settings as a local session (`resources.spark.session`),
so a remote session reads Kafka and writes Delta exactly as a local one does. A production run
connects to a server someone else operates (an `sc://` spark.master) and never starts one.

Launching, log quoting and stopping are `resources.jvm.process`'s, shared with the broker.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from ledger.core.errors import ConfigError, ExactlyError, UnreachableError
from resources.jvm.process import (
    LoopbackServer,
    free_port,
    launch_detached,
    log_lines_since,
    port_in_use,
    spark_log4j2,
)
from resources.object_storage.s3 import S3Access
from resources.spark.session import (
    DEFAULT_CONF,
    LOOPBACK,
    executor_credentials,
    jar_settings,
    java_options,
    loopback_settings,
    s3a_settings,
)

CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
CONNECT_MASTER = "local[2]"
CONNECT_LOG = "connect-server.log"
# Generous: on 2 shared cores the server JVM (Spark plus Delta) takes 10-20 s to listen,
# and far longer while other JVMs are busy.
CONNECT_START_TIMEOUT = 300.0
CONNECT_STOP_TIMEOUT = 60.0
#: What SparkConnectServer logs once its gRPC service is bound, and when its start failed.
STARTED_LINE = "Spark Connect server started at"
FAILED_LINE = "Error starting Spark Connect server"
#: Starts on a new free port when the last one was taken before the server bound it.
PORT_TRIES = 3

#: The server's log4j2 config: its start and bind lines explain a start that fails or hangs.
CONNECT_LOG4J2 = spark_log4j2(
    "Spark Connect server",
    {
        "server": CONNECT_SERVER_CLASS,
        "service": "org.apache.spark.sql.connect.service.SparkConnectService",
    },
)


def _pyspark_home() -> Path:
    """pyspark's own Spark distribution (bin/, jars/): the versions our jars were matched to."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class PortTaken(UnreachableError):
    """The server's port was free when checked and taken when the server bound it: a start
    on another free port may succeed (resources/spark/shared_server.py tries one)."""


class ConnectServer(LoopbackServer):
    """A Spark Connect server JVM started by this process, listening on 127.0.0.1:`port`.

    The JVM runs in its own process group (spark-submit's launcher scripts `exec` into it,
    and Python workers it forks stay in the group), so `stop` signals exactly what
    `start_connect_server` started and nothing else: SIGTERM first, so Spark's shutdown
    hooks run.
    """

    stop_timeout = CONNECT_STOP_TIMEOUT

    def __init__(
        self, port: int, process: subprocess.Popen[bytes], work_dir: Path, log_offset: int
    ) -> None:
        super().__init__("Spark Connect server", port, process, work_dir / CONNECT_LOG, log_offset)
        self.work_dir = work_dir
        #: Seconds from launch until the port answered (set by `start_connect_server`).
        self.start_seconds: float | None = None

    @property
    def url(self) -> str:
        return f"sc://{LOOPBACK}:{self.port}"

    def await_listening(self, deadline: float, poll_seconds: float = 0.5) -> None:
        """Return once the server's gRPC service is bound to its port; fail, quoting the log,
        once the server says it could not bind it, exits, or `deadline` passes.

        A port that answers is not yet our server. The server's own Spark driver takes an
        ephemeral port for its RPC, and that may be this very port (seen in CI): the gRPC
        bind then fails, the driver's port answers, and a client handed the URL retried for
        ten minutes. Another process may take the port between the start's check and the
        bind, too. So the server's own line saying its service is bound (`STARTED`) is what
        counts, and its line saying the start failed (`FAILED`) ends the wait at once.
        """
        super().await_listening(deadline, poll_seconds)
        where = f"{LOOPBACK}:{self.port}"
        while True:
            lines = log_lines_since(self.log_path, self.log_offset) or []
            if any(FAILED_LINE in line for line in lines):
                raise PortTaken(
                    f"the Spark Connect server could not bind {where} (taken by another "
                    f"process meanwhile?); {self.log_path}: {self.log_tail()}"
                )
            if any(STARTED_LINE in line for line in lines):
                return
            code = self.process.poll()
            if code is not None or time.monotonic() > deadline:
                happened = f"exited (code {code})" if code is not None else "did not start in time"
                raise UnreachableError(
                    f"the Spark Connect server {happened} before serving on {where}; "
                    f"{self.log_path}: {self.log_tail()}"
                )
            time.sleep(poll_seconds)


def _escaped(value: str) -> str:
    """`value` as java.util.Properties reads it back: backslashes and line breaks escaped,
    a leading space kept."""
    text = value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    return "\\" + text if text.startswith(" ") else text


def _server_settings(
    port: int,
    folder: Path,
    master: str,
    conf: Mapping[str, str] | None,
    object_store: S3Access | None,
) -> dict[str, str]:
    """The server's Spark settings: DEFAULT_CONF, loopback, the s3a store's, `conf`, the
    jars, and last the binding, which the URL handed out depends on."""
    s3 = s3a_settings(object_store) if object_store is not None else {}
    if s3 and not master.startswith("local"):
        s3.update(executor_credentials(s3))
    return {
        **DEFAULT_CONF,
        **loopback_settings(),
        "spark.sql.warehouse.dir": str(folder / "warehouse"),
        **s3,
        **(conf or {}),
        **jar_settings(object_store is not None),
        **java_options(conf or {}),
        # the URL we hand out depends on these: not overridable, and no silent move to the
        # next port if this one is taken
        "spark.connect.grpc.binding.address": LOOPBACK,
        "spark.connect.grpc.binding.port": str(port),
        "spark.connect.grpc.port.maxRetries": "0",
    }


def _write_properties(properties: Path, settings: Mapping[str, str]) -> Path:
    """Write `settings` as the server's properties file and return its path.

    The settings (s3a keys among them) go in a file only this user reads, not on the command
    line every user of the host can list; only the port stays there, which
    resources/spark/shared_server.py matches to tell its server from a process that reused
    its pid.
    """
    properties.touch(mode=0o600)
    properties.chmod(0o600)
    properties.write_text(
        "".join(f"{key}={_escaped(value)}\n" for key, value in settings.items()),
        encoding="utf-8",
    )
    return properties


def _server_env(home: Path, conf_dir: Path, env: Mapping[str, str] | None) -> dict[str, str]:
    """This process's environment with `env` on top, pointed at pyspark's Spark and our
    conf dir."""
    process_env = {
        **os.environ,
        **(env or {}),
        "SPARK_HOME": str(home),
        "SPARK_CONF_DIR": str(conf_dir),
        "SPARK_LOCAL_IP": LOOPBACK,
    }
    process_env.setdefault("PYSPARK_PYTHON", sys.executable)
    # a token would make the client insist on TLS for 127.0.0.1; this server is loopback-only
    process_env.pop("SPARK_CONNECT_AUTHENTICATE_TOKEN", None)
    return process_env


def start_connect_server(
    port: int,
    conf: Mapping[str, str] | None = None,
    *,
    master: str = CONNECT_MASTER,
    work_dir: Path | str | None = None,
    timeout: float = CONNECT_START_TIMEOUT,
    object_store: S3Access | None = None,
    env: Mapping[str, str] | None = None,
    on_launch: Callable[[int], None] | None = None,
) -> ConnectServer:
    """Start a Spark Connect server on 127.0.0.1:`port` and return once the port answers.

    It runs pyspark's own Spark (its bin/spark-submit and jars/, which hold the Connect
    server), never a $SPARK_HOME install whose version might not match pyspark or our jars,
    with the project's jars and DEFAULT_CONF (Delta's extensions and catalog,
    TIMESTAMP_MICROS, 2 GiB driver), and `conf` on top. Its `master` is where the queries'
    tasks run: local threads by default, or a cluster's executors (`SparkCluster.url` from
    `resources.spark.standalone_cluster`; a loopback cluster reaches the server's driver on
    127.0.0.1).
    With `object_store`, the server also loads the s3a jars and reaches that store (its
    sessions' tables may be `s3://`), with the credentials its JVM inherits from this
    process's environment, handed on to a cluster's executors (`executor_credentials`).
    Nothing is downloaded. The log is `work_dir/connect-server.log` (a new temporary folder
    if `work_dir` is None), and the server's working directory, so a warehouse or metastore
    it creates stays there too.

    `env` adds to (or overrides) this process's environment for the server; `on_launch` is
    called with the JVM's pid as soon as it is launched, before it listens (a shared server's
    record, resources/spark/shared_server.py, must name a server whose start outlives its starter).

    Raises UnreachableError, quoting the log, if the JVM exits or does not listen within
    `timeout` seconds; the JVM is stopped then, so a failed start leaves nothing behind.
    """
    if not 0 < port < 65536:
        raise ConfigError(f"Spark Connect port must be between 1 and 65535, not {port}")
    if port_in_use(port, LOOPBACK):
        raise ExactlyError(
            f"cannot start a Spark Connect server: port {port} on {LOOPBACK} is already in use"
        )
    folder = Path(work_dir or tempfile.mkdtemp(prefix="exactly-connect-")).resolve()
    conf_dir = folder / "conf"  # ours: no stray spark-defaults.conf reaches the server
    conf_dir.mkdir(parents=True, exist_ok=True)
    (conf_dir / "log4j2.properties").write_text(CONNECT_LOG4J2, encoding="utf-8")
    settings = _server_settings(port, folder, master, conf, object_store)
    properties = _write_properties(conf_dir / "exactly.properties", settings)
    home = _pyspark_home()
    command = [str(home / "bin" / "spark-submit"), "--class", CONNECT_SERVER_CLASS]
    command += ["--name", "exactly-connect", "--master", master]
    command += ["--properties-file", str(properties)]
    command += ["--conf", f"spark.connect.grpc.binding.port={port}"]
    process_env = _server_env(home, conf_dir, env)

    started = time.monotonic()
    process, log_offset = launch_detached(
        command,
        folder / CONNECT_LOG,
        f"== exactly: starting Spark Connect on {LOOPBACK}:{port} at {time.ctime()}",
        cwd=folder,
        env=process_env,
    )
    server = ConnectServer(port, process, folder, log_offset)
    try:
        if on_launch is not None:
            on_launch(process.pid)
        server.await_listening(started + timeout)
    except BaseException:
        server.stop()
        raise
    server.start_seconds = time.monotonic() - started
    return server


def start_on_a_free_port(
    start: Callable[[int], ConnectServer], tries: int = PORT_TRIES
) -> ConnectServer:
    """`start(port)` on a free port; on another while a port was taken before the server
    bound it (`PortTaken`), `tries` times in all."""
    for tries_left in reversed(range(tries)):
        try:
            return start(free_port(LOOPBACK))
        except PortTaken:
            if not tries_left:
                raise
    raise AssertionError("tries must be at least 1")
