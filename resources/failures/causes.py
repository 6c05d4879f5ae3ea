"""What went wrong, in one line: known causes of a failure found in an exception chain.

Why: a disk that fills up under a Spark write ends in a Py4J error whose text is the Java
stack of every retry (hundreds of lines); the cause (`No space left on device`, `Mkdirs
failed to create ...`) is one line somewhere in it. An operator, a script or an alert rule
needs that line: the cause, and the path or the service it concerns. `classify` finds it in
the texts of the whole chain (Python exceptions, py4j's Py4JJavaError and pyspark's captured
or Spark Connect errors, whose text carries the Java exceptions, delta-rs errors, OSErrors,
librdkafka errors), so the command line (exactly_cli) and Dagster's run view
(orchestration/health/failures.py) say the same thing; what it does not know is written whole to a
log file and named in one line instead (resources/failures/lines.py).

`classify` is a pure function of the exception and of what the caller says it knows
(`FailureContext`: the pipeline's locations and services). One question the texts cannot
answer: Hadoop says `Mkdirs failed to create <path>` for a read-only file system, a folder
not writable by this user, and a full one alike. The caller may pass a `probe` that asks the
file system (`local_folder_problem`); without one the line says the folder could not be
created.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ledger.host.folders import NO_SPACE, NOT_WRITABLE, READ_ONLY, folder_problem

if TYPE_CHECKING:
    from resources.config.pipeline_config import PipelineConfig
    from resources.failures.jvm_log import OutOfMemory

#: What `text_of` says of an error that cannot print itself: py4j asks the JVM for a Java
#: error's text, and a JVM that died under the call (a local-mode OutOfMemoryError) cannot.
UNREADABLE = "its text cannot be read: the JVM that raised it is gone"
#: The longest part of an error's text a line quotes.
QUOTED_CHARS = 300

#: (NO_SPACE, READ_ONLY and NOT_WRITABLE are the host's folder probe's: ledger/host/folders.py)
CANNOT_CREATE = "cannot create folder"
NOT_DELTA = "not a Delta table"
SPARK_OOM = "Spark ran out of memory"
PYTHON_OOM = "out of memory"
EXECUTOR_LOST = "a Spark executor was lost"
SPARK_GONE = "the Spark driver (JVM) stopped"
KAFKA_AUTHORIZATION = "Kafka refused authorization"
WORKER_IMPORT = "a Spark Python worker cannot import a module"

#: What each cause asks of the operator; every line ends with it.
ADVICE: dict[str, str] = {
    NO_SPACE: "free space there, then run again (nothing is lost: the batch is taken up again)",
    READ_ONLY: "make it writable, then run again (nothing is lost: the batch is taken up again)",
    NOT_WRITABLE: (
        "give this user access there, then run again (nothing is lost: the batch is taken up again)"
    ),
    CANNOT_CREATE: (
        "check that the folder is writable and has space, then run again (nothing is lost: "
        "the batch is taken up again)"
    ),
    NOT_DELTA: "point the config at a Delta table's folder, or at a new or empty one",
    SPARK_OOM: (
        "give Spark more memory (spark.conf: spark.driver.memory, spark.executor.memory) or "
        "read fewer records per batch (batch.max_records_per_partition), then run again"
    ),
    PYTHON_OOM: (
        "read fewer records per batch (batch.max_records_per_partition) or give the process "
        "more memory, then run again"
    ),
    EXECUTOR_LOST: (
        "see the Spark cluster's logs for why (often memory); the batch is taken up again by "
        "the next run"
    ),
    SPARK_GONE: (
        "see its log for why (often memory: the kernel's OOM killer); the batch is taken up "
        "again by the next run"
    ),
    WORKER_IMPORT: (
        "install it where Spark runs its Python workers, or keep it beside the config "
        "(transform: <file>.py:<function>, or python_path) so its code travels with the "
        "transform"
    ),
    # said too by the Kafka client (resources/kafka/connection.py) and the stage
    KAFKA_AUTHORIZATION: (
        "grant the pipeline's principal the ACLs it needs (describe and read on its topics, "
        "read on its consumer group)"
    ),
}


@dataclass(frozen=True)
class FailureContext:
    """What the caller knows that an error's text may not say: where the pipeline writes
    and which services it talks to. Every field is optional."""

    #: the folders the command writes under (tables, quarantine, derived tables)
    locations: Sequence[str] = ()
    kafka: str | None = None
    spark: str | None = None
    #: the log this process's Spark driver JVM writes its stderr to, if it started one
    spark_log: Path | None = None
    #: what that log says the JVM ran out of (`Java heap space`), read by the caller: a
    #: local-mode JVM a task's OutOfMemoryError ended leaves Python only a lost connection,
    #: or whatever error the context threw while it stopped
    spark_out_of_memory: OutOfMemory | None = None


@dataclass(frozen=True)
class KnownCause:
    """A failure whose cause is known: the cause, where (a path or a service), what to do."""

    cause: str
    where: str
    detail: str = ""

    def line(self) -> str:
        """`<cause>: <where> (<detail>); <advice>`: what scripts and alert rules read."""
        detail = f" ({self.detail})" if self.detail else ""
        advice = ADVICE.get(self.cause)
        return f"{self.cause}: {self.where}{detail}" + (f"; {advice}" if advice else "")


def context_of(config: PipelineConfig) -> FailureContext:
    """The locations and services of a pipeline, for errors whose text does not name them."""
    locations = [config.delta.table_uri, config.delta.quarantine_uri]
    locations += [uri for d in config.derived if (uri := getattr(d, "table_uri", None))]
    from resources.spark.session import driver_log

    return FailureContext(
        locations=locations,
        kafka=config.kafka.bootstrap_servers,
        spark=config.spark.master,
        spark_log=driver_log(),
    )


def chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and its causes and contexts, each once, outermost first."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        current = todo.pop(0)
        if id(current) in seen or len(seen) >= 32:
            continue
        seen.add(id(current))
        yield current
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)


def java_stack(exc: BaseException) -> str | None:
    """The Java stack (its causes included) that pyspark keeps beside a captured or Spark
    Connect error's text, which holds only the outermost message unless
    spark.sql.pyspark.jvmStacktrace.enabled is set."""
    stack = getattr(exc, "_stackTrace", None) or getattr(exc, "_stacktrace", None)
    return stack if isinstance(stack, str) and stack.strip() else None


def text_of(exc: BaseException) -> str:
    """Everything an exception says: its text, which for py4j's errors holds the Java
    exceptions and their causes too, and the Java stack pyspark keeps beside its own."""
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:  # a py4j error asks the JVM for its text: it cannot once the JVM is gone
        text = f"{type(exc).__name__}: {UNREADABLE}"
    stack = java_stack(exc)
    return f"{text}\n{stack}" if stack and stack not in text else text


#: An OSError's errno that names a cause on its own.
_ERRNO_CAUSES = {
    errno.ENOSPC: NO_SPACE,
    errno.EDQUOT: NO_SPACE,
    errno.EROFS: READ_ONLY,
    errno.EACCES: NOT_WRITABLE,
    errno.EPERM: NOT_WRITABLE,
}

#: Texts that name a cause, most specific first; the first that matches anywhere in the
#: chain wins. Java's, Hadoop's, delta-rs's (Rust's `os error N`) and librdkafka's. (The
#: ledger's own full or read-only database is said by ledger/store/write_failures.py, in
#: these words, naming the ledger.)
_TEXT_CAUSES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        NO_SPACE,
        re.compile(
            r"No space left on device|os error 28\b|Disk quota exceeded",
            re.I,
        ),
    ),
    (
        READ_ONLY,
        re.compile(
            r"Read-only file system|os error 30\b",
            re.I,
        ),
    ),
    (SPARK_OOM, re.compile(r"java\.lang\.OutOfMemoryError(?::\s*(?P<detail>[^\n]+))?")),
    (PYTHON_OOM, re.compile(r"\bMemoryError\b[^\n]*")),
    (
        WORKER_IMPORT,
        re.compile(
            r"from the Python worker:\s*\nTraceback \(most recent call last\):\n(?:[ \t][^\n]*\n)*"
            r"(?:ModuleNotFoundError|ImportError): (?P<detail>[^\n]+)"
        ),
    ),
    (
        EXECUTOR_LOST,
        re.compile(
            r"ExecutorLostFailure[^\n]*|Executor heartbeat timed out[^\n]*|"
            r"Python worker exited unexpectedly[^\n]*"
        ),
    ),
    (
        SPARK_GONE,
        re.compile(
            r"Answer from Java side is empty|Error while sending or "
            r"receiving|SparkContext was shut down|Py4JNetworkError|"
            r"Cannot call methods on a stopped SparkContext|" + re.escape(UNREADABLE)
        ),
    ),
    (
        KAFKA_AUTHORIZATION,
        re.compile(
            r"(?:Topic|Group|Cluster|TransactionalId)AuthorizationException[^\n]*|"
            r"(?:TOPIC|GROUP|CLUSTER|TRANSACTIONAL_ID)_AUTHORIZATION_FAILED[^\n]*|"
            r"Not authorized to access (?:topics|group)[^\n]*"
        ),
    ),
    (
        NOT_DELTA,
        re.compile(
            r"DELTA_MISSING_DELTA_TABLE[^\n]*|DELTA_TABLE_NOT_FOUND[^\n]*|"
            r"is not a Delta table[^\n]*|"
            r"No files in log segment|TableNotFoundError"
        ),
    ),
    (
        NOT_WRITABLE,
        re.compile(
            r"Permission denied|os error 13\b|AccessDeniedException: "
            r"(?!s3a://)"
        ),
    ),
    (CANNOT_CREATE, re.compile(r"Mkdirs failed to create (?P<path>\S+)")),
)

#: Where a text names the path it failed on: Hadoop's folder, Spark's write, delta-rs's file.
_PATHS = (
    re.compile(r"Mkdirs failed to create (?P<path>\S+)"),
    re.compile(r"Task failed while writing rows to (?P<path>\S+?)\.?(?:\s|$)"),
    re.compile(
        r"(?:Unable to (?:open|create|copy data to|rename) file|Unable to access)\s+"
        r"(?P<path>/[^\s:]+)"
    ),
    re.compile(r"\bPath does not exist: (?P<path>\S+)"),
    re.compile(r"`(?P<path>[^`]+)` (?:is not a Delta table|doesn't exist)"),
    re.compile(r"(?P<path>file:/[^\s:,;'\"()]+)"),
)
#: Hadoop's commit protocol writes under `<folder>/_temporary/...`: the folder is the news.
_TEMPORARY = re.compile(r"/_temporary(?:/.*)?$")
_SPARK_SERVICES = (SPARK_OOM, EXECUTOR_LOST, SPARK_GONE, WORKER_IMPORT)
#: The causes that are a folder's, not a service's: each names a path.
STORAGE_CAUSES = (NO_SPACE, READ_ONLY, NOT_WRITABLE, CANNOT_CREATE)


def local_path(path: str) -> str:
    """`file:/x` as `/x`, without Hadoop's `_temporary/...` tail."""
    plain = re.sub(r"^file:(?://)?(?=/)", "", path)
    return _TEMPORARY.sub("", plain).rstrip(".")


