"""The `<pipeline>_clean` job: delete the pipeline's staged orphans (jobs/maintenance/cleaner.py),
the same code as `exactly clean`, on the process's shared ledger and tables.

Its own concurrency key (`<pipeline>.clean`): a clean never waits behind micro-batches nor
holds them up, and two cleans of one pipeline never run at once. Running beside batches is
safe by the cleaner's order of reads and its re-check before each delete (invariant 18).
The run's output metadata holds the files and bytes deleted and kept; a run that deleted
(not a dry run) observes the table asset with its files and the time of this cleaning
(orchestration/metadata.py).
"""

import time
from collections.abc import Iterator

import dagster as dg
from pydantic import Field

from jobs.maintenance.cleaner import clean
from ledger.core.cleaning import parse_duration
from orchestration.health.failures import one_line_failures
from orchestration.metadata import maintenance_metadata
from orchestration.names import dagster_name
from orchestration.resources import pipeline_in, pipeline_key
from orchestration.tags import PIPELINE_TAG
from resources.config.pipeline_config import PipelineConfig


class CleanRequest(dg.Config):
    """The launchpad of the clean job."""

    older_than: str | None = Field(
        default=None,
        description="grace period (30m, 6h, 7d); default: the config's clean.older_than",
    )
    dry_run: bool = Field(default=False, description="list what would go; delete nothing")


def build_clean_job(config: PipelineConfig, table: dg.AssetSpec) -> dg.JobDefinition:
    name = config.pipeline

    @dg.op(name=f"{dagster_name(name)}_clean_staged", required_resource_keys={pipeline_key(name)})
    @one_line_failures(name)
    def clean_staged(context: dg.OpExecutionContext, config: CleanRequest) -> Iterator[dg.Output]:
        """Delete (or list) the staged files no batch and no table version needs."""
        pipeline = pipeline_in(context, name)
        grace = (
            parse_duration(config.older_than, "older_than")
            if config.older_than
            else pipeline.config.clean.grace
        )
        report = clean(
            pipeline.config,
            older_than=grace,
            dry_run=config.dry_run,
            store=pipeline.store,
            publisher=pipeline.publisher,
            log=context.log.info,
        )
        if not config.dry_run:
            context.log_event(
                dg.AssetObservation(
                    asset_key=table.key,
                    metadata=maintenance_metadata(pipeline, context.instance, cleaned=time.time()),
                )
            )
        yield dg.Output(report.summary(), metadata=report.metadata())

    @dg.job(
        name=f"{dagster_name(name)}_clean",
        description=(
            f"Delete staged files of pipeline {name!r} that no vote names, no table version "
            "reads and no batch in flight may use, older than the grace period."
        ),
        executor_def=dg.in_process_executor,
        tags={PIPELINE_TAG: f"{name}.clean"},
    )
    def clean_job() -> None:
        clean_staged()

    return clean_job
