"""A Spark standalone cluster on loopback (one master, N workers) for tests and development,
run from pyspark's own Spark distribution.

A production run points `spark.master` at a cluster someone else operates and never starts
one, which is why this launcher lives here and not in `resources/`. It exists so that the
product's promise (every record once, whatever crashes) is tested where the stage job's
tasks run in executors of other JVMs, not only in a local driver.

Every daemon is pyspark's own `bin/spark-class` (the Spark version our jars were matched
to, never a $SPARK_HOME install), bound to 127.0.0.1, with its REST submission server off,
in its own process group with its log in the cluster's folder. Launching, log quoting and
stopping are `resources.jvm.process`'s, shared with the broker and the Connect server.

By hand (stops on Ctrl-C):

    .venv/bin/python -m resources.spark.standalone_cluster [--workers 2] [--port 7077] [--dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from ledger.core.errors import ConfigError, ExactlyError, UnreachableError
from resources.jvm.options import operator_jvm_options
from resources.jvm.process import (
    DetachedJvm,
    accepts_connections,
    free_port,
    launch_detached,
    port_in_use,
    spark_log4j2,
)
from resources.spark.session import LOOPBACK

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
DEFAULT_WORKERS = 2
#: One core each: the machine has two, shared with the driver, a broker and the tests.
WORKER_CORES = 1
#: What a worker offers its executors; Spark's default executor heap (1g) fits in it.
WORKER_MEMORY = "1g"
#: Heap of the master and worker daemons themselves (Spark's default is 1g each).
DAEMON_MEMORY = "256m"
# Generous: on 2 shared cores each daemon JVM takes 5-15 s to start, far longer while other
# JVMs are busy.
CLUSTER_START_TIMEOUT = 300.0
CLUSTER_STOP_TIMEOUT = 60.0

#: The daemons' log4j2 config: who registered with whom and which executors ran explain a
#: start that fails or a job that never gets cores.
CLUSTER_LOG4J2 = spark_log4j2("Spark cluster", {"master": MASTER_CLASS, "worker": WORKER_CLASS})

#: Daemon settings: no REST submission server (it would listen on 6066 on every start), and
#: each worker deletes the folders of finished applications so repeated runs do not pile up.
CLUSTER_DEFAULTS = {
    "spark.master.rest.enabled": "false",
    "spark.worker.cleanup.enabled": "true",
}


def _pyspark_home() -> Path:
    """pyspark's own Spark distribution (bin/, jars/): the versions our jars were matched to."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class Daemon(DetachedJvm):
    """One master or worker JVM started by this process, leading its own process group:
    `stop_group` TERMs it (a worker's hooks kill its executors), KILLs it if stuck."""


class SparkCluster:
    """A standalone master on 127.0.0.1:`port` and the workers registered with it."""

    def __init__(self, port: int, ui_port: int, work_dir: Path) -> None:
        self.port = port
        self.ui_port = ui_port
        self.work_dir = work_dir
        self.master: Daemon | None = None
        self.workers: list[Daemon] = []
        #: Seconds from launch until every worker had registered (set by `start_spark_cluster`).
        self.start_seconds: float | None = None

    @property
    def url(self) -> str:
        """The `spark.master` of a session (or a Connect server) that runs on this cluster."""
        return f"spark://{LOOPBACK}:{self.port}"

    @property
    def daemons(self) -> list[Daemon]:
        return [*self.workers, *([self.master] if self.master else [])]

    def state(self, timeout: float = 5.0) -> dict[str, Any]:
        """The master's own account of the cluster (its web UI's JSON): workers, apps."""
        with urllib.request.urlopen(f"http://{LOOPBACK}:{self.ui_port}/json", timeout=timeout) as r:
            state: dict[str, Any] = json.load(r)
        return state

    def alive_workers(self) -> list[dict[str, Any]]:
        return [w for w in self.state()["workers"] if w["state"] == "ALIVE"]

    def executor_logs(self) -> list[Path]:
        """Every executor's stderr so far: `<worker dir>/<app id>/<executor id>/stderr`."""
        return sorted(self.work_dir.glob("worker-*/app-*/*/stderr"))

    def stop(self, timeout: float = CLUSTER_STOP_TIMEOUT) -> None:
        """Stop the workers (and so their executors), then the master."""
        stuck = [d.name for d in self.daemons if not d.stop_group(timeout)]
        if stuck:
            raise ExactlyError(f"Spark cluster daemons did not exit: {', '.join(stuck)}")

    def __enter__(self) -> SparkCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _daemon_env(home: Path, conf_dir: Path) -> dict[str, str]:
    """The daemons' environment: pyspark's Spark, our conf folder, loopback, their memory,
    and the operator's JVM options (resources/jvm/options.py)."""
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_CONF_DIR": str(conf_dir),
        "SPARK_LOCAL_IP": LOOPBACK,
        "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
    }
    options = operator_jvm_options()
    if options:
        env["SPARK_DAEMON_JAVA_OPTS"] = shlex.join(options)
    return env


