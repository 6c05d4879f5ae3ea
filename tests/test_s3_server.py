"""resources/object_storage/embedded_s3.py: the loopback S3 server starts, honours conditional
writes (which delta-rs's commits on S3 rely on), serves every client through the standard AWS
variables,
and stops."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from botocore.exceptions import ClientError

from ledger.core.errors import ExactlyError
from resources.jvm.process import accepts_connections
from resources.object_storage.embedded_s3 import S3Server, start_s3_server
from resources.object_storage.s3 import S3Access

pytestmark = pytest.mark.integration


def test_the_server_starts_honours_if_none_match_and_stops(tmp_path: Path) -> None:
    with start_s3_server(tmp_path) as server:
        client = server.access().boto3_client()
        bucket = server.create_bucket("race")

        client.put_object(Bucket=bucket, Key="_delta_log/0.json", Body=b"first", IfNoneMatch="*")
        with pytest.raises(ClientError) as refused:
            client.put_object(
                Bucket=bucket, Key="_delta_log/0.json", Body=b"second", IfNoneMatch="*"
            )
        assert refused.value.response["Error"]["Code"] == "PreconditionFailed"
        body = client.get_object(Bucket=bucket, Key="_delta_log/0.json")["Body"].read()
        assert body == b"first"
        port = server.port

    assert not server.running()
    assert not accepts_connections(port, timeout=1)


def test_a_port_in_use_is_refused_before_launching(s3_server: S3Server, tmp_path: Path) -> None:
    with pytest.raises(ExactlyError, match=f"port {s3_server.port}"):
        start_s3_server(tmp_path, port=s3_server.port)


def test_the_standard_variables_point_boto3_and_pyarrow_at_it(
    s3_env: dict[str, str], s3_bucket: str
) -> None:
    access = S3Access.from_env()  # the process's own environment, as `exactly run` reads it
    table = pa.table({"n": [1, 2, 3]})
    filesystem = access.arrow_filesystem()
    pq.write_table(table, f"{s3_bucket}/staged/part-0.parquet", filesystem=filesystem)

    head = access.boto3_client().head_object(Bucket=s3_bucket, Key="staged/part-0.parquet")
    assert head["ContentLength"] > 0
    assert pq.read_table(f"{s3_bucket}/staged/part-0.parquet", filesystem=filesystem) == table


def test_wrong_credentials_are_refused(s3_server: S3Server, s3_bucket: str) -> None:
    wrong = S3Access.from_env({**s3_server.env(), "AWS_SECRET_ACCESS_KEY": "not-the-secret"})

    with pytest.raises(ClientError) as refused:
        wrong.boto3_client().head_bucket(Bucket=s3_bucket)
    assert refused.value.response["Error"]["Code"] == "403"
