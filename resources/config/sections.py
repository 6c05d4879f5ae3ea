"""The pipeline config's sections besides Kafka: where the tables and the ledger live
(`delta`, `ledger`), how Spark runs (`spark`), how big a batch is and when jobs run (`batch`,
`schedule`, `clean`, `compact`), and where alerts go (`alerts`). Each is strict, so a typo is
an error naming the field rather than a silent default.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any, Literal

from pydantic import AliasChoices, Field, field_validator, model_validator

from ledger.core.cleaning import parse_duration
from ledger.core.errors import ConfigError
from resources.config.env_values import OptionValue, resolve_options
from resources.config.partitioning import PartitionColumn, check_unique
from resources.config.strict import _Strict


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
    #: continuous mode (`exactly run --continuous`, the continuous job) compacts the table
    #: and the quarantine between two batches once either holds more files than this: a
    #: commit's cost grows with the live files (BENCHMARKS.md, "Commit latency over
    #: history"). Unset: it never does, for the reason above.
    when_files_over: int | None = Field(default=None, gt=0)


class AlertSettings(_Strict):
    """Where alerts go. Secrets never live here: only the names of environment variables
    that hold them, so neither the config, the Dagster UI nor the ledger ever shows one."""

    #: a batch in any state but a final one (PLANNED, STAGED, PREPARED, COMMITTED) for longer
    #: alerts, once; `stuck_prepared_after_seconds` is accepted for it too, so configs that
    #: spell it that way keep their threshold
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
    #: how old the newest committed record (its Kafka timestamp) may be before the table's
    #: freshness check fails; unset: the check passes and only reports the age
    max_staleness_seconds: float | None = Field(default=None, gt=0)
    webhook_url_env: str | None = None
    slack_token_env: str | None = None
    slack_channel: str | None = None
    #: Slack's API root, for an egress proxy; default Slack itself
    slack_api_url: str | None = None
    #: the Dagster UI's address (`https://dagster.example.com`): alerts that name a run link it
    dagster_url: str | None = Field(default=None, pattern=r"^https?://\S+$")

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
