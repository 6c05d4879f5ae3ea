"""The protocol's publisher (ledger/two_phase.py `Publisher`): a pipeline's data table and its
quarantine table, published together, batch by batch, with delta-rs.

Every commit carries the batch's offsets in its metadata, so the two tables' logs can
rebuild a lost ledger (invariant 7); each table is idempotent on its own by its application
transaction version, and a batch found in the quarantine's log but not the data table's (a
crash between the two commits) is reported unfinished, never forgotten (invariant 12).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import pyarrow.compute as pc

from jobs.stage import QUARANTINE, TABLE, attempt_folder
from ledger.batch import Batch, StagedFile
from ledger.crash import crashpoint
from ledger.two_phase import PublishResult
from resources import storage
from resources.config import PipelineConfig
from resources.delta import Compaction, DeltaTarget, TableLayout, TableStats, decode_schema


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
        options = config.delta.resolved_storage_options()
        return cls(
            DeltaTarget(config.delta.table_uri, options),
            DeltaTarget(config.delta.quarantine_uri, options),
        )

    def _outputs(self) -> tuple[tuple[str, DeltaTarget], ...]:
        """Both tables, in the order a batch is published to them."""
        return ((QUARANTINE, self.quarantine), (TABLE, self.table))

    def committed_version(self, app_id: str) -> int | None:
        """The newest batch id either table holds for `app_id` (invariant 12)."""
        versions = [d.transaction_version(app_id) for _t, d in self._outputs()]
        return max((v for v in versions if v is not None), default=None)

    def committed_batches(self, app_id: str) -> list[dict[str, Any]]:
        """Every batch of `app_id` in either table's log, oldest first, one entry each.

        `outputs` names the tables whose log has the batch; `complete` is whether the data
        table, published last, holds it (its version is at or past the batch id; the
        version, not the log, decides, so a data-table log cleaned up by retention still
        counts). An incomplete batch was committed to the quarantine only (invariant 12).
        `table_version` is the data table's version of the commit, when it has one.
        """
        merged: dict[int, dict[str, Any]] = {}
        for target, delta in self._outputs():
            for entry in delta.committed_batches(app_id):
                found = merged.setdefault(entry["batch_id"], {**entry, "outputs": []})
                found["outputs"].append(target)
                if target == TABLE:
                    found["table_version"] = entry.get("table_version")
                else:
                    found["table_version"] = None
        table_version = self.table.transaction_version(app_id)
        for entry in merged.values():
            entry["complete"] = table_version is not None and entry["batch_id"] <= table_version
        return [merged[b] for b in sorted(merged)]

    def outputs_holding(self, batch: Batch) -> set[str]:
        """The tables whose app-transaction version for the batch's app id is at or past
        its id: they already hold the batch, and the commit leaves them alone."""
        return {
            target
            for target, delta in self._outputs()
            if (v := delta.transaction_version(batch.app_id)) is not None and v >= batch.batch_id
        }

    def rows_held(self, batch: Batch, target: str, not_by: Collection[int] = ()) -> int:
        """Rows of the table `target` whose coordinates fall in the batch's ranges, leaving
        out rows written by the batches `not_by` (their `_batch_id`).

        Files are pruned by partition and offset only. A topic name longer than the
        statistics keep (resources/delta.py) has no min/max, and delta-rs 1.6 then prunes
        every file on a topic filter (it compares with null), so the topic is matched on
        the rows read.
        """
        table = dict(self._outputs())[target].load()
        if table is None:
            return 0
        dataset = table.to_pyarrow_dataset()
        held = 0
        for topic in sorted({r.topic for r in batch.ranges if r.span}):
            wanted = None
            for r in batch.ranges:
                if r.span and r.topic == topic:
                    one = (
                        (pc.field("_kafka_partition") == r.partition)
                        & (pc.field("_kafka_offset") >= r.start)
                        & (pc.field("_kafka_offset") < r.end)
                    )
                    wanted = one if wanted is None else wanted | one
            if not_by and wanted is not None:
                wanted = wanted & ~pc.field("_batch_id").isin(sorted(not_by))
            rows = dataset.to_table(columns=["_kafka_topic"], filter=wanted)
            held += pc.sum(pc.equal(rows["_kafka_topic"], topic).cast("int64")).as_py() or 0
        return held

    def file_size(self, target: str, path: str) -> int | None:
        """A staged file's size now (None if gone); `path` is relative to its table's root."""
        root = dict(self._outputs())[target].uri
        return storage.file_size(storage.join(root, path))

    def check_schemas(self, schemas: Mapping[str, str]) -> None:
        """Refuse, before the vote, staged schemas either table cannot take (invariant 14).

        Both tables are checked on every batch, also a quarantine this batch leaves empty:
        a transform's incompatible quarantine schema then fails at once, not on the first
        batch that happens to hold a bad record. A table not created yet takes any schema.
        """
        for target, delta in ((QUARANTINE, self.quarantine), (TABLE, self.table)):
            if target in schemas:
                delta.check_schema(decode_schema(schemas[target]))

    def rows_reach(self, topic: str) -> dict[int, int]:
        """Per partition, one past the highest offset of `topic` in either table's rows:
        where reading continues without a gap or a duplicate, when the log cannot say."""
        reach = self.table.offset_reach(topic)
        for partition, end in self.quarantine.offset_reach(topic).items():
            reach[partition] = max(end, reach.get(partition, end))
        return reach

    def compact(self) -> dict[str, Compaction | None]:
        """Compact both tables (resources/delta.py `DeltaTarget.compact`), by target."""
        return {target: delta.compact() for target, delta in self._outputs()}

    def layouts(self) -> dict[str, TableLayout | None]:
        """Both tables' file count and bytes, by target."""
        return {target: delta.layout() for target, delta in self._outputs()}

    def table_stats(self, app_id: str, version: int | None = None) -> TableStats | None:
        """The data table's version, row count and `app_id`'s last batch, for operators, as
        of `version` (default: the latest)."""
        return self.table.stats(app_id, version)

    def quarantine_stats(self, app_id: str) -> TableStats | None:
        """The quarantine table's version, row count and `app_id`'s last batch: the
        quarantine is an asset of its own in the UI, with its own history."""
        return self.quarantine.stats(app_id)

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
        for target, delta in self._outputs():
            if target == TABLE:
                crashpoint("between_table_commits")
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
                rewrites = attempt_folder(
                    delta.uri, batch.app_id, batch.batch_id, batch.attempt, batch.token
                )
                outcome = delta.replace(
                    **common, ranges=batch.ranges, rewrite_dir=f"{rewrites}-rewrites"
                )
            else:
                outcome = delta.publish(**common)
        assert outcome is not None
        return PublishResult(outcome.published, outcome.table_version)
