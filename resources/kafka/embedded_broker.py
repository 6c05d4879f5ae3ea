"""The embedded single-node KRaft broker, run as a detached JVM and managed from Python.

Everything the broker owns lives in one data directory:

    server.properties    written on first start; the controller port is chosen once and kept
    log4j2.properties    broker logging, INFO to stdout (which is broker.log)
    broker.log           the JVM's stdout and stderr, appended across starts
    broker.pid           the pid of the running JVM (absent when stopped)
    kafka-logs/          the formatted KRaft storage: metadata log and topic data
    .broker.lock         serialises start/stop of this data dir across processes

The invariant this module protects: at most one JVM per data directory. A process counts as
"our broker" only if its command line runs `kafka.Kafka` with this directory's
server.properties, so a stale pid file, or a reused pid now owned by something else, is never
mistaken for a running broker and never signalled.

How the JVM is launched, quoted and stopped is `resources.jvm.process`'s, shared with the Spark
Connect server; what server.properties says is resources/kafka/broker_config.py's (the SASL_SSL
listener's part, resources/kafka/secure_listener.py's). This module owns the data directory,
the storage's formatting, the broker's start, readiness and stop.
"""

from __future__ import annotations

import contextlib
import fcntl
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from ledger.core.errors import ConfigError, ExactlyError, UnreachableError
from resources.jvm.jars import kafka_classpath
from resources.jvm.options import operator_jvm_options
from resources.jvm.process import (
    HOST,
    accepts_connections,
    is_informative,
    java_executable,
    launch_detached,
    log_lines_since,
    port_in_use,
    process_args,
    terminate_group,
    wait_child,
    wait_gone,
)
from resources.kafka.broker_config import (
    LOG4J_PROPERTIES,
    SERVER_PROPERTIES,
    cluster_id,
    read_properties,
    write_config,
)
from resources.kafka.client import KafkaClient
from resources.kafka.secure_listener import SecureListener, scram_arguments

BROKER_LOG = "broker.log"
PID_FILE = "broker.pid"
LOCK_FILE = ".broker.lock"
STORAGE_DIR = "kafka-logs"
MAIN_CLASS = "kafka.Kafka"

# Sized for a 2-core, 24 GiB machine shared with Spark: a 1 GiB heap is plenty for a test and
# demo broker, and G1 with short pauses keeps request latency flat.
JVM_OPTIONS = (
    "-Xms256m",
    "-Xmx1g",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)

FORMAT_TIMEOUT = 180.0
LOG_TAIL_LINES = 6


@dataclass(frozen=True)
class BrokerStatus:
    """What the data directory's pid file says, checked against the live process table."""

    running: bool
    pid: int | None
    bootstrap: str | None
    data_dir: Path

    def describe(self) -> str:
        if self.running:
            return f"running at {self.bootstrap} (pid {self.pid}, data dir {self.data_dir})"
        return f"not running (data dir {self.data_dir})"


class AlreadyRunningError(ExactlyError):
    """A broker already runs on this data dir; starting a second JVM would corrupt it."""

    def __init__(self, status: BrokerStatus) -> None:
        super().__init__(
            f"broker already running at {status.bootstrap} "
            f"(pid {status.pid}, data dir {status.data_dir})"
        )
        self.status = status


class PortTakenError(UnreachableError):
    """A listener's port was free when checked and taken before the JVM bound it: a race
    with another process (an outgoing connection's ephemeral port, another server), which
    a start on another port (or the same one, later) wins."""


#: How the JVM says a listener could not bind (kafka.network.SocketServer).
_BIND_FAILED = re.compile(r"failed to bind to ([0-9.]+):(\d+): Address already in use")


def bind_failure(lines: list[str]) -> str | None:
    """The `host:port` a listener could not bind, from the JVM's log lines, or None."""
    for line in lines:
        found = _BIND_FAILED.search(line)
        if found is not None:
            return f"{found.group(1)}:{found.group(2)}"
    return None