def _path_in(texts: Sequence[str]) -> str | None:
    for pattern in _PATHS:
        for text in texts:
            found = pattern.search(text)
            if found:
                return local_path(found.group("path"))
    return None


def classify(
    exc: BaseException,
    context: FailureContext = FailureContext(),
    probe: Callable[[str], str | None] | None = None,
) -> KnownCause | None:
    """The known cause of `exc` (searched through its whole chain), or None if unforeseen.

    `probe`, given a path, says which storage cause the file system shows there (or None):
    it turns Hadoop's `Mkdirs failed` into read-only, permission denied or no space.
    """
    errors = list(chain(exc))
    texts = [text_of(e) for e in errors]
    for error in errors:
        if isinstance(error, OSError) and error.errno in _ERRNO_CAUSES:
            cause = _ERRNO_CAUSES[error.errno]
            path = error.filename or _path_in(texts) or _located(context)
            return KnownCause(cause, str(path))
    for cause, pattern in _TEXT_CAUSES:
        found = next((m for t in texts if (m := pattern.search(t))), None)
        if found is None:
            continue
        if cause in STORAGE_CAUSES:
            path = _path_in(texts) or _located(context)
            if cause == CANNOT_CREATE and probe is not None:
                cause = probe(path) or cause
            return KnownCause(cause, path)
        quoted = found.group(0).strip()[:QUOTED_CHARS]
        if cause == PYTHON_OOM:
            return KnownCause(cause, "a Python process (this one, or a Spark Python worker)")
        if cause in _SPARK_SERVICES:
            where = f"Spark at {context.spark}" if context.spark else "Spark"
            detail = (found.groupdict().get("detail") or quoted).strip()[:QUOTED_CHARS]
            if cause == SPARK_GONE and context.spark_log is not None:
                # the connection is all Python saw; why the JVM exited is in its log
                heap = context.spark_out_of_memory
                cause, detail = (SPARK_OOM, heap.detail) if heap else (cause, "")
                detail += f"{'; ' if detail else ''}its log: {context.spark_log}"
            elif cause == SPARK_OOM and context.spark_log is not None:
                # Spark's error told it before the JVM exited: the log still says which task
                detail += f"; its log: {context.spark_log}"
            return KnownCause(cause, where, detail)
        if cause == KAFKA_AUTHORIZATION:
            where = f"Kafka at {context.kafka}" if context.kafka else "Kafka"
            return KnownCause(cause, where, quoted)
        if cause == NOT_DELTA:
            return KnownCause(cause, _path_in(texts) or _located(context), quoted)
    return _exiting_on_memory(errors, texts, context)


