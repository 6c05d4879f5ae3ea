"""resources/object_storage/s3.py: one S3Access from the standard AWS variables or a profile, the
same for boto3, pyarrow and delta-rs, and never showing its secrets."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.core.errors import ConfigError
from resources.object_storage import storage
from resources.object_storage.s3 import S3Access

SECRET = "planted-secret-3f9a1c"
TOKEN = "planted-token-77be02"
ENV = {
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
    "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
    "AWS_SECRET_ACCESS_KEY": SECRET,
    "AWS_SESSION_TOKEN": TOKEN,
    "AWS_REGION": "eu-west-3",
    "AWS_ALLOW_HTTP": "true",
}


def test_the_standard_variables_alone_describe_the_store() -> None:
    access = S3Access.from_env(ENV)

    assert access.endpoint_url == "http://127.0.0.1:9000"
    assert access.region == "eu-west-3"
    assert (access.access_key_id, access.secret_access_key) == ("AKIDEXAMPLE", SECRET)
    assert access.session_token == TOKEN
    assert access.allow_http


def test_a_planted_secret_never_appears_in_repr_or_str() -> None:
    access = S3Access.from_env(ENV)

    for shown in (repr(access), str(access), f"{access}", repr([access])):
        assert SECRET not in shown
        assert TOKEN not in shown
    assert "AKIDEXAMPLE" in repr(access)  # the key id names who we are; it is not secret


def test_aws_default_region_is_the_fallback_region() -> None:
    env = {**ENV, "AWS_DEFAULT_REGION": "ap-south-1"}
    del env["AWS_REGION"]

    assert S3Access.from_env(env).region == "ap-south-1"


def test_plain_http_endpoint_without_allow_http_is_refused() -> None:
    env = {k: v for k, v in ENV.items() if k != "AWS_ALLOW_HTTP"}

    with pytest.raises(ConfigError, match="AWS_ALLOW_HTTP"):
        S3Access.from_env(env)


def test_a_key_id_without_its_secret_is_refused() -> None:
    env = {k: v for k, v in ENV.items() if k != "AWS_SECRET_ACCESS_KEY"}

    with pytest.raises(ConfigError, match="must be set together"):
        S3Access.from_env(env)


def test_a_named_profile_supplies_the_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"[ingest]\naws_access_key_id = AKIDPROFILE\naws_secret_access_key = {SECRET}\n",
        encoding="utf-8",
    )
    config = tmp_path / "config"
    config.write_text("[profile ingest]\nregion = sa-east-1\n", encoding="utf-8")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)

    access = S3Access.from_env({}, profile="ingest")

    assert (access.access_key_id, access.secret_access_key) == ("AKIDPROFILE", SECRET)
    assert access.region == "sa-east-1"
    assert access.profile == "ingest"
    assert SECRET not in repr(access)


def test_a_missing_profile_is_one_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))

    with pytest.raises(ConfigError, match="'nobody'"):
        S3Access.from_env({}, profile="nobody")


def test_every_client_gets_the_same_endpoint_and_keys() -> None:
    access = S3Access.from_env(ENV)

    options = access.delta_storage_options()
    assert options["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert options["AWS_ACCESS_KEY_ID"] == "AKIDEXAMPLE"
    assert options["AWS_SECRET_ACCESS_KEY"] == SECRET
    assert options["AWS_SESSION_TOKEN"] == TOKEN
    assert options["AWS_REGION"] == "eu-west-3"
    assert options["AWS_ALLOW_HTTP"] == "true"

    client = access.boto3_client()
    assert client.meta.endpoint_url == "http://127.0.0.1:9000"
    assert client.meta.region_name == "eu-west-3"
    assert client._request_signer._credentials.secret_key == SECRET


def test_local_tables_need_no_aws_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_PROFILE", "no-such-profile-anywhere")  # would fail if resolved

    storage.check_buckets(["/data/tables/pageviews", "/data/tables/pageviews_quarantine"])
