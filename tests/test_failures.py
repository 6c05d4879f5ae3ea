"""The failure classifier (resources/failures/causes.py) over the texts real failures carry.

Captured here, stack frames cut: the Py4J errors `exactly run` raised on a real full tmpfs
and a real read-only one (tests/test_failure_lines.py); a real driver's OutOfMemoryError
through py4j; delta-spark reading a folder that holds no Delta table; deltalake (delta-rs)
writing to a full and to a read-only tmpfs, and opening a folder with no log; librdkafka's
errors are confluent_kafka's own objects. A lost executor and Kafka's authorization
exceptions inside Spark could not be produced on this machine (no cluster, no ACL
authorizer): their texts follow the formats Spark's and Kafka's sources write. Integration
tests check the whole path (the CLI's line and exit code, Dagster's run view); these check
that each cause is found and named with its path or service, and that an unknown error is
left unknown.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import dagster as dg
import pytest
from confluent_kafka import KafkaError, KafkaException
from py4j.protocol import Py4JNetworkError

from ledger.core.errors import ConfigError
from orchestration.health.failures import one_line_failures
from orchestration.resources import PipelineResource, pipeline_key
from resources.failures.causes import (
    CANNOT_CREATE,
    EXECUTOR_LOST,
    KAFKA_AUTHORIZATION,
    NO_SPACE,
    NOT_DELTA,
    NOT_WRITABLE,
    PYTHON_OOM,
    READ_ONLY,
    SPARK_GONE,
    SPARK_OOM,
    WORKER_IMPORT,
    FailureContext,
    classify,
    local_folder_problem,
)
from resources.failures.jvm_log import TAIL_BYTES, out_of_memory_in
from resources.failures.lines import (
    UNFORESEEN,
    describe_failure,
    first_line,
    log_file,
    unforeseen_line,
    write_traceback,
)

ATTEMPT = (
    "/tmp/pytest-of-root/pytest-0/test_a_full_disk_is_one_line_n0/mnt/table/staged/pageviews/"
    "batch-000000000002-attempt-1-a47fbb2a20fb44c2ab975f4a81b0cb73"
)
#: `exactly run` on a full tmpfs (Spark 4.2, Hadoop's local file system), frames cut.
SPARK_NO_SPACE = f"""An error occurred while calling o262.parquet.
: org.apache.spark.SparkException: [TASK_WRITE_FAILED] Task failed while writing rows to \
file:{ATTEMPT}. SQLSTATE: 58030
\tat org.apache.spark.sql.errors.QueryExecutionErrors$.taskFailedWhileWritingRowsError(\
QueryExecutionErrors.scala:777)
Caused by: org.apache.hadoop.fs.FSError: java.io.IOException: No space left on device
\tSuppressed: org.apache.hadoop.fs.FSError: java.io.IOException: No space left on device
\t\tCaused by: java.io.IOException: No space left on device
Caused by: java.io.IOException: No space left on device
"""
#: ... on a tmpfs remounted read-only.
SPARK_MKDIRS = f"""An error occurred while calling o262.parquet.
: org.apache.spark.SparkException: [TASK_WRITE_FAILED] Task failed while writing rows to \
file:{ATTEMPT}. SQLSTATE: 58030
Caused by: java.io.IOException: Mkdirs failed to create file:{ATTEMPT}/_temporary/0/\
_temporary/attempt_202611261109187930485349771549564_0000_m_000000_0/exactly_output=table \
(exists=false, cwd=file:/work/h-errors)
\tat org.apache.hadoop.fs.ChecksumFileSystem.create(ChecksumFileSystem.java:715)
"""
DELTA_RS_NO_SPACE = (
    "Failed to parse parquet: External: Generic LocalFileSystem error: Unable to copy data to "
    "file: No space left on device (os error 28)"
)
DELTA_RS_READ_ONLY = (
    "Failed to parse parquet: External: Generic LocalFileSystem error: Unable to open file "
    "/tmp/h-err-m/t/part-00000-5fd0d655-428e-42dd-8b4e-dc365ee777b0-c000.snappy.parquet#1: "
    "Read-only file system (os error 30)"
)
SPARK_TOPIC_DENIED = """An error occurred while calling o98.load.
: org.apache.kafka.common.errors.TopicAuthorizationException: Not authorized to access \
topics: [orders]
"""
#: A real driver's heap exhausted through py4j (an array too big for spark.driver.memory).
SPARK_OOM_TEXT = """An error occurred while calling z:java.lang.reflect.Array.newInstance.
: java.lang.OutOfMemoryError: Java heap space
\tat java.base/java.lang.reflect.Array.newArray(Native Method)
\tat java.base/java.lang.reflect.Array.newInstance(Array.java:78)
"""
#: delta-spark reading a folder of other files (pyspark's AnalysisException, with the Java
#: stack pyspark keeps beside it).
DELTA_SPARK_NOT_DELTA = """[DELTA_TABLE_NOT_FOUND] Delta table `/tmp/h-err-nd2` doesn't exist.
org.apache.spark.sql.delta.DeltaAnalysisException: [DELTA_TABLE_NOT_FOUND] Delta table \
`/tmp/h-err-nd2` doesn't exist.
\tat org.apache.spark.sql.delta.DeltaErrorsBase.nonExistentDeltaTable(DeltaErrors.scala:1881)
"""
#: Not captured here (no ACL authorizer, no cluster to lose an executor from): the formats
#: of Spark's and Kafka's messages, as their sources write them.
EXECUTOR_LOST_TEXT = """An error occurred while calling o262.parquet.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 3.0 \
failed 4 times, most recent failure: Lost task 1.3 in stage 3.0 (TID 14) (10.0.0.7 executor \
2): ExecutorLostFailure (executor 2 exited caused by one of the running tasks) Reason: \
Command exited with code 137
"""


class JavaError(Exception):
    """Stands for py4j's Py4JJavaError, whose text (all the classifier reads) is the Java
    exception's and needs a live JVM to build."""


