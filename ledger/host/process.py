"""What this host's process table says about an attempt's owner (Linux's /proc).

A pid alone does not name a process: once its process exits, the OS hands the pid to the
next one. So the owner recorded for an attempt (`this_owner`, below) also carries
when its process started (field 22 of /proc/PID/stat, `starttime`, in clock ticks since
boot) and the boot it started in (/proc/sys/kernel/random/boot_id): a later process that
got the pid, in this boot or after a reboot, is not taken for the owner (invariant 16).

Without procfs (not Linux) owners are recorded as host and pid, and a pid that answers
kill(pid, 0) is taken for the owner: without a start time a reused pid cannot be told apart.
"""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path

from ledger.core.protocol import Owner

PROCFS = Path("/proc")

#: Fields 3 (`state`) and 22 (`starttime`) of /proc/PID/stat, counted from field 3 (what
#: follows the command name, which is in parentheses and may itself hold both).
_STATE, _STARTTIME = 0, 19


def _stat(pid: int) -> list[str]:
    """Fields 3 onwards of /proc/PID/stat; raises OSError (FileNotFoundError: no such
    process)."""
    return (PROCFS / str(pid) / "stat").read_text().rpartition(") ")[2].split()


@functools.cache
def boot_id() -> str | None:
    """This boot's id, None without procfs. A process never outlives its boot, so it is
    read once."""
    try:
        return (PROCFS / "sys" / "kernel" / "random" / "boot_id").read_text().strip() or None
    except OSError:
        return None


@functools.lru_cache(maxsize=8)
def identity(pid: int) -> tuple[int | None, str | None]:
    """When process `pid` of this host started (clock ticks since boot) and this boot's id;
    (None, None) when procfs cannot say. Cached per pid: called for this process (a forked
    child has another pid, so it reads its own)."""
    try:
        started = int(_stat(pid)[_STARTTIME])
    except (OSError, IndexError, ValueError):
        return None, None
    return started, boot_id()


def running(owner: Owner) -> bool:
    """Whether the process `owner` names still runs, asked of this host's process table
    (the caller checked that `owner.host` is this host).

    Gone when no process has the pid; when the process there is a zombie (killed, not yet
    reaped by its parent: it answers kill(pid, 0) but runs nothing, and its parent may
    never reap it); and when the owner recorded a start time or boot and the process with
    the pid started at another time or in another boot (the pid was reused). An owner
    recorded without them (before exactly stored them) is judged by its pid alone.
    """
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if not (PROCFS / "self").exists():
        return True  # no procfs to ask: kill(pid, 0) answered
    if owner.boot is not None and boot_id() not in (None, owner.boot):
        return False  # started in an earlier boot: nothing of that boot runs any more
    try:
        fields = _stat(owner.pid)
    except FileNotFoundError:
        return False  # reaped meanwhile
    except OSError:
        return True
    if fields[_STATE : _STATE + 1] in (["Z"], ["X"]):
        return False
    if owner.started is None:
        return True
    try:
        started = int(fields[_STARTTIME])
    except (IndexError, ValueError):
        return True  # unreadable: do not take a live owner for a dead one
    return started == owner.started


def this_owner() -> Owner:
    """The owner recorded for attempts started here, so recovery can tell if it is alive:
    this host, this process's pid, and when and in which boot the process started, so a
    process that later gets the pid is not taken for this one (ledger/host/process.py)."""
    pid = os.getpid()
    started, boot = identity(pid)
    return Owner(socket.gethostname(), pid, started, boot)
