"""Peak resident memory of the driver (this Python process and Spark's JVM) per contender.

A process's own peak (VmHWM in /proc/PID/status) covers its whole life, so by itself it
would charge every contender with the largest one run before it. Linux lets the peak be
reset to the current resident size by writing "5" to /proc/PID/clear_refs (no other side
effect); after the contender, VmHWM is then that contender's peak, however short it was.
Where the reset is not permitted (another user's process, an old kernel, a sandbox), a
thread samples VmRSS instead, every `SAMPLE_INTERVAL_S`, keeping the largest: it can miss
a peak shorter than the interval, so the method is recorded with the figures.

The peak of py + JVM together is not the sum of their peaks (they need not peak at the same
moment): that sum is an upper bound. A thread also samples the sum itself, a lower bound;
the true combined peak lies between the two.

What neither method can undo: memory a process grew earlier and still holds counts as
resident now. The JVM rarely returns heap to the OS, and Python keeps what its allocators
keep, so a contender's peak is at least what the driver held when it started (`start_mib`
says how much that was).
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

MIB_KIB = 1024.0
#: How often the sampling thread reads VmRSS: often enough to catch a batch's peak, rare
#: enough to cost nothing measurable (two small /proc reads).
SAMPLE_INTERVAL_S = 0.05
#: The processes that make up the driver; others (the broker, a child) are reported apart.
DRIVER = ("python", "jvm")
RESET = "VmHWM after a clear_refs reset"
SAMPLED = f"VmRSS sampled every {SAMPLE_INTERVAL_S * 1000:.0f} ms"


def status_kib(pid: int, field: str) -> int | None:
    """A `kB` field of /proc/PID/status (VmRSS, VmHWM), or None if the process is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return None


def reset_peak(pid: int) -> bool:
    """Set the process's VmHWM to its current VmRSS; False if that is not permitted here."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        return False
    return True


def spark_jvm_pid(session: Any) -> int | None:
    """The pid of the JVM behind a (classic, py4j) Spark session; None if there is none."""
    with contextlib.suppress(Exception):
        return int(session.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    return None


#: How long `collect_garbage` waits at most for the JVM to hand freed heap back (G1 in
#: JDK 17 uncommits concurrently, in steps, after the collection returns).
SETTLE_TIMEOUT_S = 1.0


def collect_garbage(session: Any) -> None:
    """A full collection in the Spark JVM (System.gc) and in Python, then a short wait until
    the JVM's resident size stops falling.

    Why: the JVM keeps the heap it grew for an earlier contender, so without this every
    contender's JVM peak would be at least the largest heap of those run before it, and the
    figures would say more about the order of the contenders than about them. After a full
    collection G1 shrinks the heap to what is live (within -Xms and MaxHeapFreeRatio), so
    each contender's peak is the heap it grows itself. Run before the contender's clock
    starts; a contender then pays for growing its heap, as it would in a process of its own.
    """
    gc.collect()
    pid = spark_jvm_pid(session)
    if pid is None:
        return
    with contextlib.suppress(Exception):  # a dead JVM has nothing to collect
        session.sparkContext._jvm.java.lang.System.gc()
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    last = status_kib(pid, "VmRSS")
    while last is not None and time.monotonic() < deadline:
        time.sleep(SAMPLE_INTERVAL_S)
        now = status_kib(pid, "VmRSS")
        if now is None or now >= last - 1024:
            return
        last = now


def driver_meter(session: Any, **others: int | None) -> PeakMemory:
    """Collect garbage (see `collect_garbage`), then a meter of the session's driver (this
    process and its JVM) and of the `others` named (e.g. the broker), not started yet."""
    collect_garbage(session)
    return PeakMemory(driver_pids(spark_jvm_pid(session), **others))


def _mib(kib: float | None) -> float | None:
    return None if kib is None else kib / MIB_KIB


class PeakMemory:
    """The peak resident memory of named processes over the `with` block it guards.

    `pids` maps a name ("python", "jvm", "broker") to a pid; None (no such process) is
    skipped. Each is reset if permitted, else sampled; the driver's sum is always sampled.
    """

    def __init__(
        self,
        pids: Mapping[str, int | None],
        interval: float = SAMPLE_INTERVAL_S,
        reset: bool = True,
    ) -> None:
        self.reset = reset  # False: sample even where the reset works (the fallback's test)
        self.pids = {name: pid for name, pid in pids.items() if pid is not None}
        self.interval = interval
        self.methods: dict[str, str] = {}
        self.start_kib: dict[str, int | None] = {}
        self.sampled_kib: dict[str, int] = {}
        self.sampled_sum_kib = 0
        self.peak_kib: dict[str, int | None] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakMemory:
        for name, pid in self.pids.items():
            self.methods[name] = RESET if self.reset and reset_peak(pid) else SAMPLED
            self.start_kib[name] = status_kib(pid, "VmRSS")
        self._sample()
        self._thread = threading.Thread(target=self._run, name="peak-memory", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        for name, pid in self.pids.items():
            hwm = status_kib(pid, "VmHWM") if self.methods[name] == RESET else None
            self.peak_kib[name] = hwm if hwm is not None else self.sampled_kib.get(name)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        driver = 0
        for name, pid in self.pids.items():
            rss = status_kib(pid, "VmRSS")
            if rss is None:
                continue
            self.sampled_kib[name] = max(self.sampled_kib.get(name, 0), rss)
            if name in DRIVER:
                driver += rss
        self.sampled_sum_kib = max(self.sampled_sum_kib, driver)

    def add(self, name: str, peak_kib: int | None) -> None:
        """Record the peak of a process measured otherwise: a child of a contender, whose
        whole life is the contender, gives its own peak (bench/limits.py reads it)."""
        if peak_kib is not None:
            self.peak_kib[name] = peak_kib
            self.methods[name] = "VmHWM of the child, its whole life, sampled"

    def result(self) -> dict[str, Any]:
        """The figures in MiB, as the JSON holds them: each process's peak and resident size
        at the start, the driver's sum of peaks (upper bound) and sampled sum (lower bound)."""
        driver = [self.peak_kib.get(n) for n in DRIVER if n in self.pids]
        known = [p for p in driver if p is not None]
        methods = {self.methods[n] for n in DRIVER if n in self.methods}
        return {
            "method": " + ".join(sorted(methods)) or None,
            "methods": dict(self.methods),
            "peak_mib": {name: _mib(kib) for name, kib in self.peak_kib.items()},
            "start_mib": {name: _mib(kib) for name, kib in self.start_kib.items()},
            "driver_sum_of_peaks_mib": _mib(sum(known)) if known else None,
            "driver_sampled_peak_mib": _mib(self.sampled_sum_kib) if known else None,
        }


def driver_pids(jvm_pid: int | None, **others: int | None) -> dict[str, int | None]:
    """The driver (this process and its Spark JVM) and any other named process."""
    return {"python": os.getpid(), "jvm": jvm_pid, **others}