def start_spark_cluster(
    workers: int = DEFAULT_WORKERS,
    *,
    port: int | None = None,
    cores: int = WORKER_CORES,
    memory: str = WORKER_MEMORY,
    work_dir: Path | str | None = None,
    timeout: float = CLUSTER_START_TIMEOUT,
) -> SparkCluster:
    """Start a master on 127.0.0.1:`port` (a free one if None) and `workers` workers of
    `cores` cores and `memory` each; return once every worker has registered.

    The master's web UI (whose JSON tells when workers registered) takes a free port; each
    worker picks its own ports. Logs (`master.log`, `worker-N.log`) and the workers' folders
    (executor logs, application files) are in `work_dir` (a new temporary folder if None).

    Raises UnreachableError, quoting the failing daemon's log, if a daemon exits or the
    cluster is not complete within `timeout` seconds; everything started is stopped then.
    """
    if workers < 1:
        raise ConfigError(f"a Spark cluster needs at least one worker, not {workers}")
    port = free_port(LOOPBACK) if port is None else port
    if not 0 < port < 65536:
        raise ConfigError(f"Spark master port must be between 1 and 65535, not {port}")
    if port_in_use(port, LOOPBACK):
        raise ExactlyError(
            f"cannot start a Spark master: port {port} on {LOOPBACK} is already in use"
        )
    folder = Path(work_dir or tempfile.mkdtemp(prefix="exactly-spark-cluster-")).resolve()
    conf_dir = folder / "conf"  # ours: no stray spark-defaults.conf reaches the daemons
    conf_dir.mkdir(parents=True, exist_ok=True)
    (conf_dir / "log4j2.properties").write_text(CLUSTER_LOG4J2, encoding="utf-8")
    properties = conf_dir / "spark-defaults.conf"
    properties.write_text("".join(f"{k} {v}\n" for k, v in CLUSTER_DEFAULTS.items()))
    home = _pyspark_home()
    env = _daemon_env(home, conf_dir)
    spark_class = str(home / "bin" / "spark-class")
    cluster = SparkCluster(port, free_port(LOOPBACK), folder)
    started = time.monotonic()
    deadline = started + timeout
    try:
        cluster.master = _launch(
            "master",
            [
                *(spark_class, MASTER_CLASS, "--host", LOOPBACK, "--port", str(port)),
                *("--webui-port", str(cluster.ui_port), "--properties-file", str(properties)),
            ],
            folder,
            env,
        )
        _await(cluster, deadline, lambda: accepts_connections(port, timeout=2, host=LOOPBACK))
        for n in range(1, workers + 1):
            worker_dir = folder / f"worker-{n}"
            worker_dir.mkdir(exist_ok=True)
            cluster.workers.append(
                _launch(
                    f"worker-{n}",
                    [
                        *(spark_class, WORKER_CLASS, "--host", LOOPBACK, "--port", "0"),
                        *("--webui-port", "0", "--cores", str(cores), "--memory", memory),
                        *("--work-dir", str(worker_dir), "--properties-file", str(properties)),
                        cluster.url,
                    ],
                    folder,
                    env,
                )
            )
        _await(cluster, deadline, lambda: _registered(cluster) >= workers)
    except BaseException:
        cluster.stop()
        raise
    cluster.start_seconds = time.monotonic() - started
    return cluster


def _launch(name: str, command: list[str], folder: Path, env: dict[str, str]) -> Daemon:
    log_path = folder / f"{name}.log"
    process, offset = launch_detached(
        command,
        log_path,
        f"== exactly: starting Spark {name} at {time.ctime()}",
        cwd=folder,
        env=env,
    )
    return Daemon(name, process, log_path, offset)


def _registered(cluster: SparkCluster) -> int:
    """How many workers the master counts alive; 0 while its UI does not answer yet, or
    answers before its JSON is served (an empty or partial body while Jetty starts)."""
    try:
        return len(cluster.alive_workers())
    except (OSError, ValueError):
        return 0


def _await(cluster: SparkCluster, deadline: float, ready: Callable[[], bool]) -> None:
    """Poll until `ready()`; fail at once, quoting its log, if one of our daemons exits."""
    while not ready():
        for daemon in cluster.daemons:
            code = daemon.process.poll()
            if code is not None:
                raise UnreachableError(
                    f"Spark {daemon.name} exited (code {code}) while starting a cluster at "
                    f"{cluster.url}; {daemon.log_path}: {daemon.log_tail()}"
                )
        if time.monotonic() > deadline:
            waiting = cluster.workers[-1] if cluster.workers else cluster.master
            assert waiting is not None
            raise UnreachableError(
                f"Spark cluster at {cluster.url} was not ready in time; "
                f"{waiting.log_path}: {waiting.log_tail()}"
            )
        time.sleep(0.5)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m resources.spark.standalone_cluster",
        description="Run a Spark standalone master and workers on 127.0.0.1 until Ctrl-C.",
    )
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS)
    parser.add_argument("--port", type=int, default=7077, help="the master's port")
    parser.add_argument("--cores", type=int, default=WORKER_CORES, help="cores per worker")
    parser.add_argument("--memory", default=WORKER_MEMORY, help="memory per worker")
    parser.add_argument("--dir", default="./data/spark-cluster", help="logs and worker folders")
    args = parser.parse_args(argv)
    try:
        cluster = start_spark_cluster(
            args.workers, port=args.port, cores=args.cores, memory=args.memory, work_dir=args.dir
        )
    except ExactlyError as error:
        print(f"spark_cluster: error: {error}", file=sys.stderr)
        return 2
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    with cluster:
        print(
            f"Spark cluster at {cluster.url} ({args.workers} workers, {args.cores} core(s) "
            f"and {args.memory} each), ready in {cluster.start_seconds:.0f} s, logs in "
            f"{cluster.work_dir}; Ctrl-C stops it",
            flush=True,
        )
        with contextlib.suppress(KeyboardInterrupt):
            stopping.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
