"""What a failed Spark stage tells the operator when the cause is Kafka.

The Kafka client inside Spark (the driver's admin client that plans the read, the executors'
consumers that fetch it) gives up on a dead cluster with a Java exception, which reaches
Python wrapped in a Py4J or pyspark error whose text is the Java stack trace. The operator
must get one line naming the cluster and the batch, exit code 2, not hundreds of lines of
stack. The messages below are the first lines Spark 4.2's Kafka source really produced
(tests/test_service_restarts.py produces the first one end to end against a stopped broker).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from jobs.stage.spark_stager import SparkStager, stage_failure
from ledger.core.errors import AuthenticationError, UnreachableError
from ledger.core.protocol import BatchState, OffsetRange
from ledger.host.process import this_owner
from resources.config.loading import load_config
from tests.fixtures.batches import a_batch

BOOTSTRAP = "127.0.0.1:9"
STORE = "s3://lake/pageviews"
LABEL = "pageviews/7 attempt 1"

ADMIN_TIMEOUT = (
    "An error occurred while calling o71.count.\n"
    ": java.util.concurrent.ExecutionException: org.apache.kafka.common.errors."
    "TimeoutException: Timed out waiting for a node assignment. Call: listNodes\n"
    "\tat java.base/java.util.concurrent.CompletableFuture.reportGet(CompletableFuture.java:396)\n"
    "\tat org.apache.spark.sql.kafka010.KafkaOffsetReaderAdmin.withRetries(...)\n"
)
FETCH_TIMEOUT = (
    "An error occurred while calling o212.save.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 "
    "failed 1 times, most recent failure: Lost task 0.0 in stage 3.0 (TID 5): "
    "java.util.concurrent.TimeoutException: Cannot fetch record for offset 120 in 30000 "
    "milliseconds\n"
    "\tat org.apache.spark.sql.kafka010.consumer.KafkaDataConsumer.fetchData(...)\n"
)
REFUSED = (
    "An error occurred while calling o71.count.\n"
    ": org.apache.kafka.common.errors.SaslAuthenticationException: Authentication failed "
    "during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512\n"
)
STORE_DOWN = (
    "An error occurred while calling o367.parquet.\n"
    ": java.net.ConnectException: getFileStatus on s3a://lake/pageviews/staged/pageviews/"
    "batch-000000000001-attempt-1-ef40: software.amazon.awssdk.core.exception."
    "SdkClientException: Unable to execute HTTP request: Connect to 127.0.0.1:34575 "
    "[/127.0.0.1] failed: Connection refused (SDK Attempt Count: 2)\n"
    "\tat org.apache.hadoop.fs.s3a.impl.ErrorTranslation.wrapWithInnerIOE(...)\n"
)
STORE_DENIED = (
    "An error occurred while calling o367.parquet.\n"
    ": java.nio.file.AccessDeniedException: s3a://lake/pageviews/staged: getFileStatus on "
    "s3a://lake/pageviews/staged: software.amazon.awssdk.services.s3.model.S3Exception: "
    "Access Denied (Service: S3, Status Code: 403)\n"
)
#: a standalone cluster's executor gone: java.net names, but neither Kafka nor the store
EXECUTOR_LOST = (
    "An error occurred while calling o212.save.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 3.0 "
    "failed 4 times: java.io.IOException: Failed to connect to /127.0.0.1:41235\n"
    "Caused by: io.netty.channel.AbstractChannel$AnnotatedConnectException: Connection "
    "refused: /127.0.0.1:41235\n"
    "Caused by: java.net.ConnectException: Connection refused\n"
    "Caused by: java.net.SocketTimeoutException: connect timed out\n"
)
TRANSFORM_BUG = (
    "[PYTHON_EXCEPTION] An exception was thrown from the Python worker.\n"
    "ZeroDivisionError: division by zero\n"
)


class Py4JJavaError(Exception):
    """Shaped like py4j's: the message is the Java stack trace."""


def classify(message: str) -> Exception | None:
    return stage_failure(Py4JJavaError(message), bootstrap=BOOTSTRAP, store=STORE, label=LABEL)