def test_a_full_disk_under_a_spark_write_names_the_folder_it_wrote() -> None:
    known = classify(JavaError(SPARK_NO_SPACE))
    assert known is not None
    assert (known.cause, known.where) == (NO_SPACE, ATTEMPT)
    assert known.line().startswith(f"no space left on device: {ATTEMPT}; free space there")


def test_mkdirs_failed_is_what_the_file_system_shows_there() -> None:
    asked: list[str] = []

    def probe(path: str) -> str | None:
        asked.append(path)
        return READ_ONLY

    known = classify(JavaError(SPARK_MKDIRS), probe=probe)
    assert known is not None and (known.cause, known.where) == (READ_ONLY, ATTEMPT)
    assert asked == [ATTEMPT]  # Hadoop's _temporary/... tail is not the operator's folder
    unprobed = classify(JavaError(SPARK_MKDIRS))
    assert unprobed is not None and unprobed.cause == CANNOT_CREATE


def test_delta_rs_errors_name_their_file_or_the_pipeline_s_locations() -> None:
    context = FailureContext(locations=["/data/pv/table", "/data/pv/quarantine"])
    full = classify(JavaError(DELTA_RS_NO_SPACE), context)
    assert full is not None and full.cause == NO_SPACE
    assert full.where == "under /data/pv/table, /data/pv/quarantine"
    read_only = classify(JavaError(DELTA_RS_READ_ONLY), context)
    assert read_only is not None and read_only.cause == READ_ONLY
    assert read_only.where.startswith("/tmp/h-err-m/t/part-00000-")


@pytest.mark.parametrize(
    ("code", "cause"),
    [
        (errno.ENOSPC, NO_SPACE),
        (errno.EROFS, READ_ONLY),
        (errno.EACCES, NOT_WRITABLE),
    ],
)
def test_an_os_error_anywhere_in_the_chain_names_its_file(code: int, cause: str) -> None:
    try:
        try:
            raise OSError(code, "os says", "/data/pv/table/_delta_log/00000000000000000003.json")
        except OSError as inner:
            raise RuntimeError("commit failed") from inner
    except RuntimeError as outer:
        known = classify(outer)
    assert known is not None
    assert (known.cause, known.where) == (
        cause,
        "/data/pv/table/_delta_log/00000000000000000003.json",
    )


