"""The `kafka` section: the cluster, the topics, and how both Kafka clients reach it.

Two clients read one cluster: the confluent (librdkafka) clients that plan and commit
offsets, and Spark's Java Kafka source that reads the records. The section says the security
once and translates it for both, and refuses a raw option given to the client that does not
know it, because that client would raise on it deep inside a batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from resources.config.env_values import EnvValue, OptionValue, resolve_options
from resources.config.strict import _Strict
from resources.kafka.topic_selection import (
    TopicSelection,
    check_one_selection,
    check_pattern,
    check_topic_list,
)

#: Settings only one of the two Kafka clients knows: each raw option map is checked
#: against the other's, so a key in the wrong map is a config error naming it, not a raw
#: exception from deep inside one client.
_JAVA_ONLY = frozenset(
    {
        "sasl.jaas.config",
        "sasl.mechanism",
        "ssl.truststore.location",
        "ssl.truststore.password",
        "ssl.truststore.type",
        "ssl.truststore.certificates",
        "ssl.keystore.location",
        "ssl.keystore.password",
        "ssl.keystore.type",
        "sasl.login.callback.handler.class",
        "sasl.client.callback.handler.class",
    }
)
_LIBRDKAFKA_ONLY = frozenset(
    {
        "sasl.mechanisms",
        "sasl.username",
        "sasl.password",
        "ssl.ca.location",
        "ssl.ca.pem",
        "ssl.certificate.location",
        "ssl.key.location",
        "enable.ssl.certificate.verification",
    }
)
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def _jaas_quoted(value: str) -> str:
    """A JAAS option value in double quotes (backslash and quote escaped)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


#: Java consumer settings Spark's Kafka source raises on inside a stage (its offsets,
#: deserializers and commits are its own): refused in the config first.
_SPARK_SOURCE_REFUSES = frozenset(
    {
        "auto.offset.reset",
        "enable.auto.commit",
        "interceptor.classes",
        "key.deserializer",
        "value.deserializer",
    }
)


def _refuse_uncommitted_reads(options: Mapping[str, Any]) -> None:
    """Only read_committed: with read_uncommitted (the Java consumer's default, so often in
    a copied properties file) Spark's source reads the records of aborted transactions,
    which were never part of the topic, and the batch lands them. A value only an
    environment variable knows is refused too: the config must say it."""
    level = options.get("isolation.level")
    if level is not None and level != "read_committed":
        raise ValueError(
            f"isolation.level: exactly reads read_committed only, not {level!r}: any other "
            "level reads the records of aborted transactions and lands them; remove it"
        )


def _refuse_other_clients_keys(
    options: Mapping[str, Any], others: frozenset[str], other: str, their_map: str
) -> None:
    """A raw option map holds only its own client's keys: one the other client alone knows
    would reach a client that raises on it, deep inside a batch."""
    wrong = sorted(set(options) & others)
    if wrong:
        raise ValueError(
            f"{', '.join(wrong)}: {other} setting(s), which this map's client does not know: "
            f"put them under {their_map}, or describe the cluster in kafka.security"
        )


