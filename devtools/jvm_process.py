"""The mechanics every JVM this project launches shares: find java, start it detached in its
own process group with its output in a log, quote that log, stop the whole group, and probe
loopback ports.

The embedded broker and the Spark Connect server both rely on one property: the JVM leads its
own process group (it starts a new session), so signalling the group reaches the JVM and every
process it forked (Spark's Python workers), and nothing else.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from ledger.errors import ConfigError

HOST = "127.0.0.1"


def java_executable() -> str:
    """`$JAVA_HOME/bin/java` if set, else `java` on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise ConfigError("no `java` on PATH and no JAVA_HOME: the broker needs Java 17")
    return found


# -- ports --------------------------------------------------------------------------------------


def free_port(host: str = HOST) -> int:
    """A port nothing listens on right now (the kernel's pick; another process may race us)."""
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
