"""One thread per derived Delta output, so a batch's MERGEs run at once.

Why at once. A derived output's commit is its own table's (its own log, its own application
transaction), and no output's commit depends on another's: only the raw table, published
last, must wait for all of them (invariant 7: its log says a batch is complete). Run one
after the other, the demo's three MERGEs took about 70 ms of a 100k batch's second; delta-rs
releases the GIL while it plans, reads, writes and commits, so on two cores they overlap
(BENCHMARKS.md, "Derived outputs' MERGEs at once").

Why a thread of its own per output, kept for the publisher's life. A DeltaTarget keeps one
open delta-rs table per thread and brings it up to date incrementally (resources/delta/
table.py `load`); a pool that handed an output to whichever thread was free would load
its table afresh in every new thread and keep a stale copy in each. One thread per output
means one kept table, the same one batch after batch, and an output's calls run in the
order they were asked for, never two at once.

What a crash or a failure leaves. A kill (a crash point, kill -9) while the lanes run leaves
any subset of the outputs holding the batch, each whole or not at all (a Delta commit is one
log entry), and the raw table without it: the state a crash between the commits always left,
which recovery finishes output by output (each skips a batch its version holds). A lane
that fails does not stop the others: `run` waits for every lane, then raises the first
failure in the order the tasks were given (config order), so the error the operator reads
does not depend on the threads' timing, and no MERGE is still running when it is raised.

What a fork leaves. A child process inherits the executors but not their threads, so a
task queued on an inherited lane would wait for ever, and its batch stay PREPARED under a
live owner, with no line said. The lanes remember the process that made them, and a child
makes its own. (delta-rs then refuses the child's first commit if the parent used delta-rs
before the fork, its runtime being the parent's: a failure that says so, not a hang.)
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

T = TypeVar("T")


def _shut(lanes: dict[str, ThreadPoolExecutor]) -> None:
    for lane in lanes.values():
        lane.shutdown(wait=False)


class Lanes:
    """A thread per key (a derived output's target), created when first used."""

    def __init__(self) -> None:
        self._lanes: dict[str, ThreadPoolExecutor] = {}
        self._pid = os.getpid()
        # idle threads end with their owner (a pipeline built per run or per test)
        weakref.finalize(self, _shut, self._lanes)

    def _lane(self, key: str) -> ThreadPoolExecutor:
        if self._pid != os.getpid():
            # forked: the inherited executors' threads are the parent's, never this process's
            self._lanes.clear()
            self._pid = os.getpid()
        if key not in self._lanes:
            self._lanes[key] = ThreadPoolExecutor(1, thread_name_prefix=f"lane-{key}")
        return self._lanes[key]

    def run(self, tasks: Sequence[tuple[str, Callable[[], T]]]) -> list[T]:
        """Each task on its key's thread, all at once; their results in the tasks' order,
        once every one has ended. A task that raised: the first such error, in the tasks'
        order, after the others ended. A lone task runs on its lane too, never in the
        caller's thread, so an output's table is only ever its lane's."""
        futures: list[Future[T]] = [self._lane(key).submit(task) for key, task in tasks]
        wait(futures)
        for future in futures:
            error = future.exception()
            if error is not None:
                raise error
        return [future.result() for future in futures]
