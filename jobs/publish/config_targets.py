"""A pipeline's outputs as its config names them, each opened with the config's storage
options: what `DeltaPublisher.for_config` (jobs/publish/delta_publisher.py) is built from."""

from __future__ import annotations

from typing import Any

from jobs.publish.derived_outputs import partitioning
from ledger.core.backfill import backfill_app_id
from ledger.core.layout import derived_target
from resources.config.derived_spec import PostgresOutput
from resources.config.pipeline_config import PipelineConfig
from resources.delta.table import DeltaTarget
from resources.postgres.target import PostgresTarget

#: a quarantine's layout refusal: its field, and the one way out (it has no partition_by)
QUARANTINE_LAYOUT = (
    "delta.quarantine_uri",
    "a quarantine is never partitioned, give a new quarantine_uri",
)


def config_targets(config: PipelineConfig) -> dict[str, Any]:
    """`DeltaPublisher`'s arguments for `config`: the data table, the quarantine, the
    derived Delta and PostgreSQL outputs, their config order and the application ids."""
    options = config.delta.resolved_storage_options()
    return {
        "table": DeltaTarget(config.delta.table_uri, options, config.delta.partition_by),
        # exactly creates the quarantine unpartitioned and stages its files so: one
        # partitioned by another writer is refused before the vote, not at the commit
        "quarantine": DeltaTarget(
            config.delta.quarantine_uri, options, (), layout_words=QUARANTINE_LAYOUT
        ),
        "derived": [
            (spec, DeltaTarget(spec.table_uri, options, **partitioning(spec)))
            for spec in config.derived
            if not isinstance(spec, PostgresOutput)
        ],
        "postgres": [
            PostgresTarget(spec, config.delta.table_uri)
            for spec in config.derived
            if isinstance(spec, PostgresOutput)
        ],
        "order": [derived_target(spec.name) for spec in config.derived],
        "app_ids": (config.app_id, backfill_app_id(config.pipeline)),
    }
