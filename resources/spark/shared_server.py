"""One Spark Connect server per host and settings, shared by every process that stages with it.

Why: a run the Dagster daemon launches is a new process. With a local session it starts a
new Spark JVM, which is most of a small batch's run (about three quarters in BENCHMARKS.md,
"Runs launched by the daemon"). A pipeline whose config says `spark.server: shared` (or any
pipeline, when EXACTLY_SPARK_SERVER=shared is set, as `make ui` does) connects instead to a
Spark Connect server that outlives the run: the first process that needs it starts it, every
later one connects in about a second and finds its JVM warm. The CLI's default stays a
local session: nothing to start, nothing left behind.

What is shared is keyed by everything that shapes the server (`ServerKey`): the master its
tasks run on, the Spark settings, the jars, the object store it reaches and the credentials
it reaches it with, pyspark and the Python its workers run. Two pipelines with the same
settings share a server; a changed setting starts another. Each server has a folder under
the state directory (EXACTLY_STATE_DIR, else `$XDG_STATE_HOME/exactly`, else
`~/.local/state/exactly`): `spark-connect/<key>/` with `server.json` (pid, port, when), a
lock file and the server's log.

The cases `ensure_server` handles:

- no server yet: start one, under an exclusive lock on the folder, so processes that race
  to start it start one and the others wait for it;
- a server recorded and answering: connect;
- a server recorded but gone (killed, crashed, the host rebooted), or its pid reused by an
  unrelated process: recognised by the process's command line (it must be a Connect server
  bound to the recorded port), and a new one is started;
- a server recorded, alive, not answering: a start still under way in a process that died
  holding the lock is waited for until its start deadline, then stopped and replaced.

None of this is part of the exactly-once argument. A server that dies, is stopped or is
replaced under a running stage fails that stage before its vote; the batch is planned again
(ledger/coordinator/recovery.py). Queries of a client killed mid-stage may run on in the
server, but they write only into their own attempt's folder, which no vote names.

Transforms run by Python workers (a pandas transform) must see the code of the run that
staged them: the server's workers are not reused (`spark.python.worker.reuse=false`), so
every task imports the transform's module afresh and a changed transform takes effect at
the next batch, not at the next server start.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ledger.core.errors import ConfigError, UnreachableError
from resources.jvm.jars import spark_jars
from resources.jvm.process import (
    accepts_connections,
    process_args,
    signal_group,
    wait_gone,
)
from resources.spark.connect_server import (
    CONNECT_SERVER_CLASS,
    CONNECT_START_TIMEOUT,
    ConnectServer,
    start_connect_server,
    start_on_a_free_port,
)
from resources.spark.session import LOOPBACK, s3a_settings

if TYPE_CHECKING:
    from resources.object_storage.s3 import S3Access

STATE_ENV = "EXACTLY_STATE_DIR"
#: The default Spark session mode of pipelines whose config does not say (`local`, `shared`).
SERVER_ENV = "EXACTLY_SPARK_SERVER"
SERVER_MODES = ("local", "shared")
RECORD = "server.json"
#: Settings every shared server gets on top of the pipeline's (see the module docstring).
SHARED_CONF: Mapping[str, str] = {"spark.python.worker.reuse": "false"}
STOP_TIMEOUT = 60.0


def server_mode(configured: str | None, env: Mapping[str, str] = os.environ) -> str:
    """The Spark session mode of a pipeline: its config's, else EXACTLY_SPARK_SERVER's, else
    `local`."""
    mode = configured or env.get(SERVER_ENV) or "local"
    if mode not in SERVER_MODES:
        raise ConfigError(
            f"{SERVER_ENV}={mode!r} is not a Spark server mode: use one of {list(SERVER_MODES)}"
        )
    return mode


def state_dir(env: Mapping[str, str] = os.environ) -> Path:
    """Where per-host state lives: EXACTLY_STATE_DIR, else XDG's state home."""
    if env.get(STATE_ENV):
        return Path(env[STATE_ENV])
    base = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "exactly"


@dataclass(frozen=True)
class ServerKey:
    """Everything that shapes a shared server; equal keys may share one."""

    master: str
    conf: tuple[tuple[str, str], ...]
    jars: tuple[str, ...]
    python: str
    python_path: str
    pyspark: str
    #: a hash of the object-store credentials the server's JVM inherits or is given: a
    #: process with other (or rotated) credentials never writes through a server holding
    #: someone else's, it gets a server of its own (the old one stays until stopped)
    credentials: str

    @classmethod
    def of(cls, master: str, conf: Mapping[str, str], object_store: S3Access | None) -> ServerKey:
        import pyspark

        settings = {**(s3a_settings(object_store) if object_store else {}), **conf}
        return cls(
            master=master,
            conf=tuple(sorted({**settings, **SHARED_CONF}.items())),
            jars=tuple(str(j) for j in spark_jars(object_store is not None)),
            python=sys.executable,
            python_path=_python_path(),
            pyspark=pyspark.__version__,
            credentials=_credentials_hash(object_store),
        )

    @property
    def digest(self) -> str:
        """A name for the server's folder; settings (keys included) enter only hashed."""
        text = json.dumps(self.__dict__, sort_keys=True, default=list)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _credentials_hash(object_store: S3Access | None) -> str:
    if object_store is None:
        return ""
    parts = (
        object_store.access_key_id,
        object_store.secret_access_key,
        object_store.session_token,
        object_store.profile,
    )
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _python_path() -> str:
    """The module path the server's Python workers get: this process's PYTHONPATH and its
    working directory, where a code location's transforms are imported from."""
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys([*parts, os.getcwd()]))


