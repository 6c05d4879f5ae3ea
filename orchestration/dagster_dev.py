"""`dagster dev` in its own process group on a free loopback port, for the browser tests of
the Dagster UI (tests/test_ui.py) and the bench's daemon section (bench/daemon.py).

`dagster dev` is a family of processes: the dev parent, the webserver, the daemon, a code
server with its gRPC child, and run workers (launched by the code server) with their Spark
JVMs. None of them starts a new session, so all share the dev parent's process group; stopping
means asking the parent to shut down (SIGTERM, which it treats as Ctrl-C: about 5-8 s here),
then SIGKILL for whatever of the group is left, then checking that nothing is.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

from resources.jvm.process import free_port

REPO = Path(__file__).resolve().parent.parent
# Generous: 2 shared cores; the webserver, the daemon and the code server each import Dagster.
START_TIMEOUT_S = 180.0
GRACEFUL_STOP_S = 30.0


def group_members(pgid: int) -> list[tuple[int, str, str]]:
    """(pid, state, command) of every live process in a process group, zombies excluded."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, group = fields[0], int(fields[2])
        if group == pgid and state != "Z":
            found.append((int(entry.name), state, cmdline.strip()[:160]))
    return found


class DagsterDev:
    """`dagster dev -w workspace.yaml` from the repository root, on a free loopback port."""

    def __init__(self, dagster_home: Path, env: dict[str, str], log_path: Path) -> None:
        self.dagster_home = dagster_home
        self.env = {**os.environ, **env, "DAGSTER_HOME": str(dagster_home)}
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no dagster dev log)"

    def start(self) -> str:
        """Start and wait until /server_info answers; retry on another port if one was taken."""
        self.dagster_home.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "orchestration" / "dagster.yaml", self.dagster_home / "dagster.yaml")
        self._log = self.log_path.open("ab")
        for _ in range(3):
            self.port = free_port()
            self.process = subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "dagster"),
                    "dev",
                    "-w",
                    "workspace.yaml",
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                ],
                cwd=REPO,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, killed as one at the end
            )
            if self._wait_until_serving():
                return self.url
            self.stop()
        raise AssertionError(f"dagster dev did not start:\n{self.log_tail()}")

    def _wait_until_serving(self) -> bool:
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False  # e.g. the port was taken between free_port() and the bind
            try:
                with urllib.request.urlopen(f"{self.url}/server_info", timeout=5) as answer:
                    info: dict[str, Any] = json.load(answer)
                if "dagster_webserver_version" in info:
                    return True
            except (OSError, ValueError):
                pass
            time.sleep(0.5)
        raise AssertionError(
            f"dagster dev did not answer /server_info within {START_TIMEOUT_S:.0f}s:\n"
            f"{self.log_tail()}"
        )

    def stop(self) -> None:
        """Graceful shutdown, then SIGKILL of whatever of the group is left; asserts that
        nothing is (webserver, daemon, code server, run workers, their JVMs)."""
        process, self.process = self.process, None
        if process is None:
            return
        pgid = process.pid  # start_new_session: the group id is the leader's pid
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)  # dagster dev: KeyboardInterrupt -> shutdown
        deadline = time.monotonic() + GRACEFUL_STOP_S
        while time.monotonic() < deadline and (process.poll() is None or group_members(pgid)):
            time.sleep(0.25)
        if process.poll() is None or group_members(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            process.wait(timeout=30)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and group_members(pgid):
                time.sleep(0.25)
        survivors = group_members(pgid)
        assert not survivors, f"processes of dagster dev survived SIGKILL: {survivors}"

    def close(self) -> None:
        try:
            self.stop()
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None
