"""The lineage a pipeline draws in the UI: the Kafka topic upstream, and the two tables read
from it, the data table and the quarantine.

The topic is an external asset: Kafka's producers make it, exactly only reads it, so nothing
here materializes it; it is there so the lineage view starts where the records do. The
quarantine is an asset of its own, not metadata of the table's, because operators follow
its size and version separately (invariant 9 sends every record the transform cannot parse
there) and its checks render on it. The data table's spec stays in
orchestration/pipeline_definitions.py; its key is built here, like the others, so every
module names the assets one way.
"""

from __future__ import annotations

import dagster as dg

from resources.config import PipelineConfig


def topic_key(pipeline: str) -> dg.AssetKey:
    return dg.AssetKey(f"{pipeline}_topic")


def table_key(pipeline: str) -> dg.AssetKey:
    return dg.AssetKey(f"{pipeline}_table")


def quarantine_key(pipeline: str) -> dg.AssetKey:
    return dg.AssetKey(f"{pipeline}_quarantine")


def topic_spec(config: PipelineConfig) -> dg.AssetSpec:
    kafka = config.kafka
    return dg.AssetSpec(
        key=topic_key(config.pipeline),
        description=f"Kafka topic {kafka.topic} on {kafka.bootstrap_servers} (read, never written)",
        group_name="exactly",
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
        group_name="exactly",
        kinds={"delta"},
    )
