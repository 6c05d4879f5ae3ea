"""Spark sessions that load the project's own jars (Kafka source, Delta) and nothing else.

`local[*]` by default; any master URL, or a Spark Connect URL (`sc://host:port`), from
config. Parquet timestamps are written as TIMESTAMP_MICROS because delta-rs cannot read
Spark's default INT96.

A Spark Connect server for the project is started with `start_connect_server`: it runs
pyspark's own Spark distribution with the same jars and settings as a local session, so a
remote session reads Kafka and writes Delta exactly as a local one does.

pyspark runs one API mode per Python process: while a remote session is open, the
environment variable SPARK_CONNECT_MODE_ENABLED makes `pyspark.sql.functions` build Spark
Connect columns, which classic DataFrames cannot use. Stop remote sessions with
`stop_session`, which leaves Connect mode again once the last of them is stopped (pyspark's
own `stop()` does not), so one process (the test suite) can use both kinds one after the
other.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from ledger.errors import ConfigError, ExactlyError, UnreachableError
from resources.broker import port_in_use
from resources.jars import spark_jars

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Modest defaults for a 2-core, 24 GiB machine shared with a broker and Dagster.
DEFAULT_CONF: Mapping[str, str] = {
    "spark.driver.memory": "2g",
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.compression.codec": "snappy",
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.databricks.delta.schema.autoMerge.enabled": "false",
    # Kafka reads are bounded by explicit offsets; never wait on a consumer group.
    "spark.sql.streaming.kafka.useDeprecatedOffsetFetching": "false",
}

LOOPBACK = "127.0.0.1"
CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
CONNECT_MASTER = "local[2]"
CONNECT_LOG = "connect-server.log"
# Generous: on 2 shared cores the server JVM (Spark plus Delta) takes 10-20 s to listen,
# and far longer while other JVMs are busy.
CONNECT_START_TIMEOUT = 300.0
CONNECT_STOP_TIMEOUT = 60.0
LOG_TAIL_LINES = 8
DEFAULT_CONNECT_PORT = 15002  # what pyspark assumes when an sc:// URL names no port
CONNECT_PROBE_TIMEOUT = 10.0

#: The server's log4j2 config: warnings, plus the start and bind lines, which explain a start
#: that fails or hangs; Spark's default (everything at INFO) logs each query's plan.
CONNECT_LOG4J2 = """\
# Written by exactly on every Spark Connect server start; edits are overwritten.
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.server.name = org.apache.spark.sql.connect.service.SparkConnectServer
logger.server.level = info
logger.service.name = org.apache.spark.sql.connect.service.SparkConnectService
logger.service.level = info
"""

#: pyspark's per-process switch between classic and Spark Connect APIs.
_CONNECT_MODE_ENV = "SPARK_CONNECT_MODE_ENABLED"
_remote_lock = threading.Lock()
#: Open remote sessions by (URL, settings), so repeated `build_session` calls share one.
_remote_sessions: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
#: Whether `build_session` turned Connect mode on (then `stop_session` turns it off again).
_connect_mode_is_ours = False


def _pyspark_home() -> Path:
    """pyspark's own Spark distribution (bin/, jars/): the versions our jars were matched to."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _jar_settings() -> dict[str, str]:
    """Load the project's jars on the driver's (and, beyond local mode, executors') classpath."""
    jars = [str(j) for j in spark_jars()]
    classpath = os.pathsep.join(jars)
    return {
        "spark.jars": ",".join(jars),
        "spark.driver.extraClassPath": classpath,
        "spark.executor.extraClassPath": classpath,
    }


def _loopback_settings() -> dict[str, str]:
    """A local driver talks only to itself: keep it off the machine's other interfaces."""
    return {"spark.driver.host": LOOPBACK, "spark.driver.bindAddress": LOOPBACK}


def _remote_sql_settings(settings: Mapping[str, str]) -> dict[str, str]:
    """What a client may set on a Connect server's session: runtime SQL settings only.

    The server owns its classpath and static settings (extensions, catalog, memory); those
    were fixed when it started (`start_connect_server` passes DEFAULT_CONF). Sending the
    SQL settings anyway keeps TIMESTAMP_MICROS and UTC on a server someone else started.
    """
    return {
        k: v
        for k, v in settings.items()
        if k.startswith("spark.sql.")
        and k not in ("spark.sql.extensions", "spark.sql.catalog.spark_catalog")
    }


def _live_remote_sessions() -> list[Any]:
    return [s for s in _remote_sessions.values() if not s.is_stopped]


