"""The one line a failure is said in, and the log files behind it.

Why apart from the causes (resources/failures/causes.py): classifying is a pure function
of an exception's texts; saying it writes files. A known cause becomes its line; anything
else becomes a line naming what failed, what it said first, and the log file its full
traceback (the Java stack too) was written to. The command line (exactly_cli) and Dagster's
run view (orchestration/health/failures.py) both say failures through `describe_failure`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import traceback
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from resources.failures.causes import (
    QUOTED_CHARS,
    FailureContext,
    chain,
    classify,
    java_stack,
    local_folder_problem,
    text_of,
)
from resources.failures.jvm_log import out_of_memory_in


def first_line(exc: BaseException) -> str:
    """What an unforeseen error says first, for the one line that names its log file: the
    Java exception for py4j's errors (their own first line is `An error occurred while
    calling o262.parquet.`), else the exception's first line."""
    text = text_of(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    if "from the Python worker:" in lines[0] and (raised := _raised_after_traceback(text)):
        # pyspark's first line says only that a worker raised; the news is what it raised
        return f"{type(exc).__name__} in a Spark Python worker: {raised}"[:QUOTED_CHARS]
    java = next((ln for ln in lines[1:3] if ln.startswith(": ")), None)
    head = f"{type(exc).__name__}: {java.removeprefix(': ')}" if java else lines[0]
    return head[:QUOTED_CHARS]


def _raised_after_traceback(text: str) -> str | None:
    """The exception line of the first Python traceback in `text`: the first line after
    `Traceback (most recent call last):` that is not indented (frames and code are)."""
    start = text.find("Traceback (most recent call last):")
    if start < 0:
        return None
    return next((ln for ln in text[start:].splitlines()[1:] if ln and not ln[0].isspace()), None)


def logs_dir() -> Path:
    """Where full tracebacks and the Spark driver's own output go: `logs/` under the state
    folder (EXACTLY_STATE_DIR, else XDG's state home; resources/spark/shared_server.py)."""
    from resources.spark.shared_server import state_dir

    return state_dir() / "logs"


#: Log files kept per kind: every Dagster run and every CLI start that uses Spark writes one,
#: so the oldest beyond these go when a new one is made.
KEEP_LOGS = 200


def log_file(kind: str, keep: int = KEEP_LOGS) -> Path:
    """A new log file's path for `kind` (`error`, `spark`), unique to this process; older
    files of the kind beyond the `keep` newest are deleted (a file a live process still
    writes only loses its name)."""
    folder = logs_dir()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    older = sorted(folder.glob(f"{kind}-*.log"), key=_modified) if folder.is_dir() else []
    for stale in older[: max(len(older) - keep + 1, 0)]:
        with contextlib.suppress(OSError):
            stale.unlink()
    return folder / f"{kind}-{stamp}-{os.getpid()}.log"


def _modified(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def write_traceback(exc: BaseException, what: str) -> Path | None:
    """Write `exc`'s full traceback (its Java stack included) to a new log file; returns
    its path, or None when no log file could be written (then the line says so)."""
    path = log_file("error")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        text = "".join(traceback.format_exception(exc))
        for error in chain(exc):
            if (stack := java_stack(error)) is not None and stack not in text:
                text += f"\nJVM stack of {type(error).__name__}:\n{stack}"
        path.write_text(f"{what} failed at {datetime.now(UTC).isoformat()}\n\n{text}")
    except OSError:
        return None
    return path


def unforeseen_line(exc: BaseException, what: str, log: Path | None) -> str:
    """One line for an error no known cause explains: what failed, what it said first, and
    where its full traceback is."""
    where = f"full traceback in {log}" if log else "no log file could be written"
    return f"{what} failed: {first_line(exc)} ({where})"


def one_line(text: str) -> str:
    """`text` on one line: its non-blank lines joined by a space."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


#: The cause a failure no known cause explains is reported under.
UNFORESEEN = "unforeseen"


@dataclass(frozen=True)
class FailureLine:
    """What the CLI prints and Dagster's run view shows for an error that is not an
    ExactlyError: the line, the known cause's name (or UNFORESEEN), and for an unforeseen
    one the log file holding its traceback (None when none could be written)."""

    line: str
    cause: str
    log: Path | None = None


def describe_failure(exc: BaseException, what: str, context: FailureContext) -> FailureLine:
    """The one line for `exc`, raised by `what`: its known cause with the path or service,
    or, for anything else, what failed and where its full traceback was written (the file
    is written here). The CLI and the Dagster ops both say failures through this."""
    if context.spark_log is not None:
        context = replace(context, spark_out_of_memory=out_of_memory_in(context.spark_log))
    known = classify(exc, context, probe=local_folder_problem)
    if known is not None:
        return FailureLine(one_line(known.line()), known.cause)
    log = write_traceback(exc, what)
    return FailureLine(one_line(unforeseen_line(exc, what, log)), UNFORESEEN, log)


class _LogFile(logging.FileHandler):
    """A log file created with its first record (and its folder with it)."""

    def _open(self):  # type: ignore[no-untyped-def]  # logging's own signature
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


def log_records_to_file() -> None:
    """Send every log record of this process to a `python-*.log` file in the logs folder,
    made only if a record comes, never to the terminal.

    Why: a library that logs on the root logger with no handler set gets Python's default
    one, stderr, tracebacks included: py4j logs a lost JVM so (`logging.exception`), and
    the command's one line came after a traceback (seen in CI). Once this is set, a record
    of any logger lands in the file; a file that cannot be written (a full or read-only
    state folder) is dropped silently, as the command's own line already says what failed.
    """
    root = logging.getLogger()
    if any(isinstance(h, _LogFile) for h in root.handlers):
        return
    handler = _LogFile(log_file("python"), delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    logging.raiseExceptions = False
