"""The pipeline config file's top-level model (`PipelineConfig`), validated before anything
runs: its sections (resources/config/kafka_settings.py, resources/config/sections.py), the
transform or format that reads the records, and the derived outputs.

Unknown keys and bad values are errors that name the field (`kafka.topic: ...`), because a
typo in a config that silently falls back to a default is how records get lost. Reading and
resolving a file is resources/config/loading.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import Field, field_validator, model_validator

from ledger.core.batch import BACKFILL_SUFFIX
from resources.config.derived_spec import AnyOutput, OutputSpec, PostgresOutput, replace_refusal
from resources.config.formats import FormatSettings
from resources.config.kafka_settings import KafkaSettings
from resources.config.sections import (
    AlertSettings,
    BatchSettings,
    CleanSettings,
    CompactSettings,
    DeltaSettings,
    LedgerSettings,
    ScheduleSettings,
    SparkSettings,
)
from resources.config.strict import _NAME, _Strict
from resources.config.transforms import is_file_spec, load_transform


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
    #: (resources/config/derived_spec.py, docs/derived-tables.md): published after the
    #: quarantine, before the raw table
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
        tables: dict[tuple[str, str], PostgresOutput] = {}
        for output in value:
            if isinstance(output, PostgresOutput):
                # each output applies every batch under its own application id: two outputs
                # on one table of one database would add every batch to it twice
                where = (repr(output.url), output.table)
                if where in tables:
                    raise ValueError(
                        f"derived output {output.name}: another postgres output keeps table "
                        f"{output.table} at the same url"
                    )
                _refuse_another_spelling(output, tables)
                tables[where] = output
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


def _refuse_another_spelling(
    output: PostgresOutput, tables: Mapping[tuple[str, str], PostgresOutput]
) -> None:
    """Refuse `output` when an earlier output at the same url may be its table under
    another spelling: `views` resolves through the search_path (to `public.views` as a
    rule), so `views` and `<schema>.views` may be one table, unless both name a schema."""
    name = output.table.rsplit(".", 1)[-1]
    for (url, table), other in tables.items():
        if url != repr(output.url) or table.rsplit(".", 1)[-1] != name:
            continue
        if ("." in table) != ("." in output.table):
            raise ValueError(
                f"derived output {output.name}: table {output.table} may be table {table} "
                f"of output {other.name} at the same url (a name without a schema resolves "
                "through the search_path), and both would take every batch: name both with "
                "their schema"
            )