def test_kafka_authorization_from_spark_and_from_librdkafka_names_the_cluster() -> None:
    context = FailureContext(kafka="broker-1:9093")
    spark = classify(JavaError(SPARK_TOPIC_DENIED), context)
    assert spark is not None and spark.cause == KAFKA_AUTHORIZATION
    assert spark.where == "Kafka at broker-1:9093"
    assert "Not authorized to access topics: [orders]" in spark.line()
    for code in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED):
        known = classify(KafkaException(KafkaError(code)), context)
        assert known is not None and known.cause == KAFKA_AUTHORIZATION, code


def test_spark_out_of_memory_and_a_lost_executor_name_spark() -> None:
    context = FailureContext(spark="spark://10.0.0.2:7077")
    oom = classify(JavaError(SPARK_OOM_TEXT), context)
    assert oom is not None and (oom.cause, oom.detail) == (SPARK_OOM, "Java heap space")
    assert oom.line().startswith(
        "Spark ran out of memory: Spark at spark://10.0.0.2:7077 (Java heap space); "
        "give Spark more memory"
    )
    lost = classify(JavaError(EXECUTOR_LOST_TEXT), context)
    assert lost is not None and lost.cause == EXECUTOR_LOST
    assert "ExecutorLostFailure (executor 2 exited" in lost.line()
    # the chain a query raised once the driver's JVM was killed (captured with kill -9)
    refused = ConnectionRefusedError(111, "Connection refused")
    refused.__context__ = Py4JNetworkError("Answer from Java side is empty")
    gone = classify(refused, context)
    assert gone is not None and gone.cause == SPARK_GONE


def oom_line(spark: str, log: Path | None = None) -> str:
    """How the line of a Spark that ran out of heap begins, its driver's log named if any."""
    where = f"Java heap space; its log: {log}" if log is not None else "Java heap space"
    return f"Spark ran out of memory: Spark at {spark} ({where}); "


def test_a_driver_jvm_that_exited_is_told_by_its_log(tmp_path: Path) -> None:
    """Python sees only the lost connection; the JVM's log says whether it ran out of heap
    (Spark's handler exits a local-mode JVM on a task's OutOfMemoryError) and is named."""
    gone = ConnectionRefusedError(111, "Connection refused")
    gone.__context__ = Py4JNetworkError("Answer from Java side is empty")
    log = tmp_path / "spark-1.log"
    log.write_text(
        "x"
        * (TAIL_BYTES + 10)  # what lies before the tail is not read
        + "\n26/11/27 03:09:39 ERROR SparkUncaughtExceptionHandler: Uncaught exception in "
        "thread Thread[#71,Executor task launch worker for task 0.0 in stage 2.0 (TID 2)]\n"
        "java.lang.OutOfMemoryError: Java heap space\n\tat java.base/java.util.Arrays.copyOf\n"
    )
    context = FailureContext(spark="local[2]", spark_log=log)
    oom = describe_failure(gone, "exactly run", context)
    assert oom.cause == SPARK_OOM
    assert oom.line.startswith(oom_line("local[2]", log))
    log.write_text("java.lang.OutOfMemoryError: Java heap space\n" + "y" * TAIL_BYTES)
    killed = describe_failure(gone, "exactly run", context)  # the OOM killer says nothing
    assert killed.cause == SPARK_GONE
    assert f"(its log: {log}); see its log for why" in killed.line
    assert out_of_memory_in(tmp_path / "absent.log") is None

    # the JVM died under the call: py4j's error cannot even print itself (seen in CI)
    class Py4JJavaError(Exception):
        def __str__(self) -> str:
            raise ConnectionRefusedError(111, "Connection refused")

    log.write_text("java.lang.OutOfMemoryError: Java heap space\n")
    unreadable = describe_failure(Py4JJavaError(), "exactly run", context)
    assert unreadable.cause == SPARK_OOM, unreadable.line


