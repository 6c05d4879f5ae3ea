"""The micro-batch job for one pipeline config: the protocol core wired to its edges.

`build(config)` gives a `TwoPhaseCommit` whose offset source is Kafka, whose stager is the
Spark stage job and whose publisher is the pair of Delta tables (data and quarantine). The
CLI and the Dagster ops both go through here, so they run the same code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jobs.stage import QUARANTINE, TABLE, attempt_folder, stage
from ledger.backfill import BACKFILL, backfill_app_id
from ledger.protocol import Available, OffsetRange
from ledger.store import Batch, LedgerStore, StagedFile
from ledger.two_phase import PublishResult, StageOutput, TwoPhaseCommit
from resources.config import PipelineConfig
from resources.delta import DeltaTarget, decode_schema
from resources.kafka import KafkaClient
from resources.spark import build_session


class KafkaOffsetSource:
    """Offsets as Kafka reports them, and the advisory consumer-group commit."""

    def __init__(self, client: KafkaClient, topic: str, group_id: str) -> None:
        self.client = client
        self.topic = topic
        self.group_id = group_id

    def available(self) -> dict[int, Available]:
        parts = self.client.partitions(self.topic)
        return {
            p: Available(o.earliest, o.last_stable)
            for p, o in self.client.offsets(self.topic, parts).items()
        }

    def ack(self, ranges: Sequence[OffsetRange]) -> None:
        self.client.commit_group_offsets(
            self.group_id, self.topic, {r.partition: r.end for r in ranges}
        )


class SparkStager:
    """Runs jobs/stage.py for a batch, in a Spark session created on first use."""

    def __init__(
        self, config: PipelineConfig, spark_factory: Callable[[], Any], *, single_pass: bool = True
    ) -> None:
        self.config = config
        self.spark_factory = spark_factory
        self.transform = config.load_transform()
        #: False runs the former two-pass stage plan, kept for `exactly bench` to compare
        self.single_pass = single_pass

    def stage(self, batch: Batch) -> StageOutput:
        roots = {TABLE: self.config.delta.table_uri, QUARANTINE: self.config.delta.quarantine_uri}
        return stage(
            self.spark_factory(),
            bootstrap_servers=self.config.kafka.bootstrap_servers,
            kafka_options=self.config.kafka.options,
            ranges=batch.ranges,
            batch_id=batch.batch_id,
            attempt_dirs={
                t: attempt_folder(root, batch.app_id, batch.batch_id, batch.attempt)
                for t, root in roots.items()
            },
            table_roots=roots,
            transform=self.transform,
            transform_name=self.config.transform,
            single_pass=self.single_pass,
        )


def commit_metadata(batch: Batch) -> dict[str, Any]:
    """What every commit carries so the Delta log alone can rebuild the ledger."""
    return {
        "app_id": batch.app_id,
        "pipeline": batch.pipeline,
        "kind": batch.kind,
        "batch_id": batch.batch_id,
        "attempt": batch.attempt,
        "ranges": [r.as_dict() for r in batch.ranges],
        "params": batch.params,
    }


class DeltaPublisher:
    """The data table and its quarantine table, published batch by batch."""

    def __init__(self, table: DeltaTarget, quarantine: DeltaTarget) -> None:
        self.table = table
        self.quarantine = quarantine

    def committed_version(self, app_id: str) -> int | None:
        return self.table.transaction_version(app_id)

    def committed_batches(self, app_id: str) -> list[dict[str, Any]]:
        return self.table.committed_batches(app_id)

    def check_schemas(self, schemas: Mapping[str, str]) -> None:
        """Refuse, before the vote, staged schemas either table cannot take (invariant 14).

        Both tables are checked on every batch, also a quarantine this batch leaves empty:
        a transform's incompatible quarantine schema then fails at once, not on the first
        batch that happens to hold a bad record. A table not created yet takes any schema.
        """
        for target, delta in ((QUARANTINE, self.quarantine), (TABLE, self.table)):
            if target in schemas:
                delta.check_schema(decode_schema(schemas[target]))

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


class SharedSpark:
    """One Spark session per process, created only when a batch needs staging."""

    def __init__(self, master: str, conf: Mapping[str, str]) -> None:
        self.master = master
        self.conf = dict(conf)
        self._session: Any = None

    def __call__(self) -> Any:
        if self._session is None:
            self._session = build_session(self.master, self.conf)
        return self._session


def build_backfill(
    config: PipelineConfig,
    *,
    transform: str | None = None,
    store: LedgerStore | None = None,
    spark_factory: Callable[[], Any] | None = None,
    log: Callable[[str], None] = lambda _m: None,
) -> TwoPhaseCommit:
    """The coordinator of the pipeline's backfills: same edges, its own application id,
    and optionally another transform (a fixed one, for a replace)."""
    if transform is not None:
        config = config.model_copy(update={"transform": transform})
        config.load_transform()
    return build(
        config,
        store=store,
        spark_factory=spark_factory,
        log=log,
        app_id=backfill_app_id(config.pipeline),
        kind=BACKFILL,
    )


def build(
    config: PipelineConfig,
    *,
    store: LedgerStore | None = None,
    spark_factory: Callable[[], Any] | None = None,
    log: Callable[[str], None] = lambda _m: None,
    app_id: str | None = None,
    kind: str = "live",
) -> TwoPhaseCommit:
    client = KafkaClient(config.kafka.bootstrap_servers, config.kafka.options)
    storage_options = config.delta.storage_options
    return TwoPhaseCommit(
        store or LedgerStore(config.ledger.url),
        pipeline=config.pipeline,
        app_id=app_id or config.app_id,
        kind=kind,
        source=KafkaOffsetSource(client, config.kafka.topic, config.group_id),
        stager=SparkStager(
            config, spark_factory or SharedSpark(config.spark.master, config.spark.conf)
        ),
        publisher=DeltaPublisher(
            DeltaTarget(config.delta.table_uri, storage_options),
            DeltaTarget(config.delta.quarantine_uri, storage_options),
        ),
        max_records_per_partition=config.batch.max_records_per_partition,
        lease_seconds=config.batch.lease_seconds,
        starting_offsets=config.kafka.starting_offsets,
        log=log,
    )