def build_session(
    master: str = "local[*]", conf: Mapping[str, str] | None = None, app_name: str = "exactly"
) -> SparkSession:
    """Create (or return the running) Spark session with the project's jars and settings.

    `sc://` URLs give a Spark Connect session; the server must have the project's jars and
    Delta's extensions (a server from `start_connect_server` has). Repeated calls with the
    same URL and settings return the same open remote session.
    """
    # the Python workers must run the interpreter that has our packages
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    settings = {**DEFAULT_CONF, **(conf or {})}
    if master.startswith("sc://"):
        return _remote_session(master, _remote_sql_settings(settings))
    with _remote_lock:
        if _live_remote_sessions():
            # pyspark would fail with SESSION_ALREADY_EXIST or CONNECT_URL_NOT_SET here
            raise ConfigError(
                f"cannot start a {master} Spark session while a Spark Connect session is open "
                "in this process (pyspark runs one API mode per process): stop it with "
                "resources.spark.stop_session first"
            )
        _leave_connect_mode_if_unused()  # remote sessions stopped without stop_session
    from pyspark.sql import SparkSession

    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
        for key, value in _loopback_settings().items():
            settings.setdefault(key, value)
    settings.update(_jar_settings())
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def _remote_session(url: str, settings: Mapping[str, str]) -> SparkSession:
    """A Spark Connect session for `url`, reused while open.

    `builder.remote(url).create()` rather than `getOrCreate()`: the latter refuses to run
    beside a classic SparkContext in the same process (SESSION_ALREADY_EXIST), and would
    hand back a session for whichever URL came first.
    """
    global _connect_mode_is_ours
    from pyspark.sql import SparkSession

    _require_listening(url)
    key = (url, tuple(sorted(settings.items())))
    with _remote_lock:
        existing = _remote_sessions.get(key)
        if existing is not None and not existing.is_stopped:
            return existing
        if _CONNECT_MODE_ENV not in os.environ:
            _connect_mode_is_ours = True
        builder = SparkSession.builder.remote(url)
        for name, value in settings.items():
            builder = builder.config(name, value)
        session = None
        try:
            session = builder.create()
            # ask the server now, so that a port that is not a Connect server fails here
            session.version  # noqa: B018
        except Exception as error:
            if session is not None:
                session.stop()
            _leave_connect_mode_if_unused()
            raise UnreachableError(
                f"Spark Connect server at {url} did not answer: "
                f"{(str(error).splitlines() or [type(error).__name__])[0]}"
            ) from error
        _remote_sessions[key] = session
        return session


def _require_listening(url: str) -> None:
    """Fail at once if nothing listens at `url`.

    The Connect client retries an unavailable server for over 10 minutes by design (its
    DefaultPolicy), which suits a server that restarts mid-run but not a wrong URL.
    """
    parsed = urlparse(url)
    host, port = parsed.hostname or "localhost", parsed.port or DEFAULT_CONNECT_PORT
    try:
        with socket.create_connection((host, port), timeout=CONNECT_PROBE_TIMEOUT):
            pass
    except OSError as error:
        raise UnreachableError(
            f"no Spark Connect server listens at {host}:{port} ({url}): {error}; start one "
            "with resources.spark.start_connect_server or fix spark.master"
        ) from None


def _leave_connect_mode_if_unused() -> None:
    """Turn pyspark's Connect mode off if we turned it on and no remote session is open."""
    global _connect_mode_is_ours
    if _connect_mode_is_ours and not _live_remote_sessions():
        os.environ.pop(_CONNECT_MODE_ENV, None)
        _connect_mode_is_ours = False


def stop_session(session: Any) -> None:
    """Stop a session from `build_session`.

    For a remote session this ends only that session on the server (the server keeps
    running) and, once no remote session is open, returns this process to classic mode:
    pyspark's `stop()` leaves SPARK_CONNECT_MODE_ENABLED set, after which classic sessions
    in the same process would get Spark Connect columns from `pyspark.sql.functions`.
    """
    session.stop()
    with _remote_lock:
        for key, open_session in list(_remote_sessions.items()):
            if open_session is session or open_session.is_stopped:
                del _remote_sessions[key]
        _leave_connect_mode_if_unused()