#: What `exactly run` raised in CI when the task's OutOfMemoryError raced the JVM's exit:
#: Spark's handler was stopping the context while the write still failed its job, and the
#: write got a NullPointerException from the stopped scheduler, wrapped as an internal error.
EXITING_JVM_TEXT = """An error occurred while calling o289.parquet.
: org.apache.spark.SparkException: [INTERNAL_ERROR] Executed command failed. You hit a bug \
in Spark or the Spark plugins you use. SQLSTATE: XX000
\tat org.apache.spark.SparkException$.internalError(SparkException.scala:119)
Caused by: java.lang.NullPointerException: Cannot invoke "org.apache.spark.scheduler.\
DAGScheduler.cleanupQueryJobs(long)" because the return value of "org.apache.spark.\
SparkContext.dagScheduler()" is null
"""


def test_a_spark_error_raised_while_the_jvm_exits_on_its_heap_is_told_by_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The JVM's log says it ran out of heap: whatever Spark error the call got while the
    JVM went down is that, not an unforeseen bug of Spark's. Without that log line the same
    error stays unforeseen."""

    class Py4JJavaError(Exception):
        pass

    monkeypatch.setenv("EXACTLY_STATE_DIR", str(tmp_path))  # the unforeseen's log file
    error = Py4JJavaError(EXITING_JVM_TEXT)
    log = tmp_path / "spark-1.log"
    log.write_text("26/11/27 09:10:23 INFO SparkContext: Running Spark version 4.2.0\n")
    context = FailureContext(spark="local[2]", spark_log=log)
    assert describe_failure(error, "exactly run", context).cause == UNFORESEEN
    # an OutOfMemoryError a task's failure reported, which the JVM lived through
    log.write_text("ERROR Executor: Exception in task 0.0\njava.lang.OutOfMemoryError: x\n")
    assert describe_failure(error, "exactly run", context).cause == UNFORESEEN
    log.write_text(
        "26/11/27 09:10:23 ERROR SparkUncaughtExceptionHandler: Uncaught exception in thread "
        "Thread[Executor task launch worker for task 0.0 in stage 0.0 (TID 0),5,main]\n"
        "java.lang.OutOfMemoryError: Java heap space\n\tat org.apache.spark.sql.catalyst\n"
        "26/11/27 09:10:23 ERROR FileFormatWriter: Aborting job 279efe29.\n"
        "Caused by: java.lang.OutOfMemoryError: Java heap space\n"  # the job's, told after
    )
    oom = describe_failure(error, "exactly run", context)
    assert oom.cause == SPARK_OOM, oom.line
    assert oom.line.startswith(
        f"Spark ran out of memory: Spark at local[2] (Java heap space; its log: {log}); "
    ), oom.line
    # an error that is not Spark's is not blamed on the JVM's heap
    plain = describe_failure(ValueError("a transform's own bug"), "exactly run", context)
    assert plain.cause == UNFORESEEN


class PythonException(Exception):
    """Stands for pyspark's PythonException: what a Spark Python worker raised, as text."""


def python_worker_error(last_line: str) -> PythonException:
    """The error pyspark raises in the driver when a Python worker's UDF failed (its text
    as captured from a standalone cluster's worker; frames shortened)."""
    worker = "/venv/lib/python3.11/site-packages/pyspark/python/lib/pyspark.zip/pyspark"
    return PythonException(
        "An exception was thrown from the Python worker:\n"
        "Traceback (most recent call last):\n"
        f'  File "{worker}/worker.py", line 3602, in main\n'
        "    func, profiler, deserializer, serializer = read_udfs(\n"
        "                                               ^^^^^^^^^^\n"
        f'  File "{worker}/serializers.py", line 454, in loads\n'
        "    return cloudpickle.loads(obj, encoding=encoding)\n"
        f"{last_line}\n"
    )


def test_a_module_spark_s_python_workers_cannot_import_is_named_with_what_to_do() -> None:
    """A transform importable in the driver (PYTHONPATH, a package installed there only)
    whose UDF's module the cluster's workers lack."""
    error = python_worker_error("ModuleNotFoundError: No module named 'orders_clean'")
    known = classify(error, FailureContext(spark="spark://10.0.0.2:7077"))
    assert known is not None and known.cause == WORKER_IMPORT
    assert known.line().startswith(
        f"{WORKER_IMPORT}: Spark at spark://10.0.0.2:7077 (No module named 'orders_clean'); "
        "install it where Spark runs its Python workers, or keep it beside the config"
    )


