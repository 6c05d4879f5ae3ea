"""The pipeline config file (YAML), validated before anything runs.

Unknown keys and bad values are errors that name the field (`kafka.topic: ...`), because a
typo in a config that silently falls back to a default is how records get lost.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    AliasChoices,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from ledger.core.batch import BACKFILL_SUFFIX
from ledger.core.cleaning import parse_duration
from ledger.core.errors import ConfigError
from resources.config.derived_spec import AnyOutput, OutputSpec, PostgresOutput, replace_refusal
from resources.config.formats import FormatSettings
from resources.config.partitioning import PartitionColumn, check_unique
from resources.config.strict import _NAME, EnvValue, OptionValue, _Strict
from resources.config.transforms import absolute_spec, is_file_spec, load_transform
from resources.kafka.topic_selection import (
    TopicSelection,
    check_one_selection,
    check_pattern,
    check_topic_list,
)
from resources.object_storage import storage


def resolve_options(
    options: Mapping[str, OptionValue], where: str, env: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """The options with every `{env: NAME}` replaced by the variable's value, read now; an
    unset variable is a config error naming the option and the variable (never a value)."""
    resolved = {}
    for key, value in options.items():
        if isinstance(value, EnvValue):
            if value.env not in env:
                raise ConfigError(f"{where}.{key}: environment variable {value.env} is not set")
            resolved[key] = env[value.env]
        else:
            resolved[key] = value
    return resolved


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
    #: where a partition without a committed position starts: its earliest offset, or its
    #: last stable offset (older records can then be ingested by a fill backfill)
    starting_offsets: Literal["earliest", "latest"] = "earliest"
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
        return value

    @field_validator("spark_options")
    @classmethod
    def _java_keys(cls, value: dict[str, OptionValue]) -> dict[str, OptionValue]:
        _refuse_other_clients_keys(value, _LIBRDKAFKA_ONLY, "librdkafka", "kafka.options")
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


class DeltaSettings(_Strict):
    table_uri: str = Field(min_length=1)
    quarantine_uri: str = Field(min_length=1)
    #: object-store credentials and endpoints, passed to delta-rs only (reading and committing
    #: the tables); Spark, which writes the staged files, takes its own from `spark.conf`; a
    #: value may be `{env: NAME}`
    storage_options: dict[str, OptionValue] = Field(default_factory=dict)
    #: the data table's partition columns, each a date generated from a timestamp column
    #: (resources/config/partitioning.py); empty: unpartitioned
    partition_by: list[PartitionColumn] = Field(default_factory=list)

    @field_validator("partition_by")
    @classmethod
    def _unique_partitions(cls, value: list[PartitionColumn]) -> list[PartitionColumn]:
        check_unique(value)
        return value

    def resolved_storage_options(self) -> dict[str, str]:
        return resolve_options(self.storage_options, "delta.storage_options")


class LedgerSettings(_Strict):
    url: str = "sqlite:///./data/ledger.db"


class SparkSettings(_Strict):
    master: str = "local[2]"
    #: `local`: a Spark session in the process that stages (the CLI's default); `shared`: a
    #: Spark Connect server on this host, started on first need and shared by every process
    #: staging with the same settings, so a run launched by Dagster connects to a warm JVM
    #: instead of starting one (resources/spark/shared_server.py). Unset: EXACTLY_SPARK_SERVER's
    #: value, else `local`.
    server: Literal["local", "shared"] | None = None
    #: Spark settings; a value may be `{env: NAME}` (Spark also hides settings whose names
    #: match its `spark.redaction.regex` from its UI and event logs)
    conf: dict[str, OptionValue] = Field(default_factory=dict)
    #: how often a Spark Connect session (an `sc://` master, or `server: shared`) retries a
    #: server that stopped answering before the stage fails with one line (the batch is not
    #: voted; the next run plans it again): backoffs of 0.05, 0.2, 0.8 and 3.2 s, then 10 s
    #: each, so 8 is about 45 s and 4 about 4 s. pyspark's own default waits 10+ minutes.
    connect_retries: int = Field(default=8, ge=0)

    @model_validator(mode="after")
    def _shared_server_starts_its_own(self) -> SparkSettings:
        if self.server == "shared" and self.master.startswith("sc://"):
            raise ValueError(
                f"spark.master {self.master} is a Spark Connect server already; "
                "spark.server: shared starts one of its own: give it a local[N] or "
                "spark:// master, or drop spark.server"
            )
        return self

    def resolved_conf(self) -> dict[str, str]:
        return resolve_options(self.conf, "spark.conf")


class BatchSettings(_Strict):
    max_records_per_partition: int = Field(default=100_000, gt=0)
    #: how long a PLANNED/STAGED attempt on another host may go silent before it is abandoned
    lease_seconds: float = Field(default=120.0, gt=0)
    #: how long a committed batch whose consumer-group ack was refused waits before the
    #: re-drive sensor tries that ack again (any later batch's ack catches it up sooner)
    ack_retry_seconds: float = Field(default=120.0, gt=0)


class ScheduleSettings(_Strict):
    cron: str = "*/5 * * * *"
    timezone: str = "UTC"
    #: how often the daemon evaluates each of the pipeline's sensors (re-drive, stuck,
    #: history, checks); unset: each sensor's own default (30 s; 60 s for the checks)
    sensor_interval_seconds: int | None = Field(default=None, ge=1)

    def sensor_interval(self, default: int) -> int:
        """A sensor's minimum interval: the config's, else the sensor's `default`."""
        return self.sensor_interval_seconds or default


