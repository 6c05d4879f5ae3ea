"""The `kafka.security` section, translated for both Kafka clients, and the raw option maps
checked against the client they go to (pure logic: no broker here; the secured broker's
end-to-end tests are in tests/test_secure_kafka.py)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from ledger.core.errors import ConfigError
from resources.config.kafka_settings import KafkaSettings
from resources.config.loading import parse_config


def settings(**fields: Any) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers="b:9093", topic="t", **fields)


SCRAM = {
    "protocol": "SASL_SSL",
    "mechanism": "SCRAM-SHA-512",
    "username": "alice",
    "password": {"env": "KAFKA_TEST_PASSWORD"},
    "ca_file": "/etc/kafka/ca.pem",
}


def test_one_security_section_becomes_each_clients_own_spelling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KAFKA_TEST_PASSWORD", 'p"w\\d')
    kafka = settings(security=SCRAM)
    assert kafka.resolved_options() == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "alice",
        "sasl.password": 'p"w\\d',
        "ssl.ca.location": "/etc/kafka/ca.pem",
    }
    assert kafka.resolved_spark_options() == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        # quote and backslash escaped inside the JAAS value
        "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="alice" password="p\\"w\\\\d";',
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": "/etc/kafka/ca.pem",
    }


def test_plain_mechanism_uses_the_plain_login_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_TEST_PASSWORD", "pw")
    kafka = settings(
        security={**SCRAM, "mechanism": "PLAIN", "protocol": "SASL_PLAINTEXT"} | {"ca_file": None}
    )
    jaas = kafka.resolved_spark_options()["sasl.jaas.config"]
    assert jaas.startswith("org.apache.kafka.common.security.plain.PlainLoginModule required")


def test_raw_options_win_over_the_section_for_their_own_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KAFKA_TEST_PASSWORD", "pw")
    kafka = settings(
        security=SCRAM,
        options={"ssl.endpoint.identification.algorithm": "none"},
        spark_options={"ssl.endpoint.identification.algorithm": ""},
    )
    assert kafka.resolved_options()["ssl.endpoint.identification.algorithm"] == "none"
    assert kafka.resolved_spark_options()["ssl.endpoint.identification.algorithm"] == ""
    assert "ssl.endpoint.identification.algorithm" not in settings(security=SCRAM).security.java()


def test_an_unsecured_cluster_adds_nothing() -> None:
    kafka = settings()
    assert kafka.resolved_options() == {} and kafka.resolved_spark_options() == {}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"security": {**SCRAM, "password": None}}, "needs password"),
        ({"security": {"protocol": "SASL_SSL"}}, "needs mechanism, password, username"),
        ({"security": {"protocol": "SSL", "username": "alice"}}, "need a SASL_ protocol"),
        ({"security": {"protocol": "PLAINTEXT", "ca_file": "/ca.pem"}}, "ca_file needs"),
        ({"options": {"sasl.jaas.config": "x"}}, "Java client setting.*kafka.spark_options"),
        ({"spark_options": {"sasl.username": "x"}}, "librdkafka setting.*kafka.options"),
        ({"spark_options": {"kafka.sasl.mechanism": "PLAIN"}}, "without 'kafka.'"),
    ],
)
def test_a_security_setting_that_cannot_work_is_refused(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        settings(**fields)


def test_an_unset_password_variable_names_the_variable_not_a_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KAFKA_TEST_PASSWORD", raising=False)
    with pytest.raises(ConfigError, match="KAFKA_TEST_PASSWORD is not set"):
        settings(security=SCRAM).resolved_options()


def test_a_password_written_in_the_config_is_refused_without_being_repeated() -> None:
    doc = {
        "pipeline": "p",
        "kafka": {"bootstrap_servers": "b:9093", "topic": "t", "security": {**SCRAM}},
        "delta": {"table_uri": "/tmp/t", "quarantine_uri": "/tmp/q"},
    }
    doc["kafka"]["security"]["password"] = "hunter2-literal"
    with pytest.raises(ConfigError) as refused:
        parse_config(doc)
    assert "kafka.security.password: Value error, must be {env: NAME}" in str(refused.value)
    assert "hunter2-literal" not in str(refused.value)


@pytest.mark.parametrize("field", ["options", "spark_options"])
@pytest.mark.parametrize("level", ["read_uncommitted", {"env": "KAFKA_ISOLATION"}])
def test_an_isolation_level_other_than_read_committed_is_refused(field: str, level: Any) -> None:
    """Java's consumers default to read_uncommitted, and a consumer properties file copied
    into the config may say so: Spark's source then read aborted transactions' records,
    which landed in the table (the transactional topic's test, by hand). exactly reads
    read_committed always; any other value, or one only an environment variable knows, is
    a config error naming the key."""
    with pytest.raises(ValueError, match=r"isolation\.level.*read_committed.*aborted"):
        settings(**{field: {"isolation.level": level}})
    kafka = settings(**{field: {"isolation.level": "read_committed"}})
    assert kafka.resolved_spark_options().get("isolation.level", "read_committed") == (
        "read_committed"
    )


@pytest.mark.parametrize(
    "key", ["auto.offset.reset", "enable.auto.commit", "key.deserializer", "value.deserializer"]
)
def test_a_java_setting_spark_s_source_refuses_is_a_config_error(key: str) -> None:
    """Spark's Kafka source raises on these inside the stage; the config says so first."""
    with pytest.raises(ValueError, match=rf"{re.escape(key)}: Spark's Kafka source"):
        settings(spark_options={key: "x"})
