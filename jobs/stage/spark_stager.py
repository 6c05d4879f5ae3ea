"""The protocol's stager (ledger/coordinator/two_phase.py `Stager`): the Spark stage job
(jobs/stage/staging.py) run for one batch, in the process's one Spark session.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from jobs.formats.format_decode import pipeline_transform
from jobs.stage.kafka_read import reader_group
from jobs.stage.staging import attempt_folder, stage
from ledger.core.batch import Batch
from ledger.core.errors import AuthenticationError, ExactlyError, UnreachableError
from ledger.core.layout import QUARANTINE, TABLE, derived_target
from ledger.core.ports import StageOutput
from resources.config.derived_spec import AnyOutput, PostgresOutput
from resources.config.pipeline_config import PipelineConfig
from resources.kafka.connection import NOT_AUTHORIZED_ADVICE
from resources.object_storage import storage
from resources.spark.progress import ProgressSink, watch
from resources.spark.session import CONNECT_RETRIES, build_session, stop_session
from resources.spark.shared_server import ensure_server, server_mode

if TYPE_CHECKING:
    from resources.object_storage.s3 import S3Access

#: What the Kafka client inside Spark says when the cluster is out of reach: the driver's
#: admin client planning the read ("Timed out waiting for a node assignment"), the
#: executors' consumers fetching it ("Cannot fetch record for offset ..."), a connection
#: dropped under either.
KAFKA_UNREACHABLE = (
    "org.apache.kafka.common.errors.TimeoutException",
    "org.apache.kafka.common.errors.DisconnectException",
    "org.apache.kafka.common.errors.NetworkException",
    "Cannot fetch record for offset",
)
#: ... and when the cluster answered and refused us: waiting will not help.
KAFKA_REFUSED = (
    "org.apache.kafka.common.errors.SaslAuthenticationException",
    "org.apache.kafka.common.errors.SslAuthenticationException",
)
#: What Spark's Kafka client raises for a principal the broker's ACLs do not allow: the
#: credentials were accepted, the read was not.
KAFKA_NOT_AUTHORIZED = (
    "org.apache.kafka.common.errors.TopicAuthorizationException",
    "org.apache.kafka.common.errors.GroupAuthorizationException",
    "org.apache.kafka.common.errors.ClusterAuthorizationException",
)
#: What s3a (Hadoop's S3 file system, on the AWS SDK v2) says when the object store does
#: not answer once its own retries are spent: `java.net.ConnectException: getFileStatus on
#: s3a://... SdkClientException: Unable to execute HTTP request: ... Connection refused`.
STORE_UNREACHABLE = (
    "Unable to execute HTTP request",
    "org.apache.hadoop.fs.s3a.AWSClientIOException",
    "java.net.ConnectException",
    "java.net.SocketTimeoutException",
    "java.net.UnknownHostException",
)
#: What the Spark Connect client says once a server stops answering (its retries spent):
#: `status = StatusCode.UNAVAILABLE`, then `details = "failed to connect to all addresses ..."`.
CONNECT_UNREACHABLE = ("StatusCode.UNAVAILABLE",)
#: A line blames the store only if it also names s3a or the AWS SDK: java.net exceptions
#: come from anything Spark connects to (a standalone cluster's lost executor says
#: "java.net.ConnectException: Connection refused" too).
STORE_CLIENT = ("s3a://", "org.apache.hadoop.fs.s3a", "software.amazon.awssdk")
#: ... and when it answered and refused our credentials or the bucket's policy did.
STORE_REFUSED = (
    "java.nio.file.AccessDeniedException: s3a://",
    "org.apache.hadoop.fs.s3a.auth.NoAuthWithAWSException",
)
#: The longest part of the Java message an error line quotes.
QUOTED_CHARS = 300


class SharedSpark:
    """One Spark session per process, created only when a batch needs staging.

    With `shared_server` the session is a Spark Connect session on the host's shared server
    for these settings (resources/spark/shared_server.py), asked for again at every call: a server
    that died or was stopped since the last batch is replaced then, and the next batch
    stages on the new one instead of failing on the old session forever.
    """

    def __init__(
        self,
        master: str,
        conf: Mapping[str, str],
        object_store: S3Access | None = None,
        *,
        shared_server: bool = False,
        connect_retries: int = CONNECT_RETRIES,
    ) -> None:
        self.master = master
        self.conf = dict(conf)
        self.object_store = object_store
        self.shared_server = shared_server
        self.connect_retries = connect_retries
        self._session: Any = None
        self._url: str | None = None

    @classmethod
    def for_config(cls, config: PipelineConfig) -> SharedSpark:
        """The session a pipeline stages with: with s3a pointed at the object store when
        any output (a derived one too: Spark stages its partials) is on `s3://`: the
        process's access, the very one boto3, pyarrow and delta-rs use."""
        uris = (
            config.delta.table_uri,
            config.delta.quarantine_uri,
            *(d.table_uri for d in config.derived if not isinstance(d, PostgresOutput)),
        )
        object_store = None
        if any(uri.startswith("s3://") for uri in uris):
            object_store = storage.s3_access()
        # EXACTLY_SPARK_SERVER=shared does not override an sc:// master: that pipeline has
        # a server already (a config that asks for both is refused when it loads)
        shared = server_mode(config.spark.server) == "shared"
        shared = shared and not config.spark.master.startswith("sc://")
        return cls(
            config.spark.master,
            config.spark.resolved_conf(),
            object_store,
            shared_server=shared,
            connect_retries=config.spark.connect_retries,
        )

    @property
    def url(self) -> str:
        """Where the session's queries go: the shared server's URL once connected, else the
        master."""
        return self._url or self.master

    def __call__(self) -> Any:
        if self.shared_server:
            url = ensure_server(self.master, self.conf, self.object_store).url
            if self._session is not None and url != self._url:
                # the old server is gone: asking it to release the session would only wait
                # out the retries; closing our end is enough
                self._session.release_session_on_close = False
                with contextlib.suppress(Exception):
                    stop_session(self._session)
                self._session = None
            self._url = url
            if self._session is None:
                self._session = build_session(
                    url,
                    self.conf,
                    object_store=self.object_store,
                    connect_retries=self.connect_retries,
                )
            return self._session
        if self._session is None:
            self._session = build_session(
                self.master,
                self.conf,
                object_store=self.object_store,
                connect_retries=self.connect_retries,
            )
        return self._session

    def warm_in_background(self, log: Callable[[str], None]) -> threading.Thread | None:
        """Start the shared server now, in a daemon thread, if this session uses one.

        The code location calls this as it loads, so the first run after `dagster dev` (or
        a deploy) finds the server up instead of starting it. A failure is only logged: the
        first batch starts the server again and fails with the error where an operator sees
        it. A process that exits mid-start leaves the start to finish on its own (the server
        runs detached, and its record names it from launch on).
        """
        if not self.shared_server:
            return None

        def warm() -> None:
            try:
                ensure_server(self.master, self.conf, self.object_store)
            except Exception as error:
                log(f"the shared Spark server did not start: {error}")

        thread = threading.Thread(target=warm, name="exactly-shared-spark", daemon=True)
        thread.start()
        return thread