class CleanSettings(_Strict):
    """When the `<pipeline>_clean` job runs (its schedule ships stopped) and which staged
    orphans it deletes: only files older than `older_than` (jobs/maintenance/cleaner.py)."""

    older_than: str = "24h"
    cron: str = "0 3 * * *"

    @field_validator("older_than")
    @classmethod
    def _duration(cls, value: str) -> str:
        try:
            parse_duration(value, "value")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return value

    @property
    def grace(self) -> timedelta:
        return parse_duration(self.older_than, "clean.older_than")


class CompactSettings(_Strict):
    """When the `<pipeline>_compact` job runs: its schedule ships stopped, since rewriting
    files is an operator's decision (and costs the storage the old files until VACUUM)."""

    cron: str = "0 4 * * 0"


class AlertSettings(_Strict):
    """Where alerts go. Secrets never live here: only the names of environment variables
    that hold them, so neither the config, the Dagster UI nor the ledger ever shows one."""

    #: a batch in any state but a final one (PLANNED, STAGED, PREPARED, COMMITTED) for longer
    #: alerts, once; `stuck_prepared_after_seconds`, its name from when only PREPARED batches
    #: alerted, is still accepted
    stuck_after_seconds: float = Field(
        default=300.0,
        gt=0,
        validation_alias=AliasChoices("stuck_after_seconds", "stuck_prepared_after_seconds"),
    )
    #: consumer-group acks refused in a row (across batches and retries) before an alert
    ack_failures_before_alert: int = Field(default=3, gt=0)
    #: the consumer group's total lag (offsets, all partitions) above which the table's
    #: lag check fails; unset: the check passes and only reports the figure
    max_consumer_lag: int | None = Field(default=None, ge=0)
    #: the share of the last committed batch's records that may go to the quarantine
    #: before the quarantine's ratio check fails; unset: the check passes with the figure
    max_quarantine_ratio: float | None = Field(default=None, ge=0, le=1)
    webhook_url_env: str | None = None
    slack_token_env: str | None = None
    slack_channel: str | None = None
    #: Slack's API root, for an egress proxy; default Slack itself
    slack_api_url: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_stuck_threshold(cls, data: Any) -> Any:
        if (
            isinstance(data, dict)
            and "stuck_after_seconds" in data
            and "stuck_prepared_after_seconds" in data
        ):
            raise ValueError(
                "give stuck_after_seconds only (stuck_prepared_after_seconds is its former name)"
            )
        return data

    @field_validator("webhook_url_env", "slack_token_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
            raise ValueError("must be the NAME of an environment variable, not its value")
        return value


class PipelineConfig(_Strict):
    pipeline: str
    kafka: KafkaSettings
    delta: DeltaSettings
    ledger: LedgerSettings = Field(default_factory=LedgerSettings)
    spark: SparkSettings = Field(default_factory=SparkSettings)
    batch: BatchSettings = Field(default_factory=BatchSettings)
    schedule: ScheduleSettings = Field(default_factory=ScheduleSettings)
    alerts: AlertSettings = Field(default_factory=AlertSettings)
    clean: CleanSettings = Field(default_factory=CleanSettings)
    compact: CompactSettings = Field(default_factory=CompactSettings)
    transform: str = "jobs.examples.pageviews:transform"
    #: Folders the transform's modules are imported from, relative to the config file's
    #: folder; appended to the import path of this process only (resources/config/transforms.py)
    python_path: list[str] = Field(default_factory=list)
    #: records in Avro or Protobuf, decoded instead of by a transform (resources/config/formats.py);
    #: the transform is then `format:<kind>`
    format: FormatSettings | None = None
    #: Delta tables kept from the raw rows in the same two-phase commit
    # (resources/config/derived_spec.py,
    #: docs/derived-tables.md): published after the quarantine, before the raw table
    derived: list[OutputSpec] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _format_or_transform(cls, data: Any) -> Any:
        # a format's decoder is the transform: naming both would leave one of them unused
        if isinstance(data, dict) and isinstance(data.get("format"), dict):
            if "transform" in data:
                raise ValueError("give format or transform, not both: format decodes the records")
            kind = data["format"].get("kind")
            upserts = [
                d.get("name")
                for d in data.get("derived") or []
                if isinstance(d, dict) and d.get("kind") == "upsert"
            ]
            if upserts:
                # a format quarantines null values: an upsert output would never delete
                raise ValueError(
                    f"format: the upsert output(s) {upserts} need tombstones (null values) "
                    "let through with the key from the Kafka key, which format does not do "
                    "yet: use a transform"
                )
            data = {**data, "transform": f"format:{kind}"}
        return data

    @field_validator("derived")
    @classmethod
    def _unique_outputs(cls, value: list[AnyOutput]) -> list[AnyOutput]:
        # the name is part of each output's application id and of its vote target
        # (`derived:<name>`): two outputs of one name would take each other's commits
        seen: set[str] = set()
        tables: set[tuple[str, str]] = set()
        for output in value:
            if isinstance(output, PostgresOutput):
                # the state row is keyed by table and app id: a second output on the same
                # table of the same database would find its batches "already applied"
                where = (repr(output.url), output.table)
                if where in tables:
                    raise ValueError(
                        f"derived output {output.name}: another postgres output keeps table "
                        f"{output.table} at the same url"
                    )
                tables.add(where)
            if output.name in seen:
                raise ValueError(f"two derived outputs are named {output.name!r}")
            seen.add(output.name)
        return value

    @field_validator("pipeline")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("must be letters, digits, '_', '.' or '-' (at most 128)")
        if value.endswith(BACKFILL_SUFFIX):
            # the name is the live application id, `<name>.backfill` its backfills': two
            # pipelines sharing an id would take each other's commits for their own
            raise ValueError(
                f"must not end in {BACKFILL_SUFFIX!r}: {value!r} is the application id of the "
                f"backfills of pipeline {value.removesuffix(BACKFILL_SUFFIX)!r}"
            )
        return value

    @field_validator("transform")
    @classmethod
    def _transform(cls, value: str) -> str:
        target, _, function = value.rpartition(":")
        if not target or not function or (":" in target and not is_file_spec(value)):
            raise ValueError("must be 'module.path:function' or 'path/to/file.py:function'")
        return value

    @property
    def app_id(self) -> str:
        """The Delta application id of the live pipeline: its name."""
        return self.pipeline

    @property
    def group_id(self) -> str:
        return self.kafka.group_id or f"exactly-{self.pipeline}"

    def replace_refusals(self) -> list[str]:
        """Why a `replace` backfill cannot keep this pipeline's derived outputs right (one
        reason per such output); empty when it can."""
        return [reason for spec in self.derived if (reason := replace_refusal(spec)) is not None]

    def load_transform(self, spec: str | None = None) -> Callable[..., Any]:
        """This pipeline's hand-written transform, or another one (a backfill's) found the
        same way: a file, or a module on the import path and `python_path`. A `format:`
        section's decoder is built by the stage (jobs/formats/format_decode.py
        `pipeline_transform`), which imports Spark; the config does not."""
        return load_transform(spec or self.transform, self.python_path)


def _describe(error: ValidationError, source: str) -> str:
    problems = []
    for item in error.errors():
        loc = list(item["loc"])
        if loc[:1] == ["derived"]:
            # the discriminator's tag ("aggregate"/"upsert") is noise in a location
            loc = [p for p in loc if p not in ("aggregate", "upsert")]
        where = ".".join(str(p) for p in loc) or "(top level)"
        kind = item["type"]
        if kind == "extra_forbidden":
            problems.append(f"{where}: unknown key")
        elif kind == "missing":
            problems.append(f"{where}: required key is missing")
        else:
            problems.append(f"{where}: {item['msg']}")
    return f"invalid pipeline config {source}: " + "; ".join(problems)


def parse_config(
    data: Any,
    source: str = "<config>",
    base_dir: Path | None = None,
    code_dir: Path | None = None,
) -> PipelineConfig:
    """Validate a loaded YAML document; local paths become absolute against `base_dir`, and
    the transform's file and `python_path` against `code_dir` (the config file's folder,
    where its user keeps the code beside it), both by default the current directory."""
    if not isinstance(data, dict):
        raise ConfigError(f"invalid pipeline config {source}: expected a mapping at the top")
    try:
        config = PipelineConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source)) from None
    base = base_dir or Path.cwd()
    delta = config.delta.model_copy(
        update={
            "table_uri": storage.resolve(config.delta.table_uri, base),
            "quarantine_uri": storage.resolve(config.delta.quarantine_uri, base),
        }
    )
    derived = [
        d
        if isinstance(d, PostgresOutput)  # a database table: no location on storage
        else d.model_copy(update={"table_uri": storage.resolve(d.table_uri, base)})
        for d in config.derived
    ]
    locations = {
        "delta.table_uri": delta.table_uri,
        "delta.quarantine_uri": delta.quarantine_uri,
        **{
            f"derived.{d.name}.table_uri": d.table_uri
            for d in derived
            if not isinstance(d, PostgresOutput)
        },
    }
    names = list(locations)
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            if storage.overlaps(locations[first], locations[second]):
                raise ConfigError(
                    f"invalid pipeline config {source}: {second} and {first} must be separate "
                    "locations, neither inside the other (vacuum of one would delete the "
                    "other's files)"
                )
    ledger = config.ledger.model_copy(update={"url": _resolve_sqlite(config.ledger.url, base)})
    code = _code_location(config, code_dir or base, source)
    fmt = config.format.resolved(base) if config.format else None
    return config.model_copy(
        update={"delta": delta, "ledger": ledger, "derived": derived, "format": fmt, **code}
    )


def _code_location(config: PipelineConfig, code_dir: Path, source: str) -> dict[str, Any]:
    """The transform's file and `python_path` as absolute paths (resources/config/transforms.py)."""
    folders = []
    for entry in config.python_path:
        folder = (code_dir / entry).resolve()
        if not folder.is_dir():
            raise ConfigError(
                f"invalid pipeline config {source}: python_path: {folder} is not a folder"
            )
        folders.append(str(folder))
    return {"python_path": folders, "transform": absolute_spec(config.transform, code_dir)}


def _resolve_sqlite(url: str, base: Path) -> str:
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url.startswith(prefix + "/"):
        rel = url[len(prefix) :]
        if rel and rel != ":memory:":
            return prefix + str((base / rel).resolve())
    return url


def load_config(path: str | os.PathLike[str]) -> PipelineConfig:
    """Read and validate a pipeline config file. Relative paths resolve against the
    current directory, as for any command-line tool."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read pipeline config {file}: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"pipeline config {file} is not valid YAML: {exc}") from exc
    return parse_config(data, str(file), code_dir=file.parent)
