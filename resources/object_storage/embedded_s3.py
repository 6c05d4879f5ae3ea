"""An S3-compatible server on loopback for tests and the S3 demo: s3proxy on its filesystem
backend, run from the jar `jvm/s3proxy/pom.xml` fetches.

s3proxy 4.0.0 checks `If-None-Match: *` atomically on the filesystem-nio2 backend, which is
what delta-rs's commits rely on (two writers of one log entry: exactly one wins); older
releases and most mocks only emulate it. A production run points at a store someone else
operates and never starts one, which is why this launcher lives here and not in `resources/`.

Launching, log quoting and stopping are `resources.jvm.process`'s, shared with the broker.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
import time
from pathlib import Path

from ledger.core.errors import ConfigError, ExactlyError
from resources.jvm.jars import jars_dir
from resources.jvm.options import operator_jvm_options
from resources.jvm.process import (
    HOST,
    LoopbackServer,
    free_port,
    java_executable,
    launch_detached,
    port_in_use,
)
from resources.object_storage.s3 import S3Access

S3_LOG = "s3proxy.log"
S3_PROPERTIES = "s3proxy.properties"
#: The region the server's clients sign for; s3proxy accepts any, boto3 needs one.
S3_REGION = "us-east-1"
S3_ACCESS_KEY_ID = "exactly"
# Generous: the JVM listens within about a second alone, far later beside Spark and Kafka.
S3_START_TIMEOUT = 120.0
S3_STOP_TIMEOUT = 30.0


def s3proxy_jar() -> Path:
    """s3proxy's self-contained jar, fetched by `make setup` like the other jars."""
    folder = jars_dir() / "s3proxy"
    jars = sorted(folder.glob("s3proxy-*-jar-with-dependencies.jar"))
    if not jars:
        raise ConfigError(
            f"no s3proxy jar in {folder}: run `make setup` (mvn -f jvm/pom.xml "
            "dependency:copy-dependencies) first"
        )
    return jars[-1]


class S3Server(LoopbackServer):
    """An s3proxy JVM started by this process, serving http://127.0.0.1:`port`.

    Its credentials are made up per start, so a test that plants and then greps for the
    secret finds only what the product leaked, never a fixed string from this file.
    """

    stop_timeout = S3_STOP_TIMEOUT

    def __init__(
        self,
        port: int,
        process: subprocess.Popen[bytes],
        work_dir: Path,
        log_offset: int,
        secret_access_key: str,
    ) -> None:
        super().__init__("S3 server", port, process, work_dir / S3_LOG, log_offset)
        self.work_dir = work_dir
        self.access_key_id = S3_ACCESS_KEY_ID
        self.secret_access_key = secret_access_key

    @property
    def endpoint_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def data_dir(self) -> Path:
        """Where the buckets live: one folder per bucket, one file per object."""
        return self.work_dir / "data"

    def env(self) -> dict[str, str]:
        """The standard AWS variables that point every part (boto3, pyarrow through
        S3Access, delta-rs, Spark's s3a) at this server, and nothing else."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_REGION": S3_REGION,
            "AWS_ALLOW_HTTP": "true",
        }

    def access(self) -> S3Access:
        return S3Access.from_env(self.env())

    def create_bucket(self, name: str) -> str:
        """Create bucket `name` (3 to 63 characters, S3's rule) and return it."""
        self.access().boto3_client().create_bucket(Bucket=name)
        return name


def start_s3_server(
    folder: Path | str | None = None,
    port: int | None = None,
    *,
    authorization: str = "aws-v2-or-v4",
    timeout: float = S3_START_TIMEOUT,
) -> S3Server:
    """Start s3proxy on 127.0.0.1:`port` (a free one if None), its objects and log in
    `folder` (a new temporary folder if None), and return once it answers.

    Usable as a context manager (`with start_s3_server(...) as server:`), which stops it.
    Raises UnreachableError, quoting the log, if the JVM exits or does not listen within
    `timeout` seconds; the JVM is stopped then, so a failed start leaves nothing behind.
    """
    port = free_port() if port is None else port
    if not 0 < port < 65536:
        raise ConfigError(f"S3 server port must be between 1 and 65535, not {port}")
    if port_in_use(port, HOST):
        raise ExactlyError(f"cannot start the S3 server: port {port} on {HOST} is in use")
    work_dir = Path(folder or tempfile.mkdtemp(prefix="exactly-s3-")).resolve()
    data_dir = work_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_hex(20)
    properties = work_dir / S3_PROPERTIES
    properties.write_text(
        "# Written by exactly on every S3 server start; edits are overwritten.\n"
        f"s3proxy.endpoint=http://{HOST}:{port}\n"
        f"s3proxy.authorization={authorization}\n"
        f"s3proxy.identity={S3_ACCESS_KEY_ID}\n"
        f"s3proxy.credential={secret}\n"
        "jclouds.provider=filesystem-nio2\n"
        f"jclouds.filesystem.basedir={data_dir}\n",
        encoding="utf-8",
    )
    properties.chmod(0o600)
    command = [java_executable(), "-Xmx256m", *operator_jvm_options(), "-jar", str(s3proxy_jar())]
    command += ["--properties", str(properties)]
    # s3proxy's logback reads LOG_LEVEL: warnings only, not a line per request
    env = {**os.environ, "LOG_LEVEL": "warn"}
    process, log_offset = launch_detached(
        command,
        work_dir / S3_LOG,
        f"== exactly: starting s3proxy on {HOST}:{port} at {time.ctime()}",
        cwd=work_dir,
        env=env,
    )
    server = S3Server(port, process, work_dir, log_offset, secret)
    try:
        server.await_listening(time.monotonic() + timeout, poll_seconds=0.2)
    except BaseException:
        server.stop()
        raise
    return server
