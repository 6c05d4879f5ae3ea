"""The mechanics every JVM this project launches shares: find java, start it detached in its
own process group with its output in a log, quote that log, stop the whole group, and probe
loopback ports.

`LoopbackServer` is what the S3 server and the Spark Connect server have in common (a log
quoted in every error, a start that waits for the port, a stop), `DetachedJvm` what a Spark
cluster's daemons have.

Every one of them relies on one property: the JVM leads its own process group (it starts a
new session), so signalling the group reaches the JVM and every process it forked (Spark's
Python workers), and nothing else.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

from ledger.core.errors import ConfigError, UnreachableError

HOST = "127.0.0.1"
LOG_TAIL_LINES = 8


def java_executable() -> str:
    """`$JAVA_HOME/bin/java` if set, else `java` on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise ConfigError("no `java` on PATH and no JAVA_HOME: Spark and the broker need Java 17")
    return found


# -- ports --------------------------------------------------------------------------------------


#: Where `free_port` picks from: up to the kernel's ephemeral range (`_ephemeral_start`).
LISTEN_PORTS_FROM = 20000
#: Its own random source: a test that seeds `random` must not make two processes pick alike.
_PICKS = random.SystemRandom()


def _ephemeral_start() -> int:
    """The first port the kernel gives outgoing connections (Linux's default: 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = HOST) -> int:
    """A port nothing listens on right now, for a server started next (another process may
    still race us to it).

    Picked at random below the ephemeral range: the kernel's own pick (bind to port 0) is a
    port of that range, which any process's outgoing connection may take in the seconds
    before the JVM binds it (a broker of the suite exited so, "Address already in use").
    The kernel's pick only when no port below is free."""
    high = _ephemeral_start()
    for _try in range(50 if high > LISTEN_PORTS_FROM else 0):
        port = _PICKS.randrange(LISTEN_PORTS_FROM, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int, host: str = HOST) -> bool:
    """True if binding `port` would fail the way the JVM's bind would.

    SO_REUSEADDR matches the JVM (it sets it on server sockets), so a port whose old
    connections linger in TIME_WAIT is rightly reported free.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def accepts_connections(port: int, timeout: float, host: str = HOST) -> bool:
    """True once something listens on `port`: the cheap check before asking the JVM itself."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


# -- launching and logs -------------------------------------------------------------------------


def spark_log4j2(what: str, info_loggers: Mapping[str, str]) -> str:
    """A log4j2 config for a Spark JVM we start: warnings only, on stderr (so in its log), plus
    INFO from `info_loggers` (name -> class), the lines that explain a start that fails or
    hangs; Spark's default logs everything at INFO, each query's plan included."""
    lines = [
        f"# Written by exactly on every {what} start; edits are overwritten.",
        "rootLogger.level = warn",
        "rootLogger.appenderRef.stderr.ref = stderr",
        "appender.stderr.type = Console",
        "appender.stderr.name = stderr",
        "appender.stderr.target = SYSTEM_ERR",
        "appender.stderr.layout.type = PatternLayout",
        "appender.stderr.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex",
    ]
    for name, cls in info_loggers.items():
        lines += [f"logger.{name}.name = {cls}", f"logger.{name}.level = info"]
    return "\n".join(lines) + "\n"


def launch_detached(
    command: list[str],
    log_path: Path,
    header: str,
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], int]:
    """Start `command` in a new session, its output appended to `log_path` after `header`.

    A new session makes the process outlive the caller's terminal and lead its own group, so
    `terminate_group` can stop it and its children together. Returns the process and the log
    offset where its output begins, so errors quote this start and not earlier ones.
    """
    with open(log_path, "ab") as log:
        log.write((header if header.endswith("\n") else header + "\n").encode())
        log.flush()
        log_offset = log.tell()
        process = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return process, log_offset


def is_informative(line: str) -> bool:
    """False for blank lines and Java stack frames, which say nothing in a one-line error."""
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith(("at ", "..."))


def log_lines_since(log_path: Path, offset: int) -> list[str] | None:
    """The informative lines written to `log_path` after `offset`, stripped; None if unreadable."""
    try:
        with open(log_path, "rb") as log:
            log.seek(offset)
            text = log.read().decode(errors="replace")
    except OSError:
        return None
    return [line.strip() for line in text.splitlines() if is_informative(line)]