@pytest.mark.parametrize("message", [ADMIN_TIMEOUT, FETCH_TIMEOUT])
def test_kafka_out_of_reach_is_one_line_naming_the_cluster_and_the_batch(message: str) -> None:
    error = classify(message)
    assert isinstance(error, UnreachableError)
    text = str(error)
    assert "\n" not in text and "\tat " not in text, text
    assert BOOTSTRAP in text and LABEL in text, text
    assert "Timed out waiting for a node assignment" in text or "Cannot fetch record" in text


def test_credentials_refused_inside_spark_are_an_authentication_error() -> None:
    error = classify(REFUSED)
    assert isinstance(error, AuthenticationError)
    assert "\n" not in str(error) and "SaslAuthenticationException" in str(error)


def test_a_store_out_of_reach_is_one_line_naming_the_table_and_the_batch() -> None:
    error = classify(STORE_DOWN)
    assert isinstance(error, UnreachableError)
    text = str(error)
    assert "\n" not in text and "\tat " not in text, text
    assert STORE in text and LABEL in text and "Connection refused" in text, text
    assert BOOTSTRAP not in text, text


def test_a_store_refusing_access_inside_spark_is_an_authentication_error() -> None:
    error = classify(STORE_DENIED)
    assert isinstance(error, AuthenticationError)
    assert "Access Denied" in str(error) and STORE in str(error)


@pytest.mark.parametrize("message", [TRANSFORM_BUG, EXECUTOR_LOST], ids=["transform", "executor"])
def test_a_failure_that_is_not_the_services_is_left_as_it_is(message: str) -> None:
    # a transform's own bug keeps its traceback: it is the user's code, not the cluster; a
    # lost executor names java.net exceptions too, and must not be blamed on the store
    assert classify(message) is None


class _DeadKafkaSession:
    """A session whose Kafka read fails as Spark's does when the cluster is down."""

    @property
    def read(self) -> Any:
        raise Py4JJavaError(ADMIN_TIMEOUT)


def test_the_stager_raises_the_one_line_error_and_keeps_the_cause(tmp_path: Path) -> None:
    doc = {
        "pipeline": "pageviews",
        "kafka": {"bootstrap_servers": BOOTSTRAP, "topic": "t"},
        "delta": {"table_uri": str(tmp_path / "t"), "quarantine_uri": str(tmp_path / "q")},
        "ledger": {"url": f"sqlite:///{tmp_path / 'ledger.db'}"},
        "transform": "jobs.examples.pageviews:transform",
    }
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc))
    stager = SparkStager(load_config(tmp_path / "p.yaml"), lambda: _DeadKafkaSession())
    batch = a_batch(
        7,
        BatchState.PLANNED,
        app_id="pageviews",
        token="t0ken",
        owner=this_owner(),
        ranges=(OffsetRange("t", 0, 0, 10),),
    )
    with pytest.raises(UnreachableError) as raised:
        stager.stage(batch)
    assert isinstance(raised.value.__cause__, Py4JJavaError)
    assert BOOTSTRAP in str(raised.value) and batch.label in str(raised.value)


#: pyspark's SparkConnectGrpcException once its retries of a dead server are spent
CONNECT_GONE = (
    "<_MultiThreadedRendezvous of RPC that terminated with:\n"
    "\tstatus = StatusCode.UNAVAILABLE\n"
    '\tdetails = "failed to connect to all addresses; last error: UNKNOWN: '
    'ipv4:127.0.0.1:36885: Failed to connect to remote host: Connection refused"\n'
    '\tdebug_error_string = "UNAVAILABLE:failed to connect to all addresses"\n>'
)


def test_a_connect_server_that_stopped_answering_is_named_with_its_details() -> None:
    error = stage_failure(
        Exception(CONNECT_GONE),
        bootstrap=BOOTSTRAP,
        store=STORE,
        label=LABEL,
        spark="sc://127.0.0.1:36885",
    )
    assert isinstance(error, UnreachableError)
    text = str(error)
    assert "\n" not in text, text
    assert "Spark Connect server at sc://127.0.0.1:36885 stopped answering" in text
    assert LABEL in text and "Connection refused" in text and "nothing was voted" in text