class KafkaSecurity(_Strict):
    """How to reach a secured cluster, said once and translated for both clients: the
    confluent (librdkafka) clients that plan and commit offsets, and Spark's Java Kafka
    source that reads the records. The password can only be an environment variable's name,
    so no file, log, ledger or Dagster page ever holds it."""

    protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    username: str | None = None
    password: EnvValue | None = None
    #: the CA certificate(s) that signed the brokers' certificates, PEM (default: the
    #: system's trust store for librdkafka, the JVM's for Spark)
    ca_file: str | None = None

    @field_validator("password", mode="before")
    @classmethod
    def _only_from_the_environment(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError(
                "must be {env: NAME}, the environment variable that holds it: a password is "
                "never written in the config"
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSecurity:
        sasl = self.protocol.startswith("SASL_")
        given = [n for n in ("mechanism", "username", "password") if getattr(self, n)]
        if sasl and len(given) < 3:
            missing = sorted({"mechanism", "username", "password"} - set(given))
            raise ValueError(f"protocol {self.protocol} needs {', '.join(missing)}")
        if not sasl and given:
            raise ValueError(f"{', '.join(given)} need a SASL_ protocol, not {self.protocol}")
        if self.ca_file and not self.protocol.endswith("SSL"):
            raise ValueError(f"ca_file needs protocol SSL or SASL_SSL, not {self.protocol}")
        return self

    def _password(self) -> str:
        assert self.password is not None
        return resolve_options({"password": self.password}, "kafka.security")["password"]

    def librdkafka(self) -> dict[str, str]:
        if self.protocol == "PLAINTEXT":
            return {}
        options = {"security.protocol": self.protocol}
        if self.mechanism:
            options["sasl.mechanisms"] = self.mechanism
            options["sasl.username"] = self.username or ""
            options["sasl.password"] = self._password()
        if self.ca_file:
            options["ssl.ca.location"] = self.ca_file
        return options

    def java(self) -> dict[str, str]:
        """Java client settings (Spark's source adds the `kafka.` prefix)."""
        if self.protocol == "PLAINTEXT":
            return {}
        options = {"security.protocol": self.protocol}
        if self.mechanism:
            options["sasl.mechanism"] = self.mechanism
            options["sasl.jaas.config"] = (
                f"{_LOGIN_MODULES[self.mechanism]} required "
                f"username={_jaas_quoted(self.username or '')} "
                f"password={_jaas_quoted(self._password())};"
            )
        if self.ca_file:
            options["ssl.truststore.type"] = "PEM"
            options["ssl.truststore.location"] = self.ca_file
        return options


class KafkaSettings(_Strict):
    bootstrap_servers: str = Field(min_length=1)
    #: exactly one of `topic`, `topics`, `pattern` (resources/kafka/topic_selection.py)
    topic: str | None = Field(default=None, min_length=1)
    topics: list[str] | None = Field(default=None, min_length=1)
    pattern: str | None = Field(default=None, min_length=1)
    group_id: str | None = None
    #: where the pipeline starts reading a topic it has no position in: each partition's
    #: earliest offset, or its last stable offset (older records can then be ingested by a
    #: fill backfill); a partition added to the topic later starts at its earliest either
    #: way (ledger/core/protocol.py plan_ranges)
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    #: how long a call to the cluster (planning's reads of positions, the offset commit)
    #: waits for an answer before the run stops in one line, the batch left to the next
    #: run: long enough to ride out a broker's restart or a leader election
    timeout_seconds: float = Field(default=30.0, gt=0, le=3600)
    security: KafkaSecurity = Field(default_factory=KafkaSecurity)
    #: raw librdkafka settings for the confluent clients, over `security`'s; never logged;
    #: a value may be `{env: NAME}`, read from that variable when the client is made
    options: dict[str, OptionValue] = Field(default_factory=dict)
    #: raw Java client settings for Spark's Kafka source (without the `kafka.` prefix)
    spark_options: dict[str, OptionValue] = Field(default_factory=dict)

    @field_validator("options")
    @classmethod
    def _librdkafka_keys(cls, value: dict[str, OptionValue]) -> dict[str, OptionValue]:
        _refuse_other_clients_keys(value, _JAVA_ONLY, "Java client", "kafka.spark_options")
        _refuse_uncommitted_reads(value)
        return value

    @field_validator("spark_options")
    @classmethod
    def _java_keys(cls, value: dict[str, OptionValue]) -> dict[str, OptionValue]:
        _refuse_other_clients_keys(value, _LIBRDKAFKA_ONLY, "librdkafka", "kafka.options")
        _refuse_uncommitted_reads(value)
        refused = sorted(set(value) & _SPARK_SOURCE_REFUSES)
        if refused:
            raise ValueError(
                f"{', '.join(refused)}: Spark's Kafka source sets these itself and refuses "
                "them (a batch's offsets are its plan's, and exactly commits them); remove them"
            )
        prefixed = sorted(k for k in value if k.startswith("kafka."))
        if prefixed:
            raise ValueError(f"{', '.join(prefixed)}: give Java client keys without 'kafka.'")
        return value

    def resolved_options(self) -> dict[str, str]:
        """The confluent clients' settings: the security section's, then the raw ones."""
        return {**self.security.librdkafka(), **resolve_options(self.options, "kafka.options")}

    def resolved_spark_options(self) -> dict[str, str]:
        """Spark's Kafka source's settings: the security section's, then the raw ones."""
        raw = resolve_options(self.spark_options, "kafka.spark_options")
        return {**self.security.java(), **raw}

    @model_validator(mode="after")
    def _one_way_to_name_topics(self) -> KafkaSettings:
        check_one_selection(self.topic, self.topics, self.pattern)
        return self

    @field_validator("topics")
    @classmethod
    def _topic_names(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else check_topic_list(value)

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        return None if value is None else check_pattern(value)

    def selection(self) -> TopicSelection:
        """The topics this pipeline reads, as the planners take them."""
        if self.pattern is not None:
            return TopicSelection(pattern=self.pattern)
        return TopicSelection(names=tuple(self.topics or [self.topic or ""]))

    @field_validator("bootstrap_servers")
    @classmethod
    def _hosts(cls, value: str) -> str:
        for server in value.split(","):
            host, sep, port = server.strip().rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"{server.strip()!r} is not host:port")
        return value
