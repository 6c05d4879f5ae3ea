"""Continuous mode: one batch after another in one process, for freshness.

A scheduled micro-batch pays a process and a Spark session per batch; a record then waits
for the next tick plus all that start-up before it is readable. Continuous mode keeps the
process, the Spark session and the open tables, and starts the next batch as soon as the
last one is done, but never sooner than `min_interval` seconds after the last one began:
that floor bounds how many batches (Delta commits, files, ledger rows) a quiet topic makes.

Nothing about exactly-once changes: every batch is the same plan -> stage -> prepare ->
commit -> ack (ledger/coordinator/two_phase.py), recovery has run before the first one, and a batch
that fails ends the loop with its error (the process's supervisor, the re-drive sensor or
the next start finishes it, as for any run). Stopping is cooperative: `stop` is checked
between batches only, so a stop request lets the batch in flight commit; a kill in the
middle of one is a crash like any other, which recovery finishes or abandons.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ledger.coordinator.reports import BatchReport


@dataclass(frozen=True)
class Cadence:
    """How often continuous mode starts a batch.

    `min_interval`: seconds between the starts of two batches at least; a batch that took
    longer is followed at once (a backlog is read without pauses). `max_batches`: stop after
    that many committed batches (None: until stopped).
    """

    min_interval: float = 1.0
    max_batches: int | None = None
    #: seconds between two sweeps (`run_continuously`'s `sweep`) at least
    sweep_interval: float = 30.0

    def __post_init__(self) -> None:
        if self.min_interval < 0:
            raise ValueError(f"the minimum interval must be >= 0 seconds, not {self.min_interval}")
        if self.max_batches is not None and self.max_batches < 1:
            raise ValueError(f"max batches must be at least 1, not {self.max_batches}")
        if self.sweep_interval <= 0:
            raise ValueError(f"the sweep interval must be > 0 seconds, not {self.sweep_interval}")


def run_continuously(
    run_batch: Callable[[], BatchReport | None],
    cadence: Cadence,
    stop: threading.Event,
    on_batch: Callable[[BatchReport], None],
    *,
    sweep: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Run batches until `stop` is set or `cadence.max_batches` have committed; returns how
    many committed.

    `sweep` runs between two batches once `cadence.sweep_interval` seconds have passed since
    the loop began or the last sweep: recovery ran before the loop, but a backfill that dies
    while the loop runs (its own process, killed) would otherwise wait for the next start,
    its outputs disagreeing until then.

    A pass that finds nothing new (`run_batch` returns None) waits out the interval like a
    batch would: a caught-up pipeline polls the topic once per `min_interval`. The wait is
    on `stop`, so a stop request ends an idle pipeline at once.
    """
    done = 0
    swept = clock()
    while not stop.is_set():
        started = clock()
        if sweep is not None and started - swept >= cadence.sweep_interval:
            sweep()
            swept = clock()
        report = run_batch()
        if report is not None:
            done += 1
            on_batch(report)
            if cadence.max_batches is not None and done >= cadence.max_batches:
                break
        remaining = cadence.min_interval - (clock() - started)
        if remaining > 0:
            stop.wait(remaining)
    return done
