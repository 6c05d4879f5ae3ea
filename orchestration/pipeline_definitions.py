"""Everything Dagster knows of one pipeline config, assembled in one place: its resources,
its batch partitions, its assets (the topic, the table, the quarantine and one per derived
output) and the table checks, its jobs, its three schedules and its five sensors.

Each piece is built by the module named for it; this module only wires them together and
declares the resources once, in the pipeline's `Definitions`, which the code location
merges (orchestration/definitions.py). The jobs handed out here are the ones bound to those
resources, so they run as they do in the code location (`execute_in_process` in tests and
the benchmark).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from orchestration.assets import derived_spec, group_of, quarantine_spec, topic_spec
from orchestration.batches.backfill_job import build_backfill_job
from orchestration.batches.continuous_job import build_continuous_job
from orchestration.batches.micro_batch_job import build_micro_batch_graph, build_micro_batch_job
from orchestration.batches.next_batch_job import build_next_batch_job
from orchestration.batches.next_batch_schedule import build_next_batch_schedule
from orchestration.batches.redrive_job import build_redrive_job
from orchestration.batches.redrive_sensor import build_redrive_sensor
from orchestration.decisions.abandon_job import build_abandon_job
from orchestration.decisions.decide_job import build_decide_job
from orchestration.decisions.rebuild_job import build_rebuild_job
from orchestration.decisions.recover_job import build_recover_job
from orchestration.health.checks_sensor import build_checks_sensor
from orchestration.health.history_sensor import build_history_sensor
from orchestration.health.run_failure_sensor import build_run_failure_sensor
from orchestration.health.stuck_sensor import build_stuck_sensor
from orchestration.health.table_checks import build_table_checks
from orchestration.maintenance.clean_job import build_clean_job
from orchestration.maintenance.clean_schedule import build_clean_schedule
from orchestration.maintenance.compact_job import build_compact_job
from orchestration.maintenance.compact_schedule import build_compact_schedule
from orchestration.names import dagster_name
from orchestration.resources import PipelineResource, alerts_key, alerts_resource, pipeline_key
from resources.config.pipeline_config import PipelineConfig


@dataclass(frozen=True)
class PipelineDefinitions:
    """One pipeline's definitions; `definitions` holds them all, with the resources."""

    config: PipelineConfig
    resource: PipelineResource
    #: every resource by key (the pipeline's and its alert sinks), as Dagster injects them
    resources: dict[str, Any]
    batches: dg.DynamicPartitionsDefinition
    table: dg.AssetSpec
    micro_batch: dg.JobDefinition
    next_batch: dg.JobDefinition
    continuous: dg.JobDefinition
    redrive: dg.JobDefinition
    backfill: dg.JobDefinition
    clean: dg.JobDefinition
    compact: dg.JobDefinition
    decide: dg.JobDefinition
    recover: dg.JobDefinition
    abandon: dg.JobDefinition
    rebuild: dg.JobDefinition
    schedule: dg.ScheduleDefinition
    clean_schedule: dg.ScheduleDefinition
    compact_schedule: dg.ScheduleDefinition
    sensors: list[dg.SensorDefinition]
    definitions: dg.Definitions
    #: one asset per derived output, in config order, downstream of `table`
    derived: tuple[dg.AssetSpec, ...] = ()


def pipeline_definitions(config_path: str | Path) -> PipelineDefinitions:
    """The definitions of the pipeline described by the config file at `config_path`."""
    resource = PipelineResource(config_path=str(Path(config_path).resolve()))
    config = resource.config()
    name = config.pipeline
    resources = {
        pipeline_key(name): resource,
        alerts_key(name): alerts_resource(config.alerts, resource.config_path),
    }
    batches = dg.DynamicPartitionsDefinition(name=f"{dagster_name(name)}_batches")
    topic = topic_spec(config)
    table = dg.AssetSpec(
        key=f"{dagster_name(name)}_table",
        description=f"Delta table {config.delta.table_uri}, one partition per committed batch",
        partitions_def=batches,
        deps=[topic.key],
        group_name=group_of(name),
        kinds={"delta"},
    )
    quarantine = quarantine_spec(config, batches)
    derived = tuple(derived_spec(config, output, batches) for output in config.derived)
    one_batch = build_micro_batch_graph(config, batches, table)
    jobs = {
        "micro_batch": build_micro_batch_job(config, one_batch, batches),
        "next_batch": build_next_batch_job(config, one_batch),
        "continuous": build_continuous_job(config, batches, table),
        "redrive": build_redrive_job(config, batches, table),
        "backfill": build_backfill_job(config, table),
        "clean": build_clean_job(config, table),
        "compact": build_compact_job(config, table),
        "decide": build_decide_job(config),
        "recover": build_recover_job(config),
        "abandon": build_abandon_job(config),
        "rebuild": build_rebuild_job(config),
    }
    schedule = build_next_batch_schedule(config, jobs["micro_batch"], batches)
    clean_schedule = build_clean_schedule(config, jobs["clean"])
    compact_schedule = build_compact_schedule(config, jobs["compact"])
    sensors = [
        build_redrive_sensor(config, batches, jobs["redrive"], jobs["backfill"]),
        build_stuck_sensor(config),
        build_run_failure_sensor(config, list(jobs.values())),
        build_history_sensor(config, batches, table),
        build_checks_sensor(config),
    ]
    definitions = dg.Definitions(
        assets=[topic, table, quarantine, *derived],
        asset_checks=[build_table_checks(config)],
        jobs=list(jobs.values()),
        schedules=[schedule, clean_schedule, compact_schedule],
        sensors=sensors,
        resources=resources,
    )
    return PipelineDefinitions(
        config=config,
        resource=resource,
        resources=resources,
        batches=batches,
        table=table,
        **{key: definitions.resolve_job_def(job.name) for key, job in jobs.items()},
        schedule=schedule,
        clean_schedule=clean_schedule,
        compact_schedule=compact_schedule,
        sensors=sensors,
        definitions=definitions,
        derived=derived,
    )
