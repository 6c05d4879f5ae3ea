"""The asset checks of a pipeline's tables: trouble shown on the assets, where operators look.

- `no_stuck_batch` (table): no batch, live or backfill, sits in a state that is not final
  for longer than `alerts.stuck_after_seconds`: the stuck alert's own rule (`decide_stuck`),
  by the ledger database's clock (invariant 17); the stuck sensor alerts on it, not the
  checks sensor;
- `consumer_lag_within_bound` (table): the consumer group's total lag is at most
  `alerts.max_consumer_lag`;
- `last_batch_complete` (table): the tables hold, by coordinates, exactly the last committed
  batch's records: what it read minus what it quarantined in the table, what it quarantined
  in the quarantine (invariants 1 and 9), counted in the batch's own topic incarnation;
- `quarantine_ratio_within_bound` (quarantine): the last committed batch quarantined at most
  `alerts.max_quarantine_ratio` of what it read;
- `<name>_matches_recomputation` (each derived output's asset): the derived table equals its
  recomputation from the raw table (orchestration/health/derived_checks.py).

An unset bound does not skip its check: it passes and reports the figure, so lag and
quarantine ratio are followed in the UI before anyone picks a bound. A check that cannot
tell (Kafka unreachable, a batch rebuilt from the Delta log without its record counts) gives
no verdict, rather than a pass it cannot vouch for or a failure that is not the table's.

The verdicts are judged by pure functions (`judge_*`) over what `verdicts` reads from the
ledger, Kafka and the tables. The checks sensor (orchestration/health/checks_sensor.py) reports
them and alerts; `build_table_checks` declares them, so they render on the assets, and lets
an operator run them from the UI (same verdicts, no alert).
"""

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

import dagster as dg

from jobs.wiring.pipeline import Pipeline, last_committed, newest_record
from ledger.core.backfill import backfill_app_id
from ledger.core.batch import Batch
from ledger.core.decisions import DecisionKind
from ledger.core.errors import CONFIG_PLACEHOLDER
from ledger.core.layout import QUARANTINE, TABLE
from ledger.core.protocol import IN_FLIGHT, PUBLISHED
from ledger.core.stuck import batch_key, decide_stuck, in_state_since
from orchestration.assets import quarantine_key, table_key, topic_key
from orchestration.decisions.spelling import as_launchpad
from orchestration.health.derived_checks import derived_check_specs, derived_verdicts
from orchestration.health.freshness import freshness_spec, judge_freshness
from orchestration.health.holder import Holder, holder_metadata, holder_of, release_text
from orchestration.health.verdict import Verdict
from orchestration.names import dagster_name
from orchestration.resources import PipelineResource, pipeline_key, resource_in
from resources.config.pipeline_config import PipelineConfig

NO_STUCK_BATCH = "no_stuck_batch"
CONSUMER_LAG = "consumer_lag_within_bound"
QUARANTINE_RATIO = "quarantine_ratio_within_bound"
LAST_BATCH_COMPLETE = "last_batch_complete"


def check_specs(config: PipelineConfig) -> list[dg.AssetCheckSpec]:
    name = config.pipeline
    alerts = config.alerts
    lag_bound = "no bound set" if alerts.max_consumer_lag is None else alerts.max_consumer_lag
    ratio_bound = (
        "no bound set" if alerts.max_quarantine_ratio is None else alerts.max_quarantine_ratio
    )
    return [
        dg.AssetCheckSpec(
            NO_STUCK_BATCH,
            asset=table_key(name),
            description=(
                "No batch in PLANNED, STAGED, PREPARED or COMMITTED for over "
                f"{alerts.stuck_after_seconds:g}s (alerts.stuck_after_seconds)"
            ),
        ),
        dg.AssetCheckSpec(
            CONSUMER_LAG,
            asset=table_key(name),
            description=f"Consumer group's total lag within alerts.max_consumer_lag ({lag_bound})",
        ),
        dg.AssetCheckSpec(
            LAST_BATCH_COMPLETE,
            asset=table_key(name),
            description=(
                "The last committed batch's rows, counted by coordinates in both tables, are "
                "its records read: minus the quarantined in the table, the quarantined in the "
                "quarantine"
            ),
        ),
        dg.AssetCheckSpec(
            QUARANTINE_RATIO,
            asset=quarantine_key(name),
            description=(
                "The last committed batch quarantined at most alerts.max_quarantine_ratio "
                f"({ratio_bound}) of its records"
            ),
        ),
        freshness_spec(name, alerts.max_staleness_seconds),
        *derived_check_specs(config),
    ]


