"""resources/spark/session.py's s3a settings: the same store and credentials as boto3 and delta-rs,
with secrets kept out of Spark's settings whenever the JVM can read them itself."""

from __future__ import annotations

import re

from resources.object_storage.s3 import S3Access
from resources.spark.session import executor_credentials, s3a_settings

ENDPOINT = {
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
    "AWS_REGION": "eu-west-3",
    "AWS_ALLOW_HTTP": "true",
}
KEYS = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "planted-secret-4e1d"}
PROVIDER = "spark.hadoop.fs.s3a.aws.credentials.provider"


def test_keys_the_jvm_inherits_stay_out_of_sparks_settings() -> None:
    env = {**ENDPOINT, **KEYS}
    settings = s3a_settings(S3Access.from_env(env), env)
    assert settings == {
        "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "spark.hadoop.fs.s3a.endpoint.region": "eu-west-3",
        "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        PROVIDER: "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider",
    }
    assert not any(KEYS["AWS_SECRET_ACCESS_KEY"] in v for v in settings.values())


def test_keys_resolved_elsewhere_are_handed_to_hadoop() -> None:
    """A profile's keys (or keys not in the JVM's environment) reach s3a through Hadoop's key
    settings, which Spark's redaction hides; with a session token, the temporary provider."""
    access = S3Access.from_env({**ENDPOINT, **KEYS, "AWS_SESSION_TOKEN": "tok"})
    settings = s3a_settings(access, env={})
    assert settings["spark.hadoop.fs.s3a.access.key"] == "AKIDEXAMPLE"
    assert settings["spark.hadoop.fs.s3a.secret.key"] == "planted-secret-4e1d"
    assert settings["spark.hadoop.fs.s3a.session.token"] == "tok"
    assert settings[PROVIDER] == "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
    plain = s3a_settings(S3Access.from_env({**ENDPOINT, **KEYS}), env={})
    assert plain[PROVIDER] == "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
    assert "spark.hadoop.fs.s3a.session.token" not in plain


def test_aws_itself_keeps_virtual_hosted_addressing_and_tls() -> None:
    access = S3Access(region="us-east-2")
    settings = s3a_settings(access, env={})
    assert "spark.hadoop.fs.s3a.endpoint" not in settings
    assert "spark.hadoop.fs.s3a.path.style.access" not in settings
    chain = "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider"
    assert settings[PROVIDER] == chain


def test_an_https_endpoint_keeps_tls() -> None:
    env = {"AWS_ENDPOINT_URL": "https://s3.example.internal", "AWS_REGION": "x", **KEYS}
    settings = s3a_settings(S3Access.from_env(env), env)
    assert settings["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "true"


def test_executors_of_a_cluster_get_the_keys_the_driver_inherited() -> None:
    """A worker starts executors with its own environment: without these settings every task
    on a cluster fails to sign its requests. Spark's default redaction hides the secret."""
    env = {**ENDPOINT, **KEYS, "AWS_SESSION_TOKEN": "planted-token-77"}
    settings = s3a_settings(S3Access.from_env(env), env)
    handed = executor_credentials(settings, env)
    assert handed == {
        "spark.executorEnv.AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
        "spark.executorEnv.AWS_SECRET_ACCESS_KEY": "planted-secret-4e1d",
        "spark.executorEnv.AWS_SESSION_TOKEN": "planted-token-77",
    }
    spark_default_redaction = re.compile(r"(?i)secret|password|token|access[.]?key")
    for name, value in handed.items():
        if value != "AKIDEXAMPLE":
            assert spark_default_redaction.search(name), name


def test_keys_spark_was_handed_are_not_handed_again() -> None:
    env = {**ENDPOINT, **KEYS}
    settings = s3a_settings(S3Access.from_env(env), {})  # the JVM would not inherit them
    assert executor_credentials(settings, env) == {}
