"""Who we are and where the object store is: one `S3Access`, handed alike to boto3, pyarrow
and delta-rs (and, by resources/spark/session.py, to Spark's s3a), so every part of a batch talks to
the same endpoint with the same credentials.

It is built from the standard AWS variables (or a named profile, which boto3 resolves), so
pointing the product at any S3-compatible store needs no config change beyond `s3://` URIs.
pyarrow does not read AWS_ENDPOINT_URL itself, which is why the endpoint is resolved here
once rather than left to each library's own lookup. Secrets never appear in a repr.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from ledger.core.errors import ConfigError

if TYPE_CHECKING:
    from pyarrow.fs import S3FileSystem

_TRUE = {"1", "true", "yes", "on"}
#: Connect and read timeouts (seconds) for boto3 and pyarrow: an endpoint that does not
#: answer is an error in seconds, not a hang.
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 60.0
#: How hard every client retries a request that failed in a way worth retrying (503
#: SlowDown, a reset or refused connection, a timeout) in the middle of a batch, sized so
#: that a store that refuses connections for 30 seconds or throttles in bursts delays the
#: batch instead of failing it. The clients' own defaults give up within seconds of a
#: refused connection (delta-rs: 10 retries from 100 ms; boto3 and pyarrow: 3 attempts).
#: The start-up check of the buckets keeps boto3's default: a store that does not answer
#: then is more likely a wrong endpoint, and says so at once. README, "When storage fails".
MAX_ATTEMPTS = 10
STARTUP_ATTEMPTS = 3
#: delta-rs (object_store): jittered exponential backoff from 1 s, at most 15 s apart, for
#: up to 2 minutes; measured against connections refused for 30 s, see the README.
DELTA_RETRY_OPTIONS = {
    "max_retries": "30",
    "retry_timeout": "120s",
    "backoff_config.init_backoff": "1s",
    "backoff_config.max_backoff": "15s",
    "backoff_config.base": "2",
}


@dataclass(frozen=True)
class S3Access:
    """The endpoint, region and credentials for one process's object-store calls.

    `endpoint_url` is None for AWS itself; set, it is an S3-compatible store addressed
    path-style (`endpoint/bucket/key`), which every such store accepts.
    """

    region: str
    endpoint_url: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    allow_http: bool = False
    profile: str | None = None

    def __post_init__(self) -> None:
        if self.endpoint_url is not None:
            scheme = urlparse(self.endpoint_url).scheme
            if scheme not in ("http", "https") or not urlparse(self.endpoint_url).netloc:
                raise ConfigError(
                    f"AWS_ENDPOINT_URL: {self.endpoint_url!r} is not an http(s)://host URL"
                )
            if scheme == "http" and not self.allow_http:
                raise ConfigError(
                    f"AWS_ENDPOINT_URL: {self.endpoint_url} is plain http; set "
                    "AWS_ALLOW_HTTP=true to allow unencrypted requests to it"
                )
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ConfigError("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set together")

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ, profile: str | None = None) -> S3Access:
        """The access the standard AWS variables describe, or `profile`'s (or AWS_PROFILE's).

        Keys in `env` win, as in every AWS SDK; without them, boto3 resolves the profile (or
        its default chain: shared files, SSO, an instance role) once, here, from the process's
        own environment and files.
        """
        profile = profile or env.get("AWS_PROFILE") or None
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None
        key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
        token = env.get("AWS_SESSION_TOKEN") or None
        if not key and not secret:
            session = _boto3_session(profile)
            region = region or session.region_name
            credentials = session.get_credentials()
            if credentials is not None:
                frozen = credentials.get_frozen_credentials()
                key, secret, token = frozen.access_key, frozen.secret_key, frozen.token
        return cls(
            region=region or "us-east-1",
            endpoint_url=endpoint.rstrip("/") if endpoint else None,
            access_key_id=key or None,
            secret_access_key=secret or None,
            session_token=token,
            allow_http=env.get("AWS_ALLOW_HTTP", "").strip().lower() in _TRUE,
            profile=profile,
        )

    def boto3_client(self, max_attempts: int = MAX_ATTEMPTS) -> Any:
        """An S3 client of boto3 (typed Any: boto3 ships no type stubs)."""
        import boto3
        from botocore.config import Config

        config = Config(
            connect_timeout=CONNECT_TIMEOUT,
            read_timeout=READ_TIMEOUT,
            retries={"max_attempts": max_attempts, "mode": "standard"},
            s3={"addressing_style": "path" if self.endpoint_url else "auto"},
        )
        return boto3.session.Session().client(
            "s3",
            region_name=self.region,
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            aws_session_token=self.session_token,
            config=config,
        )

    def arrow_filesystem(self) -> S3FileSystem:
        """pyarrow's S3 file system, for reading Parquet objects (footers, rewrites)."""
        from pyarrow.fs import AwsStandardS3RetryStrategy, S3FileSystem

        options: dict[str, Any] = {
            "region": self.region,
            "connect_timeout": CONNECT_TIMEOUT,
            "request_timeout": READ_TIMEOUT,
            "retry_strategy": AwsStandardS3RetryStrategy(max_attempts=MAX_ATTEMPTS),
        }
        if self.access_key_id is not None:
            options["access_key"] = self.access_key_id
            options["secret_key"] = self.secret_access_key
            if self.session_token:
                options["session_token"] = self.session_token
        if self.endpoint_url is not None:
            parsed = urlparse(self.endpoint_url)
            options["endpoint_override"] = parsed.netloc
            options["scheme"] = parsed.scheme
        return S3FileSystem(**options)

    def delta_storage_options(self) -> dict[str, str]:
        """delta-rs's storage options for the same access: explicit, so nothing depends on
        which variables delta-rs happens to read."""
        options = {"AWS_REGION": self.region, **DELTA_RETRY_OPTIONS}
        if self.endpoint_url is not None:
            options["AWS_ENDPOINT_URL"] = self.endpoint_url
            options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "false"
        if self.allow_http:
            options["AWS_ALLOW_HTTP"] = "true"
        if self.access_key_id is not None and self.secret_access_key is not None:
            options["AWS_ACCESS_KEY_ID"] = self.access_key_id
            options["AWS_SECRET_ACCESS_KEY"] = self.secret_access_key
            if self.session_token:
                options["AWS_SESSION_TOKEN"] = self.session_token
        return options


def _boto3_session(profile: str | None) -> Any:
    import boto3
    import botocore.exceptions

    try:
        return boto3.session.Session(profile_name=profile)
    except botocore.exceptions.ProfileNotFound as exc:
        raise ConfigError(f"AWS profile {profile!r} is not in the AWS config files") from exc