def judge_stuck(
    pipeline: str,
    candidates: Iterable[Batch],
    now: datetime,
    threshold_s: float,
    holders: Mapping[str, Holder] | None = None,
) -> Verdict:
    """Pure: the stuck alert's rule (orchestration/health/stuck_sensor.py `decide_stuck`) as a
    check; with `holders` (by batch key), who holds each stuck batch and what frees it
    (orchestration/health/holder.py), and the oldest one's holding run linked."""
    stuck = decide_stuck({}, candidates, {}, now, threshold_s).stuck
    ages = {
        f"{batch_key(b)} {b.state}": (now - (in_state_since(b) or now)).total_seconds()
        for b in stuck
    }
    metadata: dict[str, Any] = {
        "stuck_batches": len(stuck),
        "oldest_stuck_seconds": round(max(ages.values(), default=0.0), 1),
        "threshold_seconds": threshold_s,
    }
    if not stuck:
        return Verdict(
            NO_STUCK_BATCH,
            table_key(pipeline),
            True,
            f"no batch has been in a state that is not final for over {threshold_s:g}s",
            metadata,
        )
    listed = ", ".join(f"{key} {ages[key] / 60:.1f} min" for key in ages)
    metadata["batches"] = dg.MetadataValue.text(listed)
    held = [(b, h) for b in stuck if (h := (holders or {}).get(batch_key(b))) is not None]
    released = " ".join(f"Batch {batch_key(b)}: {release_text(b, h, pipeline)}" for b, h in held)
    if held:
        oldest = max(held, key=lambda bh: ages[f"{batch_key(bh[0])} {bh[0].state}"])
        metadata |= holder_metadata(oldest[1])
    return Verdict(
        NO_STUCK_BATCH,
        table_key(pipeline),
        False,
        f"{len(stuck)} batch(es) stuck past {threshold_s:g}s: {listed}. "
        + (released or f"{dagster_name(pipeline)}_stuck_prepared_sensor alerts on each")
        + f" See `exactly ledger -c {CONFIG_PLACEHOLDER}`.",
        metadata,
    )


def judge_lag(pipeline: str, lag: Mapping[int, int], bound: int | None) -> Verdict:
    """Pure: total lag against the bound; every partition's lag as a number of its own."""
    total = sum(lag.values())
    metadata: dict[str, Any] = {"total_lag": total}
    metadata.update({f"lag_partition_{p}": offsets for p, offsets in sorted(lag.items())})
    if bound is None:
        return Verdict(
            CONSUMER_LAG,
            table_key(pipeline),
            True,
            f"total lag {total} (no bound set: alerts.max_consumer_lag)",
            metadata,
        )
    metadata["max_consumer_lag"] = bound
    passed = total <= bound
    text = (
        f"total lag {total} is within {bound}"
        if passed
        else f"total lag {total} is over alerts.max_consumer_lag {bound}: the pipeline falls "
        "behind the topic (is the schedule on, are runs failing, is a batch stuck?)"
    )
    return Verdict(CONSUMER_LAG, table_key(pipeline), passed, text, metadata)


def lag_observations(pipeline: str, found: Iterable[Verdict]) -> list[dg.AssetObservation]:
    """The lag check's figures as an observation of the topic asset: Dagster plots an
    unpartitioned asset's observations on a time axis, so the topic's page shows the lag
    over time (the table's materializations are plotted by batch id, with gaps)."""
    return [
        dg.AssetObservation(asset_key=topic_key(pipeline), metadata=dict(v.metadata))
        for v in found
        if v.check == CONSUMER_LAG
    ]


def _counts(batch: Batch) -> tuple[int, int] | None:
    """(records read, records quarantined), if the ledger has them (a batch rebuilt from the
    Delta log does not)."""
    metrics = batch.metrics
    if "records_read" not in metrics or "quarantine_records" not in metrics:
        return None
    return int(metrics["records_read"]), int(metrics["quarantine_records"])