def test_a_python_worker_s_own_error_is_quoted_in_the_unforeseen_line() -> None:
    error = python_worker_error("ZeroDivisionError: division by zero")
    assert classify(error) is None
    assert first_line(error) == (
        "PythonException in a Spark Python worker: ZeroDivisionError: division by zero"
    )


def test_a_path_that_is_not_a_delta_table() -> None:
    text = "[DELTA_MISSING_DELTA_TABLE] `/data/pv/table` is not a Delta table. SQLSTATE: 42P01"
    known = classify(JavaError(text), FailureContext(locations=["/data/pv/table"]))
    assert known is not None and (known.cause, known.where) == (NOT_DELTA, "/data/pv/table")
    spark = classify(JavaError(DELTA_SPARK_NOT_DELTA))
    assert spark is not None and (spark.cause, spark.where) == (NOT_DELTA, "/tmp/h-err-nd2")
    delta_rs = classify(JavaError("Generic delta kernel error: No files in log segment"))
    assert delta_rs is not None and delta_rs.cause == NOT_DELTA


def test_an_unforeseen_error_is_left_unknown_and_its_traceback_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXACTLY_STATE_DIR", str(tmp_path))
    text = """An error occurred while calling o262.parquet.
: org.apache.spark.SparkRuntimeException: [USER_RAISED_EXCEPTION] a transform's own bug
\tat org.apache.spark.sql.errors.QueryExecutionErrors$.raiseError(QueryExecutionErrors.scala:2836)
"""
    try:
        raise JavaError(text)
    except JavaError as exc:
        error = exc
    assert classify(error) is None
    assert first_line(error) == (
        "JavaError: org.apache.spark.SparkRuntimeException: [USER_RAISED_EXCEPTION] a "
        "transform's own bug"
    )
    log = write_traceback(error, "exactly run")
    assert log is not None and log.parent == tmp_path / "logs"
    assert "QueryExecutionErrors.scala:2836" in log.read_text()
    line = unforeseen_line(error, "exactly run", log)
    assert line.endswith(f"(full traceback in {log})")
    assert "\n" not in line


def test_the_probe_sees_a_full_or_read_only_folder_only_where_it_is(tmp_path: Path) -> None:
    assert local_folder_problem(str(tmp_path / "not" / "there" / "yet")) is None
    assert local_folder_problem("s3://bucket/table") is None


def run_op_raising(error: Exception, state: Path) -> dg.ExecuteInProcessResult:
    """A one-op job of pipeline `pv` whose op, under `one_line_failures`, raises `error`."""

    @dg.op(name="pv_stage", required_resource_keys={pipeline_key("pv")})
    @one_line_failures("pv")
    def stage(context) -> None:  # unannotated: Dagster cannot read a string annotation
        raise error

    resource = PipelineResource(config_path=str(state / "no-such-config.yaml"))

    @dg.job(resource_defs={pipeline_key("pv"): resource})
    def failing() -> None:
        stage()

    with dg.instance_for_test() as instance:
        return failing.execute_in_process(instance=instance, raise_on_error=False)


