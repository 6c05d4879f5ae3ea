"""One pipeline config's coordinators, wired to the edges they share.

A `Pipeline` opens each edge once (the ledger store, the Kafka client, the Spark session, the
pair of Delta tables) and holds the coordinators that run on them: the live one, and one per
backfill transform. `close()` disposes of what it opened. The CLI opens one per command and
the Dagster code location one per process (orchestration/resources.py), so both run the same
code. `build` and `build_backfill` hand out a single coordinator for short-lived callers.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from functools import cached_property
from types import TracebackType
from typing import Any

import pyarrow as pa

from jobs.derived.postgres_rebuild import rebuild_postgres
from jobs.derived.rebuild import Rebuilt, rebuild_output, rebuilt_text
from jobs.publish.delta_publisher import DeltaPublisher
from jobs.sources.topics_source import offset_source_for
from jobs.stage.spark_stager import SharedSpark, SparkStager
from jobs.stage.staged_partials import aggregate_arrow_schema
from ledger.coordinator.backfill import plan_backfill
from ledger.coordinator.decisions import record_decision
from ledger.coordinator.release import release
from ledger.coordinator.two_phase import TwoPhaseCommit
from ledger.core.actions import ActionKind, OperatorAction, recovered_text
from ledger.core.backfill import BackfillMode, backfill_app_id
from ledger.core.batch import Batch, BatchKind
from ledger.core.decisions import Decision, DecisionKind, Request
from ledger.core.errors import DecisionError, InconsistencyError
from ledger.core.ports import Incident
from ledger.core.protocol import PUBLISHED
from ledger.store.ledger_store import LedgerStore
from resources.config.derived_spec import AggregateOutput, UpsertOutput
from resources.config.pipeline_config import PipelineConfig
from resources.delta.table import Compaction, DeltaTarget
from resources.kafka.client import KafkaClient
from resources.object_storage import storage
from resources.postgres.target import PostgresTarget, refuse_one_table_twice
from resources.spark.progress import ProgressSink


def _quiet(_message: str) -> None:
    pass


class Pipeline:
    """The live and backfill coordinators of one pipeline config, on shared edges."""

    def __init__(
        self,
        config: PipelineConfig,
        *,
        spark_factory: Callable[[], Any] | None = None,
        log: Callable[[str], None] = _quiet,
        progress: ProgressSink | None = None,
    ) -> None:
        self.config = config
        self.log = log
        self.progress = progress
        # a bucket that is missing or refuses us fails here, not after a batch was staged
        storage.check_buckets([config.delta.table_uri, config.delta.quarantine_uri])
        self.store = LedgerStore(config.ledger.url)
        self.kafka = KafkaClient(
            config.kafka.bootstrap_servers,
            config.kafka.resolved_options(),
            timeout=config.kafka.timeout_seconds,
        )
        self.source = offset_source_for(self.kafka, config.kafka, config.group_id)
        self.publisher = DeltaPublisher.for_config(config)
        # a PostgreSQL output's server that refuses us or does not answer fails here too
        for output in self.publisher.postgres.values():
            output.check_reachable()
        # and two of them on one table, under two spellings of it or of its server
        refuse_one_table_twice(self.publisher.postgres.values())
        self.spark = spark_factory or SharedSpark.for_config(config)
        self._backfills: dict[str, TwoPhaseCommit] = {}
        self._lock = threading.Lock()

    @cached_property
    def live(self) -> TwoPhaseCommit:
        """The coordinator of the live batches (built on first use, loading the transform)."""
        return self._coordinator(self.config, self.config.app_id, BatchKind.LIVE)

    def backfill(self, transform: str | None = None) -> TwoPhaseCommit:
        """The coordinator of the pipeline's backfills through `transform` (default: the
        pipeline's), built on first use.

        Backfills have an application id of their own, so their Delta transaction versions
        never collide with the live pipeline's.
        """
        spec = transform or self.config.transform
        with self._lock:
            if spec not in self._backfills:
                config = self.config.model_copy(update={"transform": spec})
                app_id = backfill_app_id(self.config.pipeline)
                self._backfills[spec] = self._coordinator(config, app_id, BatchKind.BACKFILL)
            return self._backfills[spec]

    def coordinator_for(self, batch: Batch) -> TwoPhaseCommit:
        """The coordinator that owns `batch`, so live batches and reprocessing (replace
        backfill) batches can flow through the same steps."""
        if batch.kind == BatchKind.BACKFILL:
            return self.backfill(batch.params.get("transform"))
        return self.live

    def decide(self, request: Request) -> Decision:
        """Record an operator's decision (ledger/core/decisions.py) on the live positions,
        as `exactly skip` and the `<pipeline>_decide` job both ask. A new-topic decision is
        refused while an upsert output's table holds the old topic's rows, so it is told
        which of them exist."""
        if request.kind is DecisionKind.NEW_TOPIC:
            upserts = tuple(
                spec.name
                for spec, delta in getattr(self.live.publisher, "derived", ())
                if isinstance(spec, UpsertOutput) and delta.load() is not None
            )
            request = dataclasses.replace(request, upsert_outputs=upserts)
        return record_decision(self.live, request, self.live.store.now())

    def abandon(self, batch_id: int, *, backfill: bool, who: str, reason: str) -> Batch:
        """Release a batch its hung owner holds (ledger/coordinator/release.py): abandoned if
        it never voted, finished now if it did; its attempt fenced either way. As
        `exactly abandon` and the `<pipeline>_abandon` job both ask."""
        return release(self.backfill() if backfill else self.live, batch_id, who, reason)

    def rebuild_derived(
        self, name: str, *, empty: bool = False, who: str = "", reason: str = ""
    ) -> Rebuilt:
        """Build derived output `name` from the raw table (jobs/derived/rebuild.py for a
        Delta output, jobs/derived/postgres_rebuild.py for a PostgreSQL one), as `exactly
        derived rebuild` and the `<pipeline>_rebuild` job both ask. Every refusal (an
        unknown name, an output that holds batches or rows, no raw table yet, an upsert
        over two incarnations of a topic) is the operator's request refused:
        DecisionError, nothing written. `who` and `reason` are kept with the rebuilt
        output (its Delta commit, its state rows) and in the ledger."""
        delta = {spec.name: (spec, delta) for spec, delta in self.publisher.derived}
        postgres = {pg.spec.name: pg for pg in self.publisher.postgres.values()}
        if name not in delta and name not in postgres:
            known = ", ".join(sorted([*delta, *postgres])) or "none"
            raise DecisionError(
                f"derived output {name!r} is not in pipeline {self.config.pipeline}'s config "
                f"(its derived outputs: {known})"
            )
        decided = {"decided_by": who, "reason": reason}
        try:
            if name in postgres:
                done = self._rebuild_postgres(postgres[name], empty, decided)
            else:
                done = self._rebuild_delta(*delta[name], empty, decided)
        except InconsistencyError as exc:
            raise DecisionError(str(exc)) from exc
        self.store.record_action(
            pipeline=self.config.pipeline,
            kind=ActionKind.REBUILD,
            subject=name,
            decided_by=who,
            reason=reason,
            outcome=rebuilt_text(done),
        )
        return done

    def _rebuild_delta(
        self,
        spec: AggregateOutput | UpsertOutput,
        delta: DeltaTarget,
        empty: bool,
        decided: Mapping[str, str],
    ) -> Rebuilt:
        topic_id_now = None
        if isinstance(spec, UpsertOutput) and not empty:
            # a full upsert rebuild must know each topic's incarnation now, for every topic
            # the raw table holds rows of, read or not (jobs/derived/rebuild.py)
            listed = set(self.kafka.topic_names())

            def topic_id_now(topic: str) -> str | None:
                return self.kafka.topic_id(topic) if topic in listed else None

        return rebuild_output(
            spec,
            delta,
            self.publisher.table,
            self.publisher.app_ids,
            topic_id_now=topic_id_now,
            empty=empty,
            decided=decided,
        )

    def _rebuild_postgres(
        self, pg: PostgresTarget, empty: bool, decided: Mapping[str, str]
    ) -> Rebuilt:
        """The PostgreSQL rebuild, its rows typed by Spark's analysis of the stage's partial
        over the raw table's schema (no job runs; the session is the pipeline's own)."""

        def partial_schema(rows: pa.Schema) -> pa.Schema:
            return aggregate_arrow_schema(self.spark(), pg.spec, rows)

        return rebuild_postgres(
            pg,
            self.publisher.table,
            self.publisher.app_ids,
            partial_schema,
            empty=empty,
            decided=decided,
        )

    def recover_asked(self, *, who: str, reason: str) -> tuple[list[Batch], OperatorAction]:
        """`recover`, asked for by an operator (`exactly recover`, the `<pipeline>_recover`
        job): journaled in the ledger with who, why and what it did (ledger/core/actions.py).
        A refusal (a batch whose owner may be alive) is not journaled: nothing was done."""
        done = self.recover()
        return done, self.store.record_action(
            pipeline=self.config.pipeline,
            kind=ActionKind.RECOVER,
            subject="",
            decided_by=who,
            reason=reason,
            outcome=recovered_text(done),
        )

    def recover(self, planning: BatchKind = BatchKind.LIVE) -> list[Batch]:
        """Finish every voted batch of the pipeline, live and backfill alike, and abandon
        every dead one that did not vote; the batches finished or abandoned. Every start
        calls this before it plans (invariant 5): `exactly run`, `recover` and `backfill`,
        the Dagster ops. Each application id rebuilds its own batches from the outputs'
        logs first, so a lost ledger is rebuilt for both (invariants 7 and 12).

        Order: the application id the caller does not plan on first, without waiting for
        batches whose owner may be alive (a live run does not wait for a backfill running
        beside it, nor a backfill for the live run); the one it plans on last, waiting
        (BusyError). Any order keeps the invariants, because the two never
        publish the same rows: a live batch takes offsets past the live positions, a fill
        only offsets before the live start or skipped, a replace only offsets a committed
        batch holds, and each output applies a batch once by its own application
        transaction. Finishing the other application id first means a start that must wait
        for its own still finishes what a dead backfill left (docs/protocol.md).
        """
        live, backfills = self.live, self.backfill()
        first, last = (backfills, live) if planning is BatchKind.LIVE else (live, backfills)
        finished = first.recover_and_commit(wait=False)
        return [*finished, *last.recover_and_commit()]

    def recover_backfills(self) -> list[Batch]:
        """Finish the voted backfill batches whose owner is gone, abandon the dead ones that
        did not vote: what `recover` does for the backfills' application id, for a
        continuous run to do between its batches (jobs/wiring/continuous.py `sweep`)."""
        return self.backfill().recover_and_commit(wait=False)

    def compact_piled(self) -> dict[str, Compaction | None]:
        """Compact the table and the quarantine where more files than the config's
        `compact.when_files_over` have piled up (none when it is unset), by target: what a
        continuous run does between its batches, so its commits do not grow slower with
        the files every batch adds. Safe beside commits (resources/delta/compaction.py)."""
        limit = self.config.compact.when_files_over
        if limit is None:
            return {}
        layouts = self.publisher.layouts().items()
        piled = [target for target, layout in layouts if layout and layout.files > limit]
        return {target: self.publisher.compact_one(target) for target in piled}

    def reprocess(self, batch: Batch) -> Batch | None:
        """Plan a replace backfill of a committed batch's offsets through the pipeline's
        transform as the config names it now; None if the batch read nothing.

        The same offsets replaced in one Delta commit, not appended again: how a transform
        fix reaches data that is already published.
        """
        ranges = [r for r in batch.ranges if r.span]
        if not ranges:
            return None
        replacement, _ = plan_backfill(
            self.backfill(),
            live_app_id=self.config.app_id,
            mode=BackfillMode.REPLACE,
            ranges=ranges,
            transform=self.config.transform,
            again=True,
            replace_refusals=self.config.replace_refusals(),
        )
        return replacement

    def close(self) -> None:
        """Dispose of the ledger's engine, the PostgreSQL outputs' and the Kafka client. The
        Spark session belongs to the process (one per process) and outlives the pipeline."""
        self.store.dispose()
        for output in self.publisher.postgres.values():
            output.dispose()
        self.kafka.close()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _coordinator(self, config: PipelineConfig, app_id: str, kind: BatchKind) -> TwoPhaseCommit:
        return TwoPhaseCommit(
            self.store,
            pipeline=config.pipeline,
            app_id=app_id,
            kind=kind,
            source=self.source,
            stager=SparkStager(config, self.spark, self.progress),
            publisher=self.publisher,
            max_records_per_partition=config.batch.max_records_per_partition,
            lease_seconds=config.batch.lease_seconds,
            ack_retry_seconds=config.batch.ack_retry_seconds,
            starting_offsets=config.kafka.starting_offsets,
            log=self.log,
            alert=self.alert,
        )

    def alert(self, incident: Incident) -> None:
        """Send a coordinator's incident (a vote that lost files, ...) to the pipeline's
        alert sinks (config `alerts`: the log, and a webhook or Slack when configured), so
        the CLI and Dagster runs both tell someone. A sink that fails is logged; the
        batch goes on."""
        from resources.alerts.webhook import Alert, AlertsResource  # dagster: only when alerting

        settings = self.config.alerts
        sinks = AlertsResource(
            webhook_url_env=settings.webhook_url_env,
            slack_token_env=settings.slack_token_env,
            slack_channel=settings.slack_channel,
            slack_api_url=settings.slack_api_url,
        )
        alert = Alert(
            incident.kind, self.config.pipeline, incident.title, incident.text, incident.details
        )
        sinks.send(alert, self.log)


def build(
    config: PipelineConfig,
    *,
    spark_factory: Callable[[], Any] | None = None,
    log: Callable[[str], None] = _quiet,
) -> TwoPhaseCommit:
    """The live coordinator of a Pipeline nobody closes: for a caller that uses it until its
    process ends (tests, the benchmark)."""
    return Pipeline(config, spark_factory=spark_factory, log=log).live


def build_backfill(
    config: PipelineConfig,
    *,
    transform: str | None = None,
    spark_factory: Callable[[], Any] | None = None,
    log: Callable[[str], None] = _quiet,
) -> TwoPhaseCommit:
    """The backfill coordinator (through `transform`, default the pipeline's) of a Pipeline
    nobody closes, as `build`."""
    return Pipeline(config, spark_factory=spark_factory, log=log).backfill(transform)


def last_committed(pipeline: Pipeline) -> Batch | None:
    """The batch, live or backfill, committed most recently (by the database's clock)."""
    config = pipeline.config
    newest = [
        found[0]
        for app_id in (config.app_id, backfill_app_id(config.pipeline))
        if (found := pipeline.store.batches(app_id=app_id, states=PUBLISHED, limit=1))
    ]
    never = datetime.min.replace(tzinfo=UTC)
    return max(newest, key=lambda b: b.committed_at or never, default=None)


def newest_record(pipeline: Pipeline, recent: int = 20) -> tuple[Batch, datetime] | None:
    """The published batch, live or backfill, holding the newest record read, and that
    record's Kafka timestamp; None when none of the `recent` newest batches of each observed
    one (nothing committed yet, only empty batches, or batches rebuilt from a Delta log).
    The stage observes it (`newest_record_ms`, jobs/stage/staging.py)."""
    config = pipeline.config
    found = [
        (b, int(b.metrics["newest_record_ms"]))
        for app_id in (config.app_id, backfill_app_id(config.pipeline))
        for b in pipeline.store.batches(app_id=app_id, states=PUBLISHED, limit=recent)
        if b.metrics.get("newest_record_ms") is not None
    ]
    if not found:
        return None
    batch, ms = max(found, key=lambda bm: bm[1])
    return batch, datetime.fromtimestamp(ms / 1000, tz=UTC)
