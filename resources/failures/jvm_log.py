"""Why this process's Spark driver JVM exited, from the log its stderr goes to.

Why: in local mode the executor is the driver's JVM, and a task that runs out of heap ends
it: Spark's uncaught-exception handler exits the JVM (exit code 52) instead of failing the
task. Python then sees only a lost connection (py4j's "Answer from Java side is empty"),
which says nothing about memory; the `java.lang.OutOfMemoryError` is in the JVM's own log
(resources/spark/session.py sends its stderr there). A JVM the kernel's OOM killer ended
leaves nothing there, and is told only by the lost connection.
"""

from __future__ import annotations

import re
from pathlib import Path

#: The end of a log that is read: the JVM's last words are there, and a log may be large.
TAIL_BYTES = 512 * 1024

_OUT_OF_MEMORY = re.compile(r"java\.lang\.OutOfMemoryError(?::\s*(?P<detail>[^\n]+))?")


def out_of_memory_in(log: Path) -> str | None:
    """What the JVM that wrote `log` said when it ran out of memory (`Java heap space`,
    `Requested array size exceeds VM limit`, ...), the last such line; None if it did not,
    or the log cannot be read."""
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
    return (found[-1].group("detail") or "java.lang.OutOfMemoryError").strip()