def judge_ratio(pipeline: str, batch: Batch | None, bound: float | None) -> Verdict | None:
    """Pure: the last committed batch's quarantined share against the bound."""
    asset = quarantine_key(pipeline)
    if batch is None:
        return Verdict(QUARANTINE_RATIO, asset, True, "no batch committed yet", {})
    counts = _counts(batch)
    if counts is None:
        return None
    read, quarantined = counts
    ratio = quarantined / read if read else 0.0
    metadata: dict[str, Any] = {
        "quarantine_ratio": round(ratio, 6),
        "records_read": read,
        "quarantine_records": quarantined,
        "batch": dg.MetadataValue.text(batch_key(batch)),
    }
    what = f"batch {batch_key(batch)} quarantined {quarantined} of {read} records ({ratio:.2%})"
    if bound is None:
        return Verdict(
            QUARANTINE_RATIO,
            asset,
            True,
            f"{what} (no bound set: alerts.max_quarantine_ratio)",
            metadata,
        )
    metadata["max_quarantine_ratio"] = bound
    if ratio <= bound:
        return Verdict(QUARANTINE_RATIO, asset, True, f"{what}, within {bound:.2%}", metadata)
    return Verdict(
        QUARANTINE_RATIO,
        asset,
        False,
        f"{what}, over alerts.max_quarantine_ratio {bound:.2%}: the transform rejects more "
        "than expected (a producer's format changed?); the errors are in the quarantine's "
        "_error column, and a replace backfill with a fixed transform re-reads them.",
        metadata,
    )


def judge_rows(
    pipeline: str, batch: Batch | None, table_rows: int, quarantine_rows: int
) -> Verdict | None:
    """Pure: the rows the tables hold in the batch's coordinates against what it read."""
    asset = table_key(pipeline)
    if batch is None:
        return Verdict(LAST_BATCH_COMPLETE, asset, True, "no batch committed yet", {})
    counts = _counts(batch)
    if counts is None:
        return None
    read, quarantined = counts
    expected = read - quarantined
    metadata: dict[str, Any] = {
        "table_rows": table_rows,
        "expected_table_rows": expected,
        "quarantine_rows": quarantine_rows,
        "expected_quarantine_rows": quarantined,
        "batch": dg.MetadataValue.text(batch_key(batch)),
    }
    if table_rows == expected and quarantine_rows == quarantined:
        return Verdict(
            LAST_BATCH_COMPLETE,
            asset,
            True,
            f"batch {batch_key(batch)}: {table_rows} rows in the table and {quarantine_rows} "
            f"in the quarantine, all {read} records it read",
            metadata,
        )
    return Verdict(
        LAST_BATCH_COMPLETE,
        asset,
        False,
        f"batch {batch_key(batch)} read {read} records and quarantined {quarantined}, but its "
        f"coordinates hold {table_rows} rows in the table (expected {expected}) and "
        f"{quarantine_rows} in the quarantine (expected {quarantined}): rows were removed or "
        "added outside exactly. A replace backfill of its ranges "
        f"({' '.join(str(r) for r in batch.ranges if r.span)}) writes them again.",
        metadata,
    )


def other_incarnations(batch: Batch, published: Iterable[Batch]) -> frozenset[int]:
    """Pure: the ids of the committed batches whose rows share coordinates with `batch`'s but
    were read from another incarnation of the topic (another KIP-516 topic id).

    A re-created topic numbers its offsets from 0 again, and the rows read from the old one
    stay in the table as history (ledger/core/decisions.py, new-topic) at the very topic name,
    partition and offset the new one's rows have. Rows carry no topic id, but they carry the
    id of the batch that wrote them (`_batch_id`), and each batch its topic id. A batch with
    no topic id recorded (a ledger older than topic ids) is taken for the same incarnation;
    `batch`'s own id is never left out, even where a batch of the other application id, of
    another incarnation, has the same id.
    """
    mine = [r for r in batch.ranges if r.span and _id_of(batch, r.topic) is not None]
    return frozenset(
        other.batch_id
        for other in published
        if other.batch_id != batch.batch_id
        and any(
            (r.topic, r.partition) == (m.topic, m.partition)
            and r.start < m.end
            and m.start < r.end
            and _id_of(other, r.topic) not in (None, _id_of(batch, m.topic))
            for r in other.ranges
            for m in mine
        )
    )


