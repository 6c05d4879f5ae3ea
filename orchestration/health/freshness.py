"""The table's freshness check: how old the newest committed record is, by its Kafka
timestamp, against `alerts.max_staleness_seconds`.

Why beside the lag check: lag counts offsets, which say nothing about time; a pipeline
whose schedule stopped an hour ago on a quiet topic has a small lag and hour-old data. The
newest record's timestamp is observed by the stage in the job that reads the records
(jobs/stage/staging.py, `newest_record_ms` in the batch's metrics), so the check reads only
the ledger. Its age is measured against the ledger database's clock, like every age here
(invariant 17); the timestamp itself is the producer's (or the broker's, with
LogAppendTime), a clock exactly does not own.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import dagster as dg

from ledger.core.batch import Batch
from ledger.core.stuck import batch_key
from orchestration.assets import table_key
from orchestration.health.verdict import Verdict

FRESHNESS = "fresh_within_bound"


def judge_freshness(
    pipeline: str, newest: tuple[Batch, datetime] | None, now: datetime, bound: float | None
) -> Verdict:
    """Pure: the newest committed record's age against the bound (None: report only)."""
    asset = table_key(pipeline)
    if newest is None:
        return Verdict(FRESHNESS, asset, True, "no committed batch has observed a record yet", {})
    batch, at = newest
    age = (now - at).total_seconds()
    metadata: dict[str, Any] = {
        "staleness_seconds": round(age, 1),
        "newest_record_at": dg.MetadataValue.timestamp(at.timestamp()),
        "batch": dg.MetadataValue.text(batch_key(batch)),
    }
    what = (
        f"the newest committed record (batch {batch_key(batch)}) has Kafka timestamp "
        f"{at.isoformat(timespec='seconds')}, {age:.0f}s ago"
    )
    if bound is None:
        return Verdict(
            FRESHNESS, asset, True, f"{what} (no bound set: alerts.max_staleness_seconds)", metadata
        )
    metadata["max_staleness_seconds"] = bound
    if age <= bound:
        return Verdict(FRESHNESS, asset, True, f"{what}, within {bound:g}s", metadata)
    return Verdict(
        FRESHNESS,
        asset,
        False,
        f"{what}, over the bound of {bound:g}s: is the schedule on, are runs failing, is a "
        "batch stuck, or has the topic stopped receiving records?",
        metadata,
    )


def freshness_spec(pipeline: str, bound: float | None) -> dg.AssetCheckSpec:
    shown = "no bound set" if bound is None else f"{bound:g}s"
    return dg.AssetCheckSpec(
        FRESHNESS,
        asset=table_key(pipeline),
        description=(
            "The newest committed record's Kafka timestamp is at most "
            f"alerts.max_staleness_seconds old ({shown})"
        ),
    )