@dataclass(frozen=True)
class Server:
    """A shared server as recorded in its folder."""

    folder: Path
    pid: int
    port: int
    started_at: float
    master: str

    @property
    def url(self) -> str:
        return f"sc://{LOOPBACK}:{self.port}"

    def is_ours(self) -> bool:
        """Whether `pid` is still this server: a Connect server JVM bound to `port`. A pid
        reused by anything else, or a zombie (no command line), is not."""
        args = process_args(self.pid)
        return CONNECT_SERVER_CLASS in args and any(
            a == f"spark.connect.grpc.binding.port={self.port}" for a in args
        )

    def answers(self) -> bool:
        return accepts_connections(self.port, timeout=2, host=LOOPBACK)

    def stop(self, timeout: float = STOP_TIMEOUT) -> bool:
        """SIGTERM the server's process group (SIGKILL if stuck); True once it is gone."""
        if not self.is_ours():
            return True
        signal_group(self.pid, signal.SIGTERM)
        if wait_gone(self.is_ours, timeout):
            return True
        signal_group(self.pid, signal.SIGKILL)
        return wait_gone(self.is_ours, timeout)


def _read(folder: Path) -> Server | None:
    try:
        data = json.loads((folder / RECORD).read_text(encoding="utf-8"))
        return Server(
            folder, int(data["pid"]), int(data["port"]), float(data["started_at"]), data["master"]
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(server: Server) -> None:
    record = {
        "pid": server.pid,
        "port": server.port,
        "started_at": server.started_at,
        "master": server.master,
    }
    tmp = server.folder / f"{RECORD}.tmp"
    tmp.write_text(json.dumps(record), encoding="utf-8")
    tmp.replace(server.folder / RECORD)


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """An exclusive lock on the server's folder, released when this process dies too."""
    with open(folder / "lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_server(
    master: str,
    conf: Mapping[str, str],
    object_store: S3Access | None = None,
    *,
    timeout: float = CONNECT_START_TIMEOUT,
    env: Mapping[str, str] = os.environ,
) -> Server:
    """The running shared server for these settings, started if there is none.

    Raises UnreachableError, quoting the server's log, if a start fails.
    """
    if master.startswith("sc://"):
        raise ConfigError(
            f"spark.master {master} is a Spark Connect server already: spark.server: shared "
            "starts one of its own, so give it a local[N] or spark:// master instead"
        )
    key = ServerKey.of(master, conf, object_store)
    folder = state_dir(env) / "spark-connect" / key.digest
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(
            f"cannot create the shared Spark server's folder {folder}: {error}; set "
            f"{STATE_ENV} to a writable folder"
        ) from None
    with _locked(folder):
        found = _read(folder)
        if found is not None and found.is_ours():
            deadline = found.started_at + timeout
            while not found.answers() and time.time() < deadline and found.is_ours():
                time.sleep(0.5)  # a start under way in a process that died holding the lock
            if found.answers():
                return found
            found.stop()
        return _start(folder, key, master, conf, object_store, timeout)


def _start(
    folder: Path,
    key: ServerKey,
    master: str,
    conf: Mapping[str, str],
    object_store: S3Access | None,
    timeout: float,
) -> Server:
    started_at = time.time()
    process_env = {"PYTHONPATH": key.python_path}

    def start(port: int) -> ConnectServer:
        return start_connect_server(
            port,
            {**conf, **SHARED_CONF},
            master=master,
            work_dir=folder / "server",
            timeout=timeout,
            object_store=object_store,
            env=process_env,
            on_launch=lambda pid: _write(Server(folder, pid, port, started_at, master)),
        )

    launched = start_on_a_free_port(start)
    port = launched.port
    server = Server(folder, launched.pid, port, started_at, master)
    _write(server)
    return server


def servers(env: Mapping[str, str] = os.environ) -> list[Server]:
    """Every shared server recorded on this host, running or not."""
    root = state_dir(env) / "spark-connect"
    if not root.is_dir():
        return []
    found = (_read(folder) for folder in sorted(root.iterdir()) if folder.is_dir())
    return [server for server in found if server is not None]


def stop_servers(env: Mapping[str, str] = os.environ) -> list[Server]:
    """Stop every shared server on this host; returns those that were running.

    Runs staging at that moment fail before their vote and are planned again.
    """
    stopped = []
    for server in servers(env):
        if server.is_ours():
            if not server.stop():
                raise UnreachableError(
                    f"the shared Spark server pid {server.pid} (port {server.port}) did not stop"
                )
            stopped.append(server)
        with contextlib.suppress(OSError):
            (server.folder / RECORD).unlink()
    return stopped


def shared_url(master: str, conf: Mapping[str, str], object_store: S3Access | None = None) -> str:
    """The `sc://` URL of the shared server for these settings (started if needed)."""
    return ensure_server(master, conf, object_store).url
