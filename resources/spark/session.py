"""Spark sessions that load the project's own jars (Kafka source, Delta) and nothing else.

`local[*]` by default; any master URL, or a Spark Connect URL (`sc://host:port`), from
config. Parquet timestamps are written as TIMESTAMP_MICROS because delta-rs cannot read
Spark's default INT96.

Tables in object storage (`s3://`) are written through Hadoop's s3a filesystem: a session
given an `S3Access` (resources/object_storage/s3.py, the same endpoint and credentials boto3,
pyarrow and delta-rs use) loads the s3a jars and points s3a at that endpoint; `s3://` is mapped to
s3a as
well, so Spark reads the URIs the config holds. Credentials the JVM can read from its own
environment (the standard AWS variables it inherits) stay out of Spark's settings.

A Spark Connect server with the project's jars is started, for tests and development, by
`resources.spark.connect_server.start_connect_server`, which builds on this module's settings.

pyspark runs one API mode per Python process: while a remote session is open, the
environment variable SPARK_CONNECT_MODE_ENABLED makes `pyspark.sql.functions` build Spark
Connect columns, which classic DataFrames cannot use. Stop remote sessions with
`stop_session`, which leaves Connect mode again once the last of them is stopped (pyspark's
own `stop()` does not), so one process (the test suite) can use both kinds one after the
other.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from ledger.core.errors import ConfigError, UnreachableError
from resources.jvm.class_archive import driver_java_options
from resources.jvm.jars import spark_jars
from resources.jvm.options import with_operator_options

if TYPE_CHECKING:
    from pathlib import Path

    from pyspark.sql import SparkSession

    from resources.object_storage.s3 import S3Access

#: Modest defaults for a 2-core, 24 GiB machine shared with a broker and Dagster.
DEFAULT_CONF: Mapping[str, str] = {
    "spark.driver.memory": "2g",
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.compression.codec": "snappy",
    # the stage's one write routes rows to two folders (jobs/stage/routing.py: write_routed); with
    # a writer per folder open at once, Spark need not sort each task's rows by folder first
    "spark.sql.maxConcurrentOutputFileWriters": "2",
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.databricks.delta.schema.autoMerge.enabled": "false",
    # a table's state (log replay) in 4 tasks, not 50: the demo's read-back, 35-45 s -> 18-21 s
    "spark.databricks.delta.snapshotPartitions": "4",
    # Kafka reads are bounded by explicit offsets; never wait on a consumer group.
    "spark.sql.streaming.kafka.useDeprecatedOffsetFetching": "false",
    # pyspark's DataFrame debugging records the Python call site of every DataFrame and
    # column call in the JVM, four extra py4j round trips each: 0.07 s of every batch's stage
    # here, a fifth of an empty batch's (BENCHMARKS.md, 2026-12-03 evening). What it buys is
    # the Python file and line in the "DataFrame context" of a query error; a transform's
    # author can turn it back on in the config's spark.conf.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
}

LOOPBACK = "127.0.0.1"
DEFAULT_CONNECT_PORT = 15002  # what pyspark assumes when an sc:// URL names no port
CONNECT_PROBE_TIMEOUT = 10.0

#: pyspark's per-process switch between classic and Spark Connect APIs.
_CONNECT_MODE_ENV = "SPARK_CONNECT_MODE_ENABLED"
_remote_lock = threading.Lock()
#: Open remote sessions by (URL, settings, retries), so repeated `build_session` calls share one.
_remote_sessions: dict[tuple[str, tuple[tuple[str, str], ...], int], Any] = {}
#: Whether `build_session` turned Connect mode on (then `stop_session` turns it off again).
_connect_mode_is_ours = False
#: The log file this process's Spark JVM writes its stderr to, once one was started.
_driver_log: Path | None = None


def driver_log() -> Path | None:
    """Where this process's Spark driver JVM writes its stderr (None before it started):
    where a JVM that exited left its reason (resources/failures/jvm_log.py)."""
    return _driver_log


def jar_settings(object_store: bool = False) -> dict[str, str]:
    """Load the project's jars on the driver's (and, beyond local mode, executors') classpath;
    with `object_store`, the s3a filesystem's too."""
    jars = [str(j) for j in spark_jars(object_store)]
    classpath = os.pathsep.join(jars)
    return {
        "spark.jars": ",".join(jars),
        "spark.driver.extraClassPath": classpath,
        "spark.executor.extraClassPath": classpath,
    }


#: The AWS SDK's provider of the standard variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
#: AWS_SESSION_TOKEN) from the JVM's own environment: the secret never enters Spark's settings.
_ENV_CREDENTIALS = "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider"
#: Hadoop's providers of keys set in its configuration (with and without a session token).
_CONF_CREDENTIALS = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
_CONF_SESSION_CREDENTIALS = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
#: No keys resolved: the SDK's own chain (instance or container role, web identity, SSO).
_DEFAULT_CREDENTIALS = "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider"


_DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
_EXECUTOR_JAVA_OPTIONS = "spark.executor.extraJavaOptions"


def java_options(settings: Mapping[str, str], archive: str | None = None) -> dict[str, str]:
    """The driver's and executors' JVM options: `archive` (the driver's class-data archive
    options, resources/jvm/class_archive.py), then EXACTLY_JVM_OPTIONS (resources/jvm/options.py),
    then the config's own, so that the config's own win where they disagree."""
    found: dict[str, str] = {}
    for key in (_DRIVER_JAVA_OPTIONS, _EXECUTOR_JAVA_OPTIONS):
        value = with_operator_options(settings.get(key))
        if key == _DRIVER_JAVA_OPTIONS and archive is not None:
            value = f"{archive} {value}" if value else archive
        if value is not None:
            found[key] = value
    return found


#: A setting every session started for object storage has (see `s3a_settings`).
_S3A_MARK = "spark.hadoop.fs.s3.impl"


def s3a_settings(access: S3Access, env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Hadoop s3a settings that reach the store `access` describes, as boto3 and delta-rs do.

    Keys that the JVM inherits as the standard variables (`env`, the environment the JVM is
    started with) are read there by the SDK's environment provider. Keys resolved otherwise
    (a named profile's) must be handed to Spark: Hadoop's key settings, which Spark's default
    `spark.redaction.regex` hides from its UI, event logs and `EXPLAIN`. A custom endpoint is
    an S3-compatible store: path-style addressing, which every such store accepts, and no TLS
    for an `http://` endpoint.
    """
    settings = {
        _S3A_MARK: "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "spark.hadoop.fs.s3a.endpoint.region": access.region,
    }
    if access.endpoint_url is not None:
        settings["spark.hadoop.fs.s3a.endpoint"] = access.endpoint_url
        settings["spark.hadoop.fs.s3a.path.style.access"] = "true"
        settings["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(
            not access.endpoint_url.startswith("http://")
        ).lower()
    inherited = (
        access.access_key_id is not None
        and env.get("AWS_ACCESS_KEY_ID") == access.access_key_id
        and env.get("AWS_SECRET_ACCESS_KEY") == access.secret_access_key
        and (env.get("AWS_SESSION_TOKEN") or None) == access.session_token
    )
    if inherited:
        provider = _ENV_CREDENTIALS
    elif access.access_key_id is not None and access.secret_access_key is not None:
        settings["spark.hadoop.fs.s3a.access.key"] = access.access_key_id
        settings["spark.hadoop.fs.s3a.secret.key"] = access.secret_access_key
        provider = _CONF_CREDENTIALS
        if access.session_token:
            settings["spark.hadoop.fs.s3a.session.token"] = access.session_token
            provider = _CONF_SESSION_CREDENTIALS
    else:
        provider = _DEFAULT_CREDENTIALS
    settings["spark.hadoop.fs.s3a.aws.credentials.provider"] = provider
    return settings


def executor_credentials(
    settings: Mapping[str, str], env: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """The standard variables for executors, when `settings` read keys from the environment.

    Executors on a cluster are processes of their own, started by a worker with the worker's
    environment, not the driver's: keys the driver inherited would be missing there and
    every task would fail to sign its requests. `spark.executorEnv.*` hands them over; Spark's
    default `spark.redaction.regex` (secret, token) keeps the secret and the session token
    out of its UI, event logs and `EXPLAIN`.
    """
    if settings.get("spark.hadoop.fs.s3a.aws.credentials.provider") != _ENV_CREDENTIALS:
        return {}
    names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
    return {f"spark.executorEnv.{name}": env[name] for name in names if env.get(name)}


def loopback_settings() -> dict[str, str]:
    """A local driver talks only to itself: keep it off the machine's other interfaces."""
    return {"spark.driver.host": LOOPBACK, "spark.driver.bindAddress": LOOPBACK}


def _on_this_machine(master: str) -> bool:
    """True for local mode and for a standalone cluster whose every master is on loopback.

    Such a cluster's executors run on this machine too (a worker registers from where its
    master can reach it), so they reach the driver on 127.0.0.1. Any other cluster manager,
    or a master elsewhere, may start executors on other machines.
    """
    if master.startswith("local"):
        return True
    if not master.startswith("spark://"):
        return False
    hosts = [urlparse(f"spark://{hp}").hostname for hp in master[len("spark://") :].split(",")]
    return all(h in ("localhost", "::1") or (h or "").startswith("127.") for h in hosts)


def driver_settings(master: str) -> dict[str, str]:
    """Where the driver listens: loopback when everything that talks to it is local.

    Left to itself Spark binds the driver (its RPC endpoint and the file server that hands
    the project's jars to executors) to the machine's first non-loopback address; for
    executors elsewhere that is right, for a loopback cluster it only exposes the driver.
    """
    return loopback_settings() if _on_this_machine(master) else {}


def _remote_sql_settings(settings: Mapping[str, str]) -> dict[str, str]:
    """What a client may set on a Connect server's session: runtime SQL settings only.

    The server owns its classpath and static settings (extensions, catalog, memory); those
    were fixed when it started (`resources.spark.connect_server` passes DEFAULT_CONF). Sending the
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
    master: str = "local[*]",
    conf: Mapping[str, str] | None = None,
    app_name: str = "exactly",
    object_store: S3Access | None = None,
    connect_retries: int | None = None,
) -> SparkSession:
    """Create (or return the running) Spark session with the project's jars and settings.

    With `object_store`, the session reads and writes `s3://`/`s3a://` locations there; the
    config's own `conf` wins over the derived s3a settings, as an operator's override.
    `sc://` URLs give a Spark Connect session; the server must have the project's jars and
    Delta's extensions (a server from `resources.spark.connect_server` has), and its own s3a
    settings. Repeated calls with the same URL and settings return the same open remote
    session. `connect_retries` (`spark.connect_retries`): how often a Connect session
    retries a server that does not answer (`CONNECT_RETRIES` when None).
    """
    # the Python workers must run the interpreter that has our packages
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    s3 = s3a_settings(object_store) if object_store is not None else {}
    if not master.startswith(("local", "sc://")):
        s3.update(executor_credentials(s3))
    settings = {**DEFAULT_CONF, **s3, **(conf or {})}
    if master.startswith("sc://"):
        retries = CONNECT_RETRIES if connect_retries is None else connect_retries
        return _remote_session(master, _remote_sql_settings(settings), retries)
    with _remote_lock:
        if _live_remote_sessions():
            # pyspark would fail with SESSION_ALREADY_EXIST or CONNECT_URL_NOT_SET here
            raise ConfigError(
                f"cannot start a {master} Spark session while a Spark Connect session is open "
                "in this process (pyspark runs one API mode per process): stop it with "
                "resources.spark.session.stop_session first"
            )
        _leave_connect_mode_if_unused()  # remote sessions stopped without stop_session
    from pyspark.sql import SparkSession

    if _on_this_machine(master):
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    for key, value in driver_settings(master).items():
        settings.setdefault(key, value)
    settings.update(jar_settings(object_store is not None))
    settings.update(java_options(settings, driver_java_options(object_store is not None)))
    _launch_jvm_logging_to_file(master, app_name, settings)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    if object_store is not None and session.sparkContext.getConf().get(_S3A_MARK) is None:
        # getOrCreate handed back a session started earlier in this process without s3a: its
        # classpath is fixed, so every s3a:// write would fail once Spark has done the work
        raise ConfigError(
            "a Spark session without the s3a filesystem is already running in this process; "
            "a pipeline with s3:// tables needs a process (or a code location) whose first "
            "Spark session was started for object storage"
        )
    return session


def _launch_jvm_logging_to_file(master: str, app_name: str, settings: Mapping[str, str]) -> None:
    """Start this process's Spark JVM, if none runs yet, with its stderr in a log file.

    The JVM inherits the process's stderr, and writes Java stacks there on its own: log4j's
    console appender logs every failed task with its stack (three times for one failed
    write), and the JVM prints what nothing caught. The command line promises one line per
    failure on stderr (exactly_cli), so those go to `logs/spark-<when>-<pid>.log` under the
    state folder (resources/failures/lines.py) instead; the error that reaches Python still
    carries the Java exceptions, which is what the one line is made from. Where the state
    folder cannot be written (a read-only home), the JVM is started without the log file: a session
    that cannot log is better than none. The JVM is
    started as pyspark's builder would start it (spark-submit with the same settings); the
    builder then finds it running and uses it.
    """
    from pyspark import SparkConf
    from pyspark.core.context import SparkContext
    from pyspark.java_gateway import launch_gateway

    from resources.failures.lines import log_file

    global _driver_log
    if SparkContext._gateway is not None:
        return
    conf = SparkConf().setMaster(master).setAppName(app_name)
    for key, value in settings.items():
        conf.set(key, value)
    path = log_file("spark")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        log = open(path, "ab")  # noqa: SIM115 (closed below, once the JVM holds its copy)
    except OSError:
        return  # no state folder to write to: the builder starts the JVM on our stderr
    with log:
        gateway = launch_gateway(conf, popen_kwargs={"stderr": log})
    _driver_log = path
    SparkContext._ensure_initialized(gateway=gateway)


def _remote_session(url: str, settings: Mapping[str, str], retries: int) -> SparkSession:
    """A Spark Connect session for `url`, reused while open.

    `builder.remote(url).create()` rather than `getOrCreate()`: the latter refuses to run
    beside a classic SparkContext in the same process (SESSION_ALREADY_EXIST), and would
    hand back a session for whichever URL came first.
    """
    global _connect_mode_is_ours
    from pyspark.sql import SparkSession

    _require_listening(url)
    key = (url, tuple(sorted(settings.items())), retries)
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
        _bound_retries(session, retries)
        _remote_sessions[key] = session
        return session


#: How often a Connect session retries a server that does not answer, by default
#: (`spark.connect_retries`): about 45 s (backoffs of 0.05, 0.2, 0.8, 3.2 s, then 10 s
#: each, plus jitter), enough for a brief outage.
CONNECT_RETRIES = 8
CONNECT_MAX_BACKOFF_MS = 10_000


def _bound_retries(session: Any, retries: int = CONNECT_RETRIES) -> None:
    """Give up on an unavailable server after `retries` tries (about 45 s at the default),
    not pyspark's 10+ minutes.

    While a stage waits on a server that died, its batch stays PLANNED by a live owner,
    which every other run must wait for. Failing the stage loses nothing (it has not
    voted; the next run plans the range again) and the next run can start or reach a
    server, so waiting ten minutes only stalls the pipeline.
    """
    from pyspark.sql.connect.client.retries import DefaultPolicy

    # pyspark warns as its retries run out, then raises: the raised error is the one the
    # stage turns into a line that names the server and the batch (jobs/stage/spark_stager.py)
    warnings.filterwarnings("ignore", message=r"\[RETRIES_EXCEEDED\]", category=UserWarning)
    session.client.set_retry_policies(
        [DefaultPolicy(max_retries=retries, max_backoff=CONNECT_MAX_BACKOFF_MS)]
    )


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
            "with resources.spark.connect_server.start_connect_server or fix spark.master"
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
