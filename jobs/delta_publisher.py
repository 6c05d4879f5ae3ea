"""The protocol's publisher (ledger/two_phase.py `Publisher`): a pipeline's data table and its
quarantine table, published together, batch by batch, with delta-rs.

Every commit carries the batch's offsets in its metadata, so the data table's log alone can
rebuild a lost ledger (invariant 7).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jobs.stage import QUARANTINE, TABLE, attempt_folder
from ledger.batch import Batch, StagedFile
from ledger.two_phase import PublishResult
from resources.config import PipelineConfig
from resources.delta import DeltaTarget, TableStats, decode_schema


def commit_metadata(batch: Batch) -> dict[str, Any]:
    """What every commit carries so the Delta log alone can rebuild the ledger: with the
    ranges, the topic incarnation they were read from (invariant 10) and the operator
    decisions taken since the previous batch (invariant 15)."""
    return {
        "app_id": batch.app_id,
        "pipeline": batch.pipeline,
        "kind": batch.kind,
        "batch_id": batch.batch_id,
        "attempt": batch.attempt,
        "ranges": [r.as_dict() for r in batch.ranges],
        "params": batch.params,
        "topic_id": batch.topic_id,
        "decisions": [d.as_dict() for d in batch.decisions],
    }


class DeltaPublisher:
    """The data table and its quarantine table, published batch by batch."""

    def __init__(self, table: DeltaTarget, quarantine: DeltaTarget) -> None:
        self.table = table
        self.quarantine = quarantine

    @classmethod
    def for_config(cls, config: PipelineConfig) -> DeltaPublisher:
        """The pipeline's two tables, both opened with its storage options."""
        options = config.delta.storage_options
        return cls(
            DeltaTarget(config.delta.table_uri, options),
            DeltaTarget(config.delta.quarantine_uri, options),
        )

    def committed_version(self, app_id: str) -> int | None:
        return self.table.transaction_version(app_id)

    def committed_batches(self, app_id: str) -> list[dict[str, Any]]:
        return self.table.committed_batches(app_id)

    def rows_reach(self, topic: str) -> dict[int, int]:
        """Per partition, one past the highest offset of `topic` in either table's rows:
        where reading continues without a gap or a duplicate, when the log cannot say."""
        reach = self.table.offset_reach(topic)
        for partition, end in self.quarantine.offset_reach(topic).items():
            reach[partition] = max(end, reach.get(partition, end))
        return reach

    def table_stats(self, app_id: str) -> TableStats | None:
        """The data table's version, row count and `app_id`'s last batch, for operators."""
        return self.table.stats(app_id)

    def publish(self, batch: Batch, files: Sequence[StagedFile]) -> PublishResult:
        """Quarantine first, then the data table.

        The data table's log is what rebuilds a lost ledger (invariant 7); publishing the
        quarantine first means a batch found there has its quarantined records published
        too, so a rebuild never forgets them. A replace backfill removes the old rows of its
        ranges from both tables in the same commit that adds the new ones.
        """
        meta = commit_metadata(batch)
        replace = batch.params.get("mode") == "replace"
        by_target: dict[str, list[StagedFile]] = {TABLE: [], QUARANTINE: []}
        for f in files:
            by_target[f.target].append(f)
        outcome = None
        for target, delta in ((QUARANTINE, self.quarantine), (TABLE, self.table)):
            has_rows = any(f.records for f in by_target[target])
            if target == QUARANTINE and not has_rows and not (replace and delta.load()):
                continue
            common = {
                "app_id": batch.app_id,
                "batch_id": batch.batch_id,
                "files": by_target[target],
                "schema": decode_schema(batch.schemas[target]),
                "metadata": meta,
            }
            if replace:
                rewrites = attempt_folder(delta.uri, batch.app_id, batch.batch_id, batch.attempt)
                outcome = delta.replace(
                    **common, ranges=batch.ranges, rewrite_dir=f"{rewrites}-rewrites"
                )
            else:
                outcome = delta.publish(**common)
        assert outcome is not None
        return PublishResult(outcome.published, outcome.table_version)