def step_failure(result: dg.ExecuteInProcessResult) -> tuple[str, list[str]]:
    (failed,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    shown = failed.step_failure_data.user_failure_data
    error = failed.step_failure_data.error
    assert shown is not None and shown.description is not None and error is not None
    assert error.message == shown.description
    return shown.description, error.stack


def test_an_op_s_failure_is_the_cli_s_line_without_frames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXACTLY_STATE_DIR", str(tmp_path))
    full = OSError(errno.ENOSPC, "No space left on device", "/data/pv/table/part-0.parquet")
    line, stack = step_failure(run_op_raising(full, tmp_path))
    assert line.startswith("no space left on device: /data/pv/table/part-0.parquet; ")
    assert stack == []

    line, stack = step_failure(run_op_raising(ZeroDivisionError("division by zero"), tmp_path))
    (log,) = (tmp_path / "logs").glob("error-*.log")
    assert line == (
        f"pv_stage failed: ZeroDivisionError: division by zero (full traceback in {log})"
    )
    assert stack == []
    assert "Traceback (most recent call last)" in log.read_text()


def test_delta_rs_on_a_full_local_disk_is_not_called_an_object_store_failure() -> None:
    from deltalake.exceptions import DeltaError

    from resources.delta.options import store_failure

    full = store_failure("/data/pv/table", DeltaError(DELTA_RS_NO_SPACE))
    assert str(full).startswith("no space left on device: /data/pv/table; free space there")
    other = store_failure("s3://b/pv", DeltaError("Generic S3 error: connection refused"))
    assert str(other) == "s3://b/pv: the object store failed: Generic S3 error: connection refused"


def test_old_log_files_go_once_there_are_more_than_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXACTLY_STATE_DIR", str(tmp_path))
    logs = tmp_path / "logs"
    logs.mkdir()
    for n in range(5):
        old = logs / f"error-2026010{n}T000000-1.log"
        old.write_text("old")
        os.utime(old, (1_000_000 + n, 1_000_000 + n))
    (logs / "spark-20260101T000000-1.log").write_text("another kind")
    new = log_file("error", keep=3)
    assert sorted(p.name for p in logs.glob("error-*")) == [
        "error-20260103T000000-1.log",
        "error-20260104T000000-1.log",
    ]
    assert (logs / "spark-20260101T000000-1.log").exists()
    assert new.parent == logs and not new.exists()


def test_python_out_of_memory_is_known_and_not_taken_for_java_s() -> None:
    known = classify(MemoryError())
    assert known is not None and known.cause == PYTHON_OOM
    java = classify(JavaError(SPARK_OOM_TEXT))
    assert java is not None and java.cause == SPARK_OOM


def test_a_library_s_log_record_goes_to_a_log_file_not_the_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """py4j logs a lost JVM with `logging.exception` on the root logger, which, with no
    handler, Python prints to stderr with its traceback (seen in CI under the out-of-memory
    test: the one line came after a Python traceback). The command line sends every log
    record to a file in the logs folder; the terminal keeps its one line."""
    import argparse
    import logging

    import exactly_cli

    monkeypatch.setenv("EXACTLY_STATE_DIR", str(tmp_path))
    monkeypatch.setattr(logging.getLogger(), "handlers", [])

    def lose_the_jvm(_args: argparse.Namespace) -> int:
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except ConnectionResetError:
            logging.exception("Exception while sending command.")
        raise ConfigError("the one line")

    def parser() -> argparse.ArgumentParser:
        built = argparse.ArgumentParser(prog="exactly")
        built.set_defaults(func=lose_the_jvm, command="run")
        return built

    monkeypatch.setattr(exactly_cli, "build_parser", parser)
    assert exactly_cli.main([]) == 2
    err = capsys.readouterr().err
    assert err == "exactly: error: the one line\n", err
    (log,) = (tmp_path / "logs").glob("python-*.log")
    assert "Traceback" in log.read_text() and "Connection reset by peer" in log.read_text()


def test_an_out_of_memory_spark_reports_itself_names_the_driver_s_log(tmp_path: Path) -> None:
    """The task's OutOfMemoryError reached Python in Spark's own error, before (or instead of)
    the JVM's exit (seen in CI, the same transform that usually ends the JVM first): the
    line still names the driver's log, where the operator finds which task and how much."""

    class Py4JJavaError(Exception):
        pass

    log = tmp_path / "spark-1.log"
    log.write_text("java.lang.OutOfMemoryError: Java heap space\n")
    error = Py4JJavaError(
        "An error occurred while calling o120.save.\n: org.apache.spark.SparkException: Job "
        "aborted due to stage failure: Task 0 in stage 1.0 failed 1 times, most recent "
        "failure: Lost task 0.0 in stage 1.0 (TID 1) (localhost executor driver): "
        "java.lang.OutOfMemoryError: Java heap space\n"
    )
    context = FailureContext(spark="local[2]", spark_log=log)
    oom = describe_failure(error, "exactly run", context)
    assert oom.cause == SPARK_OOM
    assert oom.line.startswith(oom_line("local[2]", log)), oom.line
    # a driver without a log of its own (a cluster's, Spark Connect's) is told without one
    remote = describe_failure(error, "exactly run", FailureContext(spark="sc://host:15002"))
    assert remote.line.startswith(oom_line("sc://host:15002"))