def _id_of(batch: Batch, topic: str) -> str | None:
    """The id `topic` had when `batch` was planned: per topic for a batch on several topics
    (a re-created one among them is told apart by its own id), else the batch's one id."""
    return batch.topic_ids.get(topic, batch.topic_id)


def _other_incarnations(pipeline: Pipeline, batch: Batch) -> frozenset[int]:
    """`other_incarnations` of `batch` in the ledger; read only if an operator ever accepted
    a new topic incarnation (a new-topic decision), the one way a second one comes in."""
    store = pipeline.store
    config = pipeline.config
    decisions = store.decisions(pipeline=config.pipeline)
    if not any(d.kind is DecisionKind.NEW_TOPIC for d in decisions):
        return frozenset()
    published = [
        b
        for app_id in (config.app_id, backfill_app_id(config.pipeline))
        for b in store.batches(app_id=app_id, states=PUBLISHED)
    ]
    return other_incarnations(batch, published)


def verdicts(
    resource: PipelineResource,
    log: Callable[[str], None],
    instance: dg.DagsterInstance | None = None,
    derived: bool = True,
) -> list[Verdict]:
    """Every check's verdict now, as Dagster shows it (the commands it names as the jobs that
    do them, the rest spelled for the config file); a check that cannot tell is left out,
    and logged. `instance`: whose runs
    may hold a stuck batch. `derived=False` leaves out the derived outputs' checks, which
    recompute each output from the whole table."""
    pipeline = resource.pipeline()
    config = pipeline.config
    store = pipeline.store
    name = config.pipeline
    candidates = [
        *store.batches(app_id=config.app_id, states=IN_FLIGHT),
        *store.batches(app_id=backfill_app_id(name), states=IN_FLIGHT),
    ]
    now, threshold = store.now(), config.alerts.stuck_after_seconds
    holders = {
        batch_key(b): holder_of(pipeline, b, instance)
        for b in decide_stuck({}, candidates, {}, now, threshold).stuck
    }
    found = [judge_stuck(name, candidates, now, threshold, holders)]
    try:
        lag = pipeline.source.consumer_lag()
        found.append(judge_lag(name, lag, config.alerts.max_consumer_lag))
    except Exception as exc:  # Kafka cannot say now: the runs that need it fail loudly
        log(f"{CONSUMER_LAG}: could not read the consumer lag: {exc}")
    newest = newest_record(pipeline)
    found.append(judge_freshness(name, newest, now, config.alerts.max_staleness_seconds))
    batch = last_committed(pipeline)
    publisher = pipeline.publisher
    rows = (0, 0)
    if batch is not None:
        # counted in the batch's own topic incarnation (see `other_incarnations`)
        not_by = _other_incarnations(pipeline, batch)
        rows = (
            publisher.rows_held(batch, TABLE, not_by),
            publisher.rows_held(batch, QUARANTINE, not_by),
        )
    for judged, check in (
        (judge_rows(name, batch, *rows), LAST_BATCH_COMPLETE),
        (judge_ratio(name, batch, config.alerts.max_quarantine_ratio), QUARANTINE_RATIO),
    ):
        if judged is None and batch is not None:
            log(f"{check}: batch {batch_key(batch)} has no record counts in the ledger")
        elif judged is not None:
            found.append(judged)
    if derived:
        found += derived_verdicts(pipeline, log)
    return [replace(v, text=resource.spell(as_launchpad(v.text, name))) for v in found]


def build_table_checks(config: PipelineConfig) -> dg.AssetChecksDefinition:
    name = config.pipeline
    specs = check_specs(config)

    @dg.multi_asset_check(
        name=f"{dagster_name(name)}_table_checks",
        specs=specs,
        description="The pipeline's table checks, run now (the checks sensor runs them too).",
        required_resource_keys={pipeline_key(name)},
    )
    def table_checks(context: dg.AssetCheckExecutionContext) -> Iterator[dg.AssetCheckResult]:
        found = verdicts(resource_in(context, name), context.log.warning, context.instance)
        yield from (v.result() for v in found)
        missing = sorted({s.name for s in specs} - {v.check for v in found})
        if missing:
            raise dg.Failure(f"could not evaluate {', '.join(missing)}: see the warnings above")

    return table_checks
