"""Why this process's Spark driver JVM exited, from the log its stderr goes to.

Why: in local mode the executor is the driver's JVM, and a task that runs out of heap ends
it: Spark's uncaught-exception handler exits the JVM (exit code 52) instead of failing the
task. Python then sees only a lost connection (py4j's "Answer from Java side is empty"),
which says nothing about memory; the `java.lang.OutOfMemoryError` is in the JVM's own log
(resources/spark/session.py sends its stderr there). A JVM the kernel's OOM killer ended
leaves nothing there, and is told only by the lost connection.

The JVM may also answer once more on its way out: the call that ran the job gets whatever
the stopping context throws (seen in CI: a NullPointerException from the stopped scheduler,
wrapped as Spark's `[INTERNAL_ERROR]`). Spark's handler names the thread that died first, so
the log says the JVM is exiting, and that error is the heap's too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

#: The end of a log that is read: the JVM's last words are there, and a log may be large.
TAIL_BYTES = 512 * 1024

_OUT_OF_MEMORY = re.compile(r"java\.lang\.OutOfMemoryError(?::\s*(?P<detail>[^\n]+))?")
#: Spark's handler saying a thread died of it: it is exiting the JVM (exit code 52).
_UNCAUGHT = re.compile(r"SparkUncaughtExceptionHandler: Uncaught exception in thread[^\n]*\n")


@dataclass(frozen=True)
class OutOfMemory:
    """What the JVM said when it ran out of memory (`Java heap space`, `Requested array
    size exceeds VM limit`, ...), and whether Spark's handler is exiting it for that."""

    detail: str
    exiting: bool


def out_of_memory_in(log: Path) -> OutOfMemory | None:
    """The OutOfMemoryError the JVM that wrote `log` reported: the last that killed a
    thread, else the last of all; None if it reported none, or the log cannot be read."""
    try:
        with open(log, "rb") as file:
            size = file.seek(0, 2)
            file.seek(max(size - TAIL_BYTES, 0))
            text = file.read().decode("utf-8", "replace")
    except OSError:
        return None
    found = list(_OUT_OF_MEMORY.finditer(text))
    if not found:
        return None
    uncaught = {m.end() for m in _UNCAUGHT.finditer(text)}
    fatal = [m for m in found if m.start() in uncaught]
    last = (fatal or found)[-1]
    return OutOfMemory((last.group("detail") or "java.lang.OutOfMemoryError").strip(), bool(fatal))