class SparkStager:
    """Runs the stage job for a batch, in a Spark session created on first use.

    The pipeline's transform is loaded when the stager is built, so a config naming a
    transform that does not import fails before any batch is planned.
    """

    def __init__(
        self,
        config: PipelineConfig,
        spark_factory: Callable[[], Any],
        progress: ProgressSink | None = None,
    ) -> None:
        self.config = config
        self.spark_factory = spark_factory
        self.progress = progress
        self.transform = pipeline_transform(config)

    def stage(self, batch: Batch) -> StageOutput:
        """Stage `batch`; a Kafka cluster or an object store out of reach (or refusing us)
        inside Spark is an `ExactlyError` naming it and the batch, Spark's error its cause.

        Nothing is lost by failing here: the batch has not voted, so the next run abandons
        this attempt and plans the same range again (ledger/coordinator/recovery.py).
        The translation only changes what the operator reads: one line and exit code 2, where
        Spark would print the Java stack trace of every retry.
        """
        try:
            spark = self.spark_factory()
            with self._watched(spark, batch):
                return stage(spark, **self.job_arguments(batch))
        except ExactlyError:
            raise
        except Exception as exc:
            error = stage_failure(
                exc,
                bootstrap=self.config.kafka.bootstrap_servers,
                store=self.config.delta.table_uri,
                label=batch.label,
                spark=getattr(self.spark_factory, "url", None) or self.config.spark.master,
            )
            if error is None:
                raise  # the transform's own bug or Spark's: its traceback is the diagnosis
            raise error from exc

    def _watched(self, spark: Any, batch: Batch) -> contextlib.AbstractContextManager[None]:
        """The stage's progress sampled for the sink, if the stager has one."""
        sink = self.progress
        if sink is None:
            return contextlib.nullcontext()
        planned = sum(r.span for r in batch.ranges)
        return watch(spark, lambda sample: sink.report(batch.label, planned, sample), sink.every)

    def job_arguments(self, batch: Batch) -> dict[str, Any]:
        """The stage job's inputs for `batch`: its ranges, the folders unique to its attempt,
        the tables' roots and the transform."""
        roots = {
            TABLE: self.config.delta.table_uri,
            QUARANTINE: self.config.delta.quarantine_uri,
            **{derived_target(d.name): staging_root(self.config, d) for d in self.config.derived},
        }
        options = self.config.kafka.resolved_spark_options()
        group = reader_group(
            self.config.group_id,
            self.config.kafka.bootstrap_servers,
            options,
            batch_topic_ids(batch),
        )
        return {
            "bootstrap_servers": self.config.kafka.bootstrap_servers,
            # the config's own options last: an operator's group.id wins over ours
            "kafka_options": options if group is None else {"group.id": group, **options},
            "ranges": batch.ranges,
            "batch_id": batch.batch_id,
            "attempt_dirs": {
                t: attempt_folder(
                    root,
                    staging_app_id(self.config, t, batch.app_id),
                    batch.batch_id,
                    batch.attempt,
                    batch.token,
                )
                for t, root in roots.items()
            },
            "table_roots": roots,
            "derived": list(self.config.derived),
            "partition_by": list(self.config.delta.partition_by),
            **self._transform_for(batch),
        }

    def _transform_for(self, batch: Batch) -> dict[str, Any]:
        """The transform the batch was planned with: a backfill records its own in its
        params. A batch staged again (invariant 11) must write what its first attempt
        wrote, whichever coordinator finishes it."""
        name = batch.params.get("transform") or self.config.transform
        transform = (
            self.transform
            if name == self.config.transform
            else pipeline_transform(self.config, name)
        )
        return {"transform": transform, "transform_name": name}


