"""The lineage a pipeline draws in the UI: the Kafka topic upstream, the two tables read
from it, the data table and the quarantine, and the derived outputs computed from the data
table (docs/derived-tables.md).

The topic is an external asset: Kafka's producers make it, exactly only reads it, so nothing
here materializes it; it is there so the lineage view starts where the records do. The
quarantine is an asset of its own, not metadata of the table's, because operators follow
its size and version separately (invariant 9 sends every record the transform cannot parse
there) and its checks render on it. The data table's spec stays in
orchestration/pipeline_definitions.py; its key is built here, like the others, so every
module names the assets one way.
"""

from __future__ import annotations

import re

import dagster as dg

from ledger.core.errors import ConfigError
from orchestration.names import dagster_name
from resources.config.derived_spec import AggregateOutput, PostgresOutput, UpsertOutput
from resources.config.pipeline_config import PipelineConfig


def group_of(pipeline: str) -> str:
    """The asset group of a pipeline's assets: its name as Dagster spells names, so each
    pipeline is one group in the UI and its health one view."""
    return dagster_name(pipeline)


def topic_key(pipeline: str) -> dg.AssetKey:
    return dg.AssetKey(f"{dagster_name(pipeline)}_topic")


def table_key(pipeline: str) -> dg.AssetKey:
    return dg.AssetKey(f"{dagster_name(pipeline)}_table")


def quarantine_key(pipeline: str) -> dg.AssetKey:
    return dg.AssetKey(f"{dagster_name(pipeline)}_quarantine")


def topic_spec(config: PipelineConfig) -> dg.AssetSpec:
    kafka = config.kafka
    return dg.AssetSpec(
        key=topic_key(config.pipeline),
        description=(
            f"Kafka {kafka.selection().describe()} on {kafka.bootstrap_servers} "
            "(read, never written)"
        ),
        group_name=group_of(config.pipeline),
        kinds={"kafka"},
    )


def quarantine_spec(
    config: PipelineConfig, batches: dg.DynamicPartitionsDefinition
) -> dg.AssetSpec:
    return dg.AssetSpec(
        key=quarantine_key(config.pipeline),
        description=(
            f"Delta table {config.delta.quarantine_uri}: the records the transform could not "
            "parse, with their coordinates, error and raw bytes; one partition per committed "
            "batch, like the data table"
        ),
        partitions_def=batches,
        deps=[topic_key(config.pipeline)],
        group_name=group_of(config.pipeline),
        kinds={"delta"},
    )


#: The suffixes of a pipeline's own assets: a derived output named like one would take its
#: key (`<pipeline>_table`), and the lineage would silently show one node for two tables.
RESERVED_NAMES = ("table", "quarantine", "topic")
#: What Dagster accepts in a check's name, which is built from the output's name.
_DAGSTER_NAME = re.compile(r"^[A-Za-z0-9_]+$")


def derived_key(pipeline: str, name: str) -> dg.AssetKey:
    """The asset of derived output `name`: `<pipeline>_<name>`, beside the table's.

    Refused here, where every module builds the key, rather than mapped to something else:
    a name that would collide with the pipeline's own assets (`table`, `quarantine`,
    `topic`), or that Dagster cannot take in the output's check name (a '.' or '-', which
    the config allows in output names), is renamed by the operator once, instead of the UI
    showing a key nobody configured.
    """
    if name.lower() in RESERVED_NAMES:
        raise ConfigError(
            f"derived output {name!r} of pipeline {pipeline}: its Dagster asset would be "
            f"{pipeline}_{name}, the pipeline's own {name.lower()} asset; rename the output"
        )
    if not _DAGSTER_NAME.match(name):
        raise ConfigError(
            f"derived output {name!r} of pipeline {pipeline}: Dagster names its asset check "
            "after it and takes only letters, digits and '_'; rename the output"
        )
    return dg.AssetKey(f"{dagster_name(pipeline)}_{name}")


def describe_output(output: AggregateOutput | UpsertOutput | PostgresOutput) -> str:
    """What the output holds, in one line: what an operator needs to read its rows."""
    if isinstance(output, UpsertOutput):
        return (
            f"upsert: the latest record per key ({', '.join(output.key)}) by Kafka order, "
            "a tombstone deleting it"
        )
    measures = ", ".join(f"{m.name} = {m.fn}({m.column or '*'})" for m in output.measures)
    window = (
        f", per {output.window.size} tumbling window of {output.window.column}"
        if output.window is not None
        else ""
    )
    return f"aggregate: {measures} by {', '.join(output.group_by)}{window}"


def derived_spec(
    config: PipelineConfig,
    output: AggregateOutput | UpsertOutput | PostgresOutput,
    batches: dg.DynamicPartitionsDefinition,
) -> dg.AssetSpec:
    """A derived output's asset, downstream of the data table it is computed from (the
    lineage: topic -> table -> derived table), one partition per committed batch like the
    table: every batch's commit changes it (invariant 12, derived outputs before the
    table)."""
    # a PostgreSQL output's URL may come from the environment (a password): not shown
    where = (
        f"PostgreSQL table {output.table}"
        if isinstance(output, PostgresOutput)
        else f"Delta table {output.table_uri}"
    )
    return dg.AssetSpec(
        key=derived_key(config.pipeline, output.name),
        description=(
            f"{where}, derived from {table_key(config.pipeline).path[0]} "
            f"in the same commit: {describe_output(output)}"
        ),
        partitions_def=batches,
        deps=[table_key(config.pipeline)],
        group_name=group_of(config.pipeline),
        kinds={"postgres"} if isinstance(output, PostgresOutput) else {"delta"},
    )
