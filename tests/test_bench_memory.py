"""bench/memory.py: the per-contender peak resident memory must see what a process allocates,
and forget, after a reset, what it allocated and freed before.

A child Python process is driven through stdin: it allocates (and touches) ~200 MiB, frees
it, and says so on stdout, so the test knows each step has happened. No JVM.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from bench.memory import RESET, SAMPLED, PeakMemory, reset_peak, status_kib

ALLOCATE_MIB = 200
CHILD = f"""
import sys
held = None
for line in sys.stdin:
    if line.strip() == "allocate":
        held = bytearray({ALLOCATE_MIB} << 20)  # then every page is written: resident
        for i in range(0, len(held), 4096):
            held[i] = 1
    elif line.strip() == "free":
        held = None
    print("done", flush=True)
"""


class Child:
    """A process that allocates and frees memory when told to."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pid = self.process.pid

    def do(self, what: str) -> None:
        assert self.process.stdin and self.process.stdout
        self.process.stdin.write(what + "\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline().strip() == "done"


@pytest.fixture
def child() -> Iterator[Child]:
    c = Child()
    c.do("noop")  # started and idle
    try:
        yield c
    finally:
        c.process.kill()
        c.process.wait()


def _rss_mib(pid: int) -> float:
    kib = status_kib(pid, "VmRSS")
    assert kib is not None
    return kib / 1024


@pytest.mark.parametrize("reset", [True, False], ids=["reset", "sampled"])
def test_peak_sees_an_allocation(child: Child, reset: bool) -> None:
    baseline = _rss_mib(child.pid)
    with PeakMemory({"python": child.pid}, reset=reset) as meter:
        child.do("allocate")
        if not reset:
            meter._sample()  # what the thread does; here sure to run while memory is held
        child.do("free")
    figures = meter.result()
    assert figures["methods"]["python"] == (RESET if reset else SAMPLED)
    assert figures["peak_mib"]["python"] >= baseline + ALLOCATE_MIB * 0.75, figures
    assert figures["driver_sum_of_peaks_mib"] == figures["peak_mib"]["python"]


def test_reset_forgets_a_peak_that_was_freed(child: Child) -> None:
    if not reset_peak(child.pid):
        pytest.skip("clear_refs cannot be written here: the harness samples instead")
    child.do("allocate")
    child.do("free")
    hwm = status_kib(child.pid, "VmHWM")
    assert hwm is not None and hwm / 1024 >= ALLOCATE_MIB * 0.75
    with PeakMemory({"python": child.pid}) as meter:
        child.do("noop")
    peak = meter.result()["peak_mib"]["python"]
    # the 200 MiB were freed before the meter started: its peak is the idle size
    assert peak < hwm / 1024 - ALLOCATE_MIB * 0.75, (peak, hwm / 1024)


def test_the_driver_is_summed_and_a_gone_process_is_skipped(child: Child) -> None:
    with PeakMemory({"python": child.pid, "jvm": child.pid, "broker": None}) as meter:
        child.do("noop")
    figures = meter.result()
    assert "broker" not in figures["peak_mib"]
    one = figures["peak_mib"]["python"]
    assert figures["driver_sum_of_peaks_mib"] == pytest.approx(2 * one)
    assert 0 < figures["driver_sampled_peak_mib"] <= figures["driver_sum_of_peaks_mib"]


def test_a_child_measured_apart_is_added(child: Child) -> None:
    with PeakMemory({"python": child.pid}) as meter:
        pass
    meter.add("child", 512 * 1024)
    figures = meter.result()
    assert figures["peak_mib"]["child"] == 512
    assert figures["driver_sum_of_peaks_mib"] == figures["peak_mib"]["python"]


def test_a_child_tools_peak_is_its_own_not_this_process() -> None:
    """ConsumerPerformance's JVM is measured by bench/limits.py; rusage's ru_maxrss would
    carry this process's peak over the (v)fork and exec, so a big parent made it look big."""
    from bench.limits import _run_measured

    ballast = bytearray(300 << 20)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    small = "import time; time.sleep(0.3)"
    big = f"b = bytearray({ALLOCATE_MIB} << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n{small}"
    _, _, small_kib = _run_measured([sys.executable, "-c", small], timeout=30)
    _, _, big_kib = _run_measured([sys.executable, "-c", big], timeout=30)
    del ballast
    assert small_kib is not None and small_kib / 1024 < 100, small_kib
    assert big_kib is not None and big_kib / 1024 >= ALLOCATE_MIB * 0.75, big_kib