def batch_topic_ids(batch: Batch) -> dict[str, str | None]:
    """The id of each topic `batch` reads, as planned (None where the ledger has none): a
    batch of several topics records them by name, a batch of one its `topic_id`."""
    topics = sorted({r.topic for r in batch.ranges})
    if batch.topic_ids:
        return {t: batch.topic_ids.get(t) for t in topics}
    return {t: batch.topic_id for t in topics}


def staging_root(config: PipelineConfig, output: AnyOutput) -> str:
    """The root a derived output's staged partials are relative to: its Delta table's, or
    for a PostgreSQL output (a database has no folder) the raw table's
    (jobs/publish/delta_publisher.py `file_size` joins the same root)."""
    if isinstance(output, PostgresOutput):
        return config.delta.table_uri
    return output.table_uri


def staging_app_id(config: PipelineConfig, target: str, app_id: str) -> str:
    """The folder under `<root>/staged/` an attempt of `app_id` writes `target`'s files in:
    the app id's own, but a PostgreSQL output's partials, under the raw table's root, go
    under the output's app id (`<app id>.derived.<name>`), beside and never inside the raw
    table's staged folders: the cleaner (jobs/maintenance/cleaner.py), which lists only those, never
    takes them for the raw table's; like a Delta output's partials they are left for the
    table's VACUUM (never in its log)."""
    for output in config.derived:
        if isinstance(output, PostgresOutput) and derived_target(output.name) == target:
            return output.app_id(app_id)
    return app_id


def stage_failure(
    exc: BaseException, *, bootstrap: str, store: str, label: str, spark: str = ""
) -> ExactlyError | None:
    """The one-line error for a Spark failure caused by Kafka or the object store, or None
    for any other.

    Spark hands Python the Java stack trace as the exception's text (py4j's
    Py4JJavaError, pyspark's captured and Spark Connect errors alike), so the cause is
    found by the clients' exception names in it; the first line that names one is quoted,
    cut to QUOTED_CHARS. Kafka is looked for first: a Kafka error never names s3a, while a
    store error can carry java.net exceptions that are not specific to either, which is
    why a store's line must also name its client (STORE_CLIENT).
    `store` names the table root the stage writes under, `spark` the session's master (a
    Spark Connect server that stopped answering is named by it, and its gRPC details quoted).
    """
    lines = [line.strip() for line in str(exc).splitlines()]
    if any(any(name in line for name in CONNECT_UNREACHABLE) for line in lines):
        details = next((ln for ln in lines if ln.startswith("details =")), lines[0])
        return UnreachableError(
            f"the Spark Connect server at {spark} stopped answering while Spark staged "
            f"{label}: {details.removeprefix('details = ').strip(chr(34))[:QUOTED_CHARS]}; "
            "nothing was voted, the next run plans the range again"
        )
    kafka, any_line = f"Kafka at {bootstrap}", ("",)
    store_is = f"the object store holding {store}"
    for names, client, kind, what in (
        (
            KAFKA_NOT_AUTHORIZED,
            any_line,
            AuthenticationError,
            f"{kafka} did not authorize exactly's user",
        ),
        (KAFKA_REFUSED, any_line, AuthenticationError, f"{kafka} refused exactly's credentials"),
        (KAFKA_UNREACHABLE, any_line, UnreachableError, f"{kafka} unreachable"),
        (STORE_REFUSED, STORE_CLIENT, AuthenticationError, f"{store_is} refused access"),
        (STORE_UNREACHABLE, STORE_CLIENT, UnreachableError, f"{store_is} unreachable"),
    ):
        quoted = next(
            (
                ln
                for ln in lines
                if any(name in ln for name in names) and any(c in ln for c in client)
            ),
            None,
        )
        if quoted is not None:
            then = ", the next run plans the range again"
            if names is KAFKA_NOT_AUTHORIZED:
                # from the exception's own message: Spark's job-abort preamble says nothing
                name = next(n for n in names if n in quoted)
                quoted = quoted[quoted.index(name) :].removeprefix("org.apache.kafka.common.")
                then = f"; {NOT_AUTHORIZED_ADVICE}"
            quoted = quoted.removeprefix(": ")[:QUOTED_CHARS]
            return kind(f"{what} while Spark staged {label}: {quoted}; nothing was voted{then}")
    return None
