"""The progress line of a running stage: updated in place on a terminal, plain lines in a
log or a pipe (where `\r` would pile up as one unreadable line)."""

from __future__ import annotations

import sys
import threading
from typing import TextIO

from resources.spark.progress import StageProgress

#: Seconds between two progress lines: often on a terminal, where a line replaces the last
#: one; rarely elsewhere, where every line stays in the log.
TERMINAL_EVERY = 1.0
LOG_EVERY = 10.0
_CLEAR = "\r\x1b[K"


def describe(label: str, planned: int, progress: StageProgress) -> str:
    """`stage pageviews/12 attempt 1: 44,900 rows written of at most 100,000 records, tasks 5/8`.

    `planned` is the batch's offset span: an upper bound on its records (transaction markers
    and compaction leave gaps). Records read are shown where Spark counts them; its Kafka
    source does not (Spark reports 0), so there the rows written tell how far the stage is.
    """
    parts = []
    if progress.records_read:
        parts.append(f"{progress.records_read:,} of at most {planned:,} records read")
        if progress.records_written is not None:
            parts.append(f"{progress.records_written:,} rows written")
    elif progress.records_written is not None:
        parts.append(f"{progress.records_written:,} rows written of at most {planned:,} records")
    if progress.bytes_read is not None:
        parts.append(f"{progress.bytes_read / 1e6:,.1f} MB read of at most {planned:,} records")
    parts.append(f"tasks {progress.tasks_done}/{progress.tasks}")
    return f"stage {label}: {', '.join(parts)}"


class ProgressLine:
    """Everything the CLI prints goes through `say`, so a line in place is cleared before a
    message and never left half-overwritten."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._showing = False

    @property
    def stream(self) -> TextIO:
        # looked up at each write: a test (or a caller) may replace sys.stdout
        return self._stream or sys.stdout

    def is_terminal(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())

    def every(self) -> float:
        return TERMINAL_EVERY if self.is_terminal() else LOG_EVERY

    def say(self, message: str) -> None:
        with self._lock:
            if self._showing:
                self.stream.write(_CLEAR)
                self._showing = False
            self.stream.write(message + "\n")
            self.stream.flush()

    def show(self, label: str, planned: int, progress: StageProgress) -> None:
        line = describe(label, planned, progress)
        with self._lock:
            if self.is_terminal():
                self.stream.write(_CLEAR + line)
                self._showing = True
            else:
                self.stream.write(line + "\n")
            self.stream.flush()