class EmbeddedBroker:
    """One KRaft node (broker and controller in one JVM) on 127.0.0.1:`port`, and on
    `secure.port` too with a `SecureListener`.

    The JVM outlives this object and the Python process (it runs in its own session), so
    `exactly kafka start` can return; `status` and `stop` find it again from the data dir.
    """

    def __init__(
        self, data_dir: Path | str, port: int = 9092, secure: SecureListener | None = None
    ) -> None:
        if not 0 < port < 65536:
            raise ConfigError(f"broker port must be between 1 and 65535, not {port}")
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.port = port
        self.secure = secure
        self._process: subprocess.Popen[bytes] | None = None

    # -- paths -------------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def properties_path(self) -> Path:
        return self.data_dir / SERVER_PROPERTIES

    @property
    def log_path(self) -> Path:
        return self.data_dir / BROKER_LOG

    @property
    def pid_path(self) -> Path:
        return self.data_dir / PID_FILE

    @property
    def storage_dir(self) -> Path:
        return self.data_dir / STORAGE_DIR

    # -- status ------------------------------------------------------------------------------

    def status(self) -> BrokerStatus:
        """Running only if the pid file names a live JVM running this dir's server.properties."""
        pid = self._read_pid()
        if pid is None or not self._is_our_broker(pid):
            return BrokerStatus(False, None, None, self.data_dir)
        return BrokerStatus(True, pid, self._configured_bootstrap(), self.data_dir)

    def _read_pid(self) -> int | None:
        try:
            return int(self.pid_path.read_text(encoding="ascii").strip())
        except (OSError, ValueError):
            return None

    def _is_our_broker(self, pid: int) -> bool:
        args = process_args(pid)
        return MAIN_CLASS in args and str(self.properties_path) in args

    def _configured_bootstrap(self) -> str | None:
        try:
            advertised = read_properties(self.properties_path).get("advertised.listeners", "")
        except OSError:
            return None
        return advertised.removeprefix("PLAINTEXT://") or None

    # -- start -------------------------------------------------------------------------------

    def start(self, timeout: float = 60) -> str:
        """Start the broker and return its bootstrap address once it answers metadata requests.

        Raises AlreadyRunningError rather than starting a second JVM on the same storage, and
        UnreachableError (quoting broker.log) if the JVM exits or stays silent for `timeout`
        seconds; in the latter case the JVM is stopped, so a failed start leaves nothing behind.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self._locked():
            status = self.status()
            if status.running:
                raise AlreadyRunningError(status)
            self.pid_path.unlink(missing_ok=True)  # stale: its process is gone
            self._require_free_port(self.port, "choose another with --port")
            write_config(self.data_dir, self.port, self.secure, self.storage_dir)
            if not (self.storage_dir / "meta.properties").is_file():
                self._format_storage()
            log_offset = self._launch()
        self._await_ready(timeout, log_offset)
        return self.bootstrap

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the data dir's lock so concurrent start/stop calls cannot interleave."""
        with open(self.data_dir / LOCK_FILE, "a+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _require_free_port(self, port: int, hint: str) -> None:
        if port_in_use(port):
            raise ExactlyError(
                f"cannot start the broker for {self.data_dir}: port {port} on {HOST} is "
                f"already in use by another process ({hint})"
            )

    def _format_storage(self) -> None:
        """Format KRaft storage once; a formatted dir is never formatted again (that is data)."""
        command = [
            java_executable(),
            *operator_jvm_options(),
            f"-Dlog4j2.configurationFile={self.data_dir / LOG4J_PROPERTIES}",
            "-cp",
            kafka_classpath(),
            "kafka.tools.StorageTool",
            "format",
            "-t",
            cluster_id(),
            "-c",
            str(self.properties_path),
        ]
        command += scram_arguments(self.secure)
        try:
            result = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=FORMAT_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise UnreachableError(
                f"formatting broker storage in {self.storage_dir} took over {FORMAT_TIMEOUT:g}s"
            ) from None
        output = (result.stdout + result.stderr).decode(errors="replace")
        self._append_log(f"== exactly: formatted storage (exit {result.returncode})\n{output}")
        if result.returncode != 0:
            last = [line for line in output.splitlines() if is_informative(line)][-3:]
            raise ExactlyError(
                f"formatting broker storage in {self.storage_dir} failed "
                f"(exit {result.returncode}): {' | '.join(last) or 'no output'}"
            )

    def _append_log(self, text: str) -> None:
        with open(self.log_path, "a", encoding="utf-8") as log:
            log.write(text if text.endswith("\n") else text + "\n")

    def _launch(self) -> int:
        """Start the JVM detached and record its pid; return where its log output begins."""
        command = [
            java_executable(),
            *JVM_OPTIONS,
            *operator_jvm_options(),
            f"-Dlog4j2.configurationFile={self.data_dir / LOG4J_PROPERTIES}",
            f"-Dkafka.logs.dir={self.data_dir}",
            "-cp",
            kafka_classpath(),
            MAIN_CLASS,
            str(self.properties_path),
        ]
        self._process, log_offset = launch_detached(
            command,
            self.log_path,
            f"== exactly: starting broker on {self.bootstrap} at {time.ctime()}",
            cwd=self.data_dir,
        )
        self.pid_path.write_text(f"{self._process.pid}\n", encoding="ascii")
        return log_offset

    def _await_ready(self, timeout: float, log_offset: int) -> None:
        """Return once the broker answers; otherwise stop what we launched and raise."""
        assert self._process is not None
        deadline = time.monotonic() + timeout
        client = KafkaClient(self.bootstrap, timeout=10)
        while True:
            code = self._process.poll()
            if code is not None:
                self.pid_path.unlink(missing_ok=True)
                taken = bind_failure(log_lines_since(self.log_path, log_offset) or [])
                if taken is not None:
                    raise PortTakenError(
                        f"broker for {self.data_dir} could not listen on {taken}: the port "
                        "was free when checked and taken before the broker bound it; start "
                        f"it again, or choose another port (its log: {self.log_path})"
                    )
                raise UnreachableError(
                    f"broker for {self.data_dir} exited with code {code} before answering on "
                    f"{self.bootstrap}; {self._log_tail(log_offset)}"
                )
            left = deadline - time.monotonic()
            if left <= 0:
                self.stop()
                raise UnreachableError(
                    f"broker for {self.data_dir} did not answer on {self.bootstrap} within "
                    f"{timeout:g}s, so it was stopped; {self._log_tail(log_offset)}"
                )
            if self._answers(client, min(left, 5.0)):
                return
            time.sleep(0.2)

    def _answers(self, client: KafkaClient, timeout: float) -> bool:
        """True once the listener accepts and the broker lists itself in cluster metadata."""
        if not accepts_connections(self.port, timeout=1):
            return False
        try:
            client.check_reachable(timeout=timeout)
        except UnreachableError:
            return False
        return True

    def _log_tail(self, offset: int) -> str:
        """The last informative lines the JVM wrote since `offset`, on one line."""
        lines = log_lines_since(self.log_path, offset) or []
        broker_lines = [line for line in lines if not line.startswith("SLF4J:")]
        if broker_lines:
            return f"last lines of {self.log_path}: " + " | ".join(broker_lines[-LOG_TAIL_LINES:])
        if any("no-operation (NOP) logger" in line for line in lines):
            return (
                f"{self.log_path} has no broker output because SLF4J found no logging binding "
                "on the kafka classpath (slf4j-api 1.x next to log4j-slf4j2-impl?)"
            )
        return f"{self.log_path} has no output from this start"

    # -- stop --------------------------------------------------------------------------------

    def stop(self, timeout: float = 30) -> bool:
        """Stop the broker; True if one was running, False if there was nothing to stop.

        SIGTERM first, so Kafka closes its logs cleanly and the next start skips recovery;
        SIGKILL only after `timeout` seconds. Only a process verified to be this data dir's
        broker is ever signalled.
        """
        with self._locked():
            status = self.status()
            pid = status.pid
            if not status.running or pid is None:
                self.pid_path.unlink(missing_ok=True)
                return False
            terminate_group(
                pid, lambda seconds: self._wait_exit(pid, seconds), timeout, kill_timeout=30
            )
            self.pid_path.unlink(missing_ok=True)
            return True

    def _wait_exit(self, pid: int, timeout: float) -> bool:
        """Wait for `pid` to exit: reap it if this object launched it, else watch /proc."""
        if self._process is not None and self._process.pid == pid:
            if not wait_child(self._process, timeout):
                return False
            self._process = None
            return True
        return wait_gone(lambda: self._is_our_broker(pid), timeout)

    # -- context manager (tests) -------------------------------------------------------------

    def __enter__(self) -> EmbeddedBroker:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