# -- processes ----------------------------------------------------------------------------------


def process_args(pid: int) -> list[str]:
    """The command line of `pid`, empty if it is gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]


def signal_group(pid: int, signum: signal.Signals) -> None:
    """Signal `pid`'s process group if it leads one, else just `pid`; a gone process is fine."""
    with contextlib.suppress(ProcessLookupError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)


def wait_child(process: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait for our own child to exit, reaping it (else it stays a zombie); False on timeout."""
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


def wait_gone(alive: Callable[[], bool], timeout: float) -> bool:
    """Poll until `alive()` turns false, for a process we cannot reap; False on timeout."""
    deadline = time.monotonic() + timeout
    while alive():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def terminate_group(
    pid: int, wait_exit: Callable[[float], bool], timeout: float, kill_timeout: float
) -> bool:
    """SIGTERM the group, SIGKILL it if it outlives `timeout` seconds; True once it exited.

    TERM first so the JVM's shutdown hooks run (Kafka closes its logs cleanly, so the next start
    skips recovery); KILL only for a JVM that is stuck.
    """
    signal_group(pid, signal.SIGTERM)
    if wait_exit(timeout):
        return True
    signal_group(pid, signal.SIGKILL)
    return wait_exit(kill_timeout)


# -- one launched JVM ---------------------------------------------------------------------------


class DetachedJvm:
    """One JVM started by `launch_detached`: its log since this start, and a stop that reaches
    its whole process group (the JVM and every process it forked) and nothing else."""

    def __init__(
        self, name: str, process: subprocess.Popen[bytes], log_path: Path, log_offset: int
    ) -> None:
        #: What messages call it: "S3 server", "Spark Connect server", "worker-1".
        self.name = name
        self.process = process
        self.log_path = log_path
        self.log_offset = log_offset

    @property
    def pid(self) -> int:
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last log lines of this start, without stack frames, joined for one message."""
        kept = log_lines_since(self.log_path, self.log_offset)
        if kept is None:
            return "no log"
        return " | ".join(kept[-lines:]) or "no output"

    def stop_group(self, timeout: float) -> bool:
        """SIGTERM the group (shutdown hooks run), SIGKILL if stuck; True once it exited.

        Signals only while the JVM is our unreaped child, so its pid (the group id) cannot
        have been reused by another process.
        """
        if self.process.poll() is not None:
            return True
        return terminate_group(
            self.pid, lambda seconds: wait_child(self.process, seconds), timeout, timeout
        )


class LoopbackServer(DetachedJvm):
    """A server JVM listening on HOST:`port`, stopped when its `with` block ends."""

    #: Seconds `stop` waits for TERM, then again for KILL.
    stop_timeout = 60.0

    def __init__(
        self,
        name: str,
        port: int,
        process: subprocess.Popen[bytes],
        log_path: Path,
        log_offset: int,
    ) -> None:
        super().__init__(name, process, log_path, log_offset)
        self.port = port

    def stop(self, timeout: float | None = None) -> None:
        timeout = self.stop_timeout if timeout is None else timeout
        if not self.stop_group(timeout):
            raise subprocess.TimeoutExpired(self.process.args, timeout)

    def await_listening(self, deadline: float, poll_seconds: float = 0.5) -> None:
        """Poll until our JVM listens; fail early, quoting its log, if it exits first (a bad
        setting, the port taken meanwhile) or `deadline` (monotonic) passes."""
        where = f"{HOST}:{self.port}"
        while not accepts_connections(self.port, timeout=2, host=HOST):
            code = self.process.poll()
            if code is not None:
                raise UnreachableError(
                    f"{self.name} exited (code {code}) before listening on {where}; "
                    f"{self.log_path}: {self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise UnreachableError(
                    f"{self.name} did not listen on {where} in time; "
                    f"{self.log_path}: {self.log_tail()}"
                )
            time.sleep(poll_seconds)
        if not self.running():
            raise UnreachableError(
                f"port {self.port} answers but our {self.name} exited; "
                f"{self.log_path}: {self.log_tail()}"
            )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
