"""resources/delta/options.py `storage_options_for`: delta-rs commits on S3 only by conditional put,
with the same endpoint and keys as every other client, and settings that would let two
writers both commit one table version are refused with one line."""

from __future__ import annotations

import pytest

from ledger.core.errors import ConfigError
from resources.delta.options import storage_options_for
from resources.delta.table import DeltaTarget

S3_ENV = {
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
    "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
    "AWS_SECRET_ACCESS_KEY": "planted-secret-5d1e",
    "AWS_REGION": "us-east-1",
    "AWS_ALLOW_HTTP": "true",
}


@pytest.fixture
def s3_variables(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_S3_ALLOW_UNSAFE_RENAME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in S3_ENV.items():
        monkeypatch.setenv(name, value)
    return S3_ENV


def test_s3_tables_commit_by_conditional_put_with_the_process_access(
    s3_variables: dict[str, str],
) -> None:
    options = DeltaTarget("s3://bucket/tables/pageviews").storage_options

    assert options["aws_conditional_put"] == "etag"
    assert options["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert options["AWS_ACCESS_KEY_ID"] == "AKIDEXAMPLE"
    assert options["AWS_SECRET_ACCESS_KEY"] == "planted-secret-5d1e"
    assert options["AWS_ALLOW_HTTP"] == "true"


def test_local_tables_keep_the_configured_options_only(s3_variables: dict[str, str]) -> None:
    assert storage_options_for("/data/tables/pageviews", {"x": "y"}) == {"x": "y"}


def test_the_config_may_add_options_but_not_drop_conditional_put(
    s3_variables: dict[str, str],
) -> None:
    options = storage_options_for("s3://bucket/t", {"AWS_REGION": "eu-west-1"}, env={})

    assert options["AWS_REGION"] == "eu-west-1"
    assert options["aws_conditional_put"] == "etag"


@pytest.mark.parametrize(
    ("name", "value", "reason"),
    [
        ("AWS_S3_ALLOW_UNSAFE_RENAME", "true", "both succeed"),
        ("aws_s3_allow_unsafe_rename", "TRUE", "both succeed"),
        ("AWS_S3_LOCKING_PROVIDER", "dynamodb", "no lock service"),
        ("AWS_COPY_IF_NOT_EXISTS", "header:x-amz-copy-if-not-exists:true", "copy-if-not-exists"),
        ("conditional_put", "disabled", "need conditional put"),
        ("AWS_CONDITIONAL_PUT", "dynamo:lock", "need conditional put"),
    ],
)
def test_unsafe_commit_settings_in_the_config_are_refused(
    s3_variables: dict[str, str], name: str, value: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        storage_options_for("s3://bucket/t", {name: value}, env={})

    message = str(refused.value)
    assert "\n" not in message
    assert f"s3://bucket/t: delta.storage_options.{name}={value} is refused" in message
    assert reason in message


def test_unsafe_rename_in_the_environment_is_refused(s3_variables: dict[str, str]) -> None:
    env = {**S3_ENV, "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}

    with pytest.raises(ConfigError, match="environment variable AWS_S3_ALLOW_UNSAFE_RENAME"):
        storage_options_for("s3://bucket/t", {}, env=env)


def test_unsafe_rename_switched_off_is_accepted(s3_variables: dict[str, str]) -> None:
    env = {**S3_ENV, "AWS_S3_ALLOW_UNSAFE_RENAME": "false"}

    assert storage_options_for("s3://bucket/t", {}, env=env)["aws_conditional_put"] == "etag"


def test_object_stores_other_than_s3_are_refused(s3_variables: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="only s3:// object storage"):
        storage_options_for("gs://bucket/t", {}, env={})