def _exiting_on_memory(
    errors: Sequence[BaseException], texts: Sequence[str], context: FailureContext
) -> KnownCause | None:
    """A Spark error no text explains, raised while Spark's handler exits this process's
    JVM on an OutOfMemoryError (its log says so): the context stopping under the call threw
    it, so it is the heap's (resources/failures/jvm_log.py)."""
    heap = context.spark_out_of_memory
    if heap is None or not heap.exiting or context.spark_log is None:
        return None
    spark_error = any(type(e).__name__ == "Py4JJavaError" for e in errors) or any(
        "org.apache.spark." in text for text in texts
    )
    if not spark_error:
        return None
    where = f"Spark at {context.spark}" if context.spark else "Spark"
    return KnownCause(SPARK_OOM, where, f"{heap.detail}; its log: {context.spark_log}")


def _located(context: FailureContext) -> str:
    """The place a path-less storage error is about: the pipeline's locations."""
    if context.locations:
        return "under " + ", ".join(dict.fromkeys(local_path(p) for p in context.locations))
    return "a path the error does not name"


def local_folder_problem(path: str) -> str | None:
    """The storage cause the local file system shows at `path` (its nearest existing folder):
    read-only, not writable by this user, or full; None if none of these, or not local.

    `os.access` asks the kernel as this user would write, so a read-only mount is seen even
    by root, whom permission bits do not stop.
    """
    if "://" in path:
        return None
    folder = Path(path)
    while not folder.exists():
        if folder.parent == folder:
            return None
        folder = folder.parent
    return folder_problem(folder)