class ConnectServer:
    """A Spark Connect server JVM started by this process, listening on 127.0.0.1:`port`.

    The JVM runs in its own process group (spark-submit's launcher scripts `exec` into it,
    and Python workers it forks stay in the group), so `stop` signals exactly what
    `start_connect_server` started and nothing else.
    """

    def __init__(
        self, port: int, process: subprocess.Popen[bytes], work_dir: Path, log_offset: int
    ) -> None:
        self.port = port
        self.process = process
        self.work_dir = work_dir
        self.log_offset = log_offset
        #: Seconds from launch until the port answered (set by `start_connect_server`).
        self.start_seconds: float | None = None

    @property
    def url(self) -> str:
        return f"sc://{LOOPBACK}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.work_dir / CONNECT_LOG

    @property
    def pid(self) -> int:
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last log lines of this start, without stack frames, joined for one message."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self.log_offset)
                text = log.read().decode(errors="replace")
        except OSError:
            return "no log"
        kept = [
            line.strip()
            for line in text.splitlines()
            if line.strip() and not line.strip().startswith(("at ", "..."))
        ]
        return " | ".join(kept[-lines:]) or "no output"

    def stop(self, timeout: float = CONNECT_STOP_TIMEOUT) -> None:
        """SIGTERM the server's process group (Spark's shutdown hooks run), SIGKILL if stuck.

        Signals only while the JVM is still our unreaped child, so its pid (the group id)
        cannot have been reused by another process.
        """
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
                return
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout)

    def __enter__(self) -> ConnectServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_connect_server(
    port: int,
    conf: Mapping[str, str] | None = None,
    *,
    master: str = CONNECT_MASTER,
    work_dir: Path | str | None = None,
    timeout: float = CONNECT_START_TIMEOUT,
) -> ConnectServer:
    """Start a Spark Connect server on 127.0.0.1:`port` and return once the port answers.

    It runs pyspark's own Spark (its bin/spark-submit and jars/, which hold the Connect
    server), never a $SPARK_HOME install whose version might not match pyspark or our jars,
    with the project's jars and DEFAULT_CONF (Delta's extensions and catalog,
    TIMESTAMP_MICROS, 2 GiB driver), and `conf` on top. Nothing is downloaded. The log is
    `work_dir/connect-server.log` (a new temporary folder if `work_dir` is None), and the
    server's working directory, so a warehouse or metastore it creates stays there too.

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
    settings = {
        **DEFAULT_CONF,
        **_loopback_settings(),
        "spark.sql.warehouse.dir": str(folder / "warehouse"),
        **(conf or {}),
        **_jar_settings(),
        # the URL we hand out depends on these: not overridable, and no silent move to the
        # next port if this one is taken
        "spark.connect.grpc.binding.address": LOOPBACK,
        "spark.connect.grpc.binding.port": str(port),
        "spark.connect.grpc.port.maxRetries": "0",
    }
    home = _pyspark_home()
    command = [str(home / "bin" / "spark-submit"), "--class", CONNECT_SERVER_CLASS]
    command += ["--name", "exactly-connect", "--master", master]
    for key, value in settings.items():
        command += ["--conf", f"{key}={value}"]
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_CONF_DIR": str(conf_dir),
        "SPARK_LOCAL_IP": LOOPBACK,
    }
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    # a token would make the client insist on TLS for 127.0.0.1; this server is loopback-only
    env.pop("SPARK_CONNECT_AUTHENTICATE_TOKEN", None)

    log_path = folder / CONNECT_LOG
    with open(log_path, "ab") as log:
        log.write(
            f"== exactly: starting Spark Connect on {LOOPBACK}:{port} at {time.ctime()}\n".encode()
        )
        log.flush()
        log_offset = log.tell()
        started = time.monotonic()
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=folder,
            env=env,
            start_new_session=True,
        )
    server = ConnectServer(port, process, folder, log_offset)
    try:
        _await_listening(server, started + timeout)
    except BaseException:
        server.stop()
        raise
    server.start_seconds = time.monotonic() - started
    return server


def _await_listening(server: ConnectServer, deadline: float) -> None:
    """Poll until our JVM listens; fail early if it exits (bad conf, port taken meanwhile)."""
    while not _answers(server.port):
        code = server.process.poll()
        if code is not None:
            raise UnreachableError(
                f"Spark Connect server exited (code {code}) before listening on "
                f"{LOOPBACK}:{server.port}; {server.log_path}: {server.log_tail()}"
            )
        if time.monotonic() > deadline:
            raise UnreachableError(
                f"Spark Connect server did not listen on {LOOPBACK}:{server.port} in time; "
                f"{server.log_path}: {server.log_tail()}"
            )
        time.sleep(0.5)
    if not server.running():
        raise UnreachableError(
            f"port {server.port} answers but our Spark Connect server exited; "
            f"{server.log_path}: {server.log_tail()}"
        )


def _answers(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=2):
            return True
    except OSError:
        return False
