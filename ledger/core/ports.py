"""The ports: what the coordinator (ledger/coordinator/) needs of Kafka, Spark, Delta and
the ledger's database, as typing Protocols, and the values that cross them.

The edges implement these (jobs/sources/, jobs/stage/, jobs/publish/, ledger/store/); the
coordinator's tests drive fakes of them (tests/fixtures/fakes.py), pinned to the real
publisher by contract tests. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, TypeAlias, runtime_checkable

from ledger.core.batch import Batch, BatchKind, Owner, StagedFile
from ledger.core.decisions import Decision
from ledger.core.protocol import Available, BatchState, OffsetRange, Positions


@dataclass(frozen=True)
class StageOutput:
    """What one attempt wrote: the vote's input."""

    files: list[StagedFile]
    schemas: dict[str, str]
    records_read: int
    table_records: int
    quarantine_records: int
    seconds: dict[str, float] = field(default_factory=dict)
    #: the newest Kafka timestamp among the records read (epoch ms), None when not observed:
    #: what the freshness check measures (orchestration/health/freshness.py)
    newest_record_ms: int | None = None


@dataclass(frozen=True)
class PublishResult:
    published: bool
    table_version: int
    #: what the publisher wants kept in the batch's metrics (each derived output's
    #: MERGE: applied, version, rows), recorded with COMMITTED
    metrics: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NextBatch:
    """What `begin()` would plan now, worked out without planning it.

    A batch is due when `batch_id` is set (with its `ranges`). Otherwise `in_flight` is the
    batch that must be published first (one batch at a time; BLOCKS_PLANNING), or None when
    the topic holds nothing new (caught up).
    """

    batch_id: int | None
    ranges: tuple[OffsetRange, ...] = ()
    in_flight: Batch | None = None


class OffsetSource(Protocol):
    topic: str

    def available(self) -> Mapping[int, Available]:
        """Earliest and last stable offset of every partition, read now."""

    def topic_id(self) -> str:
        """Kafka's id of the topic's current incarnation (KIP-516), read now."""

    def ack(self, ranges: Sequence[OffsetRange]) -> None:
        """Move the consumer group to the ranges' ends (advisory)."""


class Stager(Protocol):
    def stage(self, batch: Batch) -> StageOutput:
        """Write the batch's output into folders unique to (batch id, attempt)."""


class Publisher(Protocol):
    def committed_version(self, app_id: str) -> int | None:
        """The newest batch id any output holds for `app_id`."""

    def publish(self, batch: Batch, files: Sequence[StagedFile]) -> PublishResult:
        """Publish exactly `files` with the app transaction (app id, batch id); idempotent
        per output: an output that already holds the batch gets nothing (invariant 12)."""

    def table_location(self) -> str:
        """Where the data table is, for messages."""

    def quarantine_location(self) -> str:
        """Where the quarantine table is, for messages."""

    def missing_quarantine(self) -> str | None:
        """The quarantine's location while no table is there; None once it exists."""

    def table_holds(self, batch: Batch) -> bool:
        """Whether the data table's app transaction of the batch's application id is at or
        past its id (the data table alone: it is published last)."""

    def committed_ranges(self, batch: Batch) -> list[OffsetRange] | None:
        """The ranges the data table's commit of the batch's application id and batch id
        carries; None when the table's log has no such commit (yet, or any more)."""

    def other_writers(self) -> dict[str, dict[str, Any]]:
        """Application ids other than the pipeline's with batches in its tables, each with
        `pipeline`, `batch_id` (its newest) and `topics` (every topic its batches read)."""

    def topics_in_rows(self, topics: Collection[str]) -> dict[str, set[str]]:
        """Which of `topics` the rows of the tables of records (the data table, the
        quarantine) hold, by location, whoever wrote them; tables holding none are left out."""

    def committed_batches(self, app_id: str) -> list[dict[str, Any]]:
        """Commit metadata of every batch of `app_id` still in any output's log, one entry
        per batch. An entry whose `complete` is False is held by some outputs and not by the
        last one published (a crash between the commits); missing means True."""

    def outputs_holding(self, batch: Batch) -> set[str]:
        """The outputs (StagedFile.target) whose app-transaction version for the batch's
        application id is at or past its batch id: they hold the batch already."""

    def file_size(self, target: str, path: str) -> int | None:
        """The size of a staged file of output `target` (path relative to the output's
        root) on storage now; None when it does not exist."""

    def rows_held(self, batch: Batch, target: str) -> int | None:
        """How many rows of output `target` have coordinates in the batch's ranges; None
        for an output whose rows are not the batch's records (a derived output's groups)."""

    def check_schemas(self, schemas: Mapping[str, str]) -> None:
        """Raise RefusedBatchError if a table cannot take its staged schema (invariant 14)."""

    def check_replace(self, batch: Batch, files: Sequence[StagedFile]) -> None:
        """Raise RefusedBatchError if `batch`, a replace, would delete a row whose record its
        `files` do not stage again (a record Kafka no longer holds); nothing otherwise."""

    def replace_refusals(self) -> list[str]:
        """Why the outputs as they are now cannot take a replace, one sentence each (a table
        whose change data feed a rewrite would misreport); empty when they can."""

    def rows_reach(self, topic: str) -> dict[int, int]:
        """Per partition, one past the highest offset of `topic` in the published rows: what
        the coordinator checks a rebuilt ledger's positions against."""


@dataclass(frozen=True)
class Incident:
    """Something operators must hear about. The coordinator has no sinks of its own: its
    `alert` hook delivers it (the pipeline's alert sinks, jobs/wiring/pipeline.py; or the log)."""

    kind: str
    title: str
    text: str
    details: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class TopicsSource(Protocol):
    """Kafka for a pipeline on several topics: the selection resolved now, each topic's id
    and offsets, and the advisory consumer-group commit of every topic's ends."""

    def topics(self) -> tuple[str, ...]:
        """The topics the pipeline reads now (a pattern resolved against Kafka's listing)."""

    def topic_id_of(self, topic: str) -> str:
        """Kafka's id of the topic's current incarnation (KIP-516), read now."""

    def available_of(self, topic: str) -> Mapping[int, Available]:
        """Earliest and last stable offset of every partition of `topic`, read now."""

    def exists(self, topic: str) -> bool:
        """Whether Kafka lists `topic` now (a retired topic may be deleted, or not)."""

    def ack(self, ranges: Sequence[OffsetRange]) -> None:
        """Move the consumer group to the ranges' ends, on every topic (advisory)."""


#: What `Ledger.plan` asks for the new batch's ranges: given the positions read under the
#: planning lock (per topic when the batch reads several), the ranges, or None to plan nothing.
RangesFor: TypeAlias = (
    Callable[[Positions], Iterable[OffsetRange] | None]
    | Callable[[Mapping[str, Positions]], Iterable[OffsetRange] | None]
)


class Ledger(Protocol):
    """The commit ledger as the coordinator uses it (ledger/store/ledger_store.py
    `LedgerStore`): every write fenced by the batch's (state, attempt) token, every
    timestamp the database's own (invariant 17)."""

    def now(self) -> datetime:
        """The ledger database's current time."""

    def get(self, app_id: str, batch_id: int) -> Batch | None:
        """One batch, as stored now."""

    def batches(
        self,
        *,
        app_id: str | None = None,
        pipeline: str | None = None,
        states: Iterable[BatchState] | None = None,
        limit: int | None = None,
    ) -> list[Batch]:
        """Batches, newest first."""

    def files(self, app_id: str, batch_id: int) -> list[StagedFile]:
        """The exact file list a batch voted (its PREPARED state)."""

    def decisions(
        self, *, app_id: str | None = None, pipeline: str | None = None
    ) -> list[Decision]:
        """Operator decisions, in the order they were taken."""

    def committed_rows_in(self, app_id: str, target: str) -> bool:
        """Whether a committed batch of `app_id` voted a file with records for `target`."""

    def last_batch_id(self, app_id: str) -> int | None:
        """The highest batch id in use for `app_id`."""

    def positions(self, app_id: str) -> Positions:
        """The next offset per partition, moved by the decisions taken since."""

    def positions_by_topic(self, app_id: str) -> dict[str, Positions]:
        """The same, per topic, for a pipeline on several topics."""

    def topic_ids_read(self, app_id: str) -> set[str]:
        """Every topic id a batch of `app_id` that was not abandoned was planned on."""

    def plan(
        self,
        *,
        pipeline: str,
        app_id: str,
        kind: BatchKind,
        ranges_for: RangesFor,
        owner: Owner | None = None,
        params: Mapping[str, Any] | None = None,
        batch_id: int | None = None,
        contiguous: bool = True,
        check: Callable[[Sequence[Batch]], None] | None = None,
        topic_id: str | None = None,
        topic_ids: Mapping[str, str] | None = None,
    ) -> Batch | None:
        """Plan the next batch in one transaction under the in-flight guard; None when
        `ranges_for` proposes nothing."""

    def record_decision(
        self,
        *,
        pipeline: str,
        app_id: str,
        decide: Callable[[Positions, int], Decision],
        floor_batch_id: int | None = None,
        topic: str | None = None,
    ) -> Decision:
        """Record an operator decision built on the positions read under the planning lock."""

    def transition(
        self,
        batch: Batch,
        target: BatchState,
        *,
        files: Iterable[StagedFile] = (),
        schemas: Mapping[str, str] | None = None,
        metrics: Mapping[str, Any] | None = None,
        error: str | None = None,
        table_version: int | None = None,
    ) -> Batch:
        """Move a batch along the protocol's state table, fenced by its token."""

    def restage(self, batch: Batch, *, reason: str, metrics: Mapping[str, Any]) -> Batch:
        """Send a PREPARED batch back to PLANNED with a new attempt (invariant 11)."""

    def takeover(self, batch: Batch, owner: Owner | None = None) -> Batch:
        """Start a new attempt on the batch; the old attempt's token stops working."""

    def heartbeat(self, batch: Batch) -> None:
        """Renew the attempt's lease."""

    def require_current(self, batch: Batch) -> None:
        """Raise FencedError unless the batch is still at the state and attempt it was read."""

    def record_metrics(self, batch: Batch, metrics: Mapping[str, Any]) -> Batch:
        """Merge metrics without changing state; fenced."""

    def insert_committed(
        self,
        *,
        pipeline: str,
        app_id: str,
        kind: BatchKind,
        batch_id: int,
        ranges: Iterable[OffsetRange],
        table_version: int | None,
        committed_at: datetime | None = None,
        params: Mapping[str, Any] | None = None,
        topic_id: str | None = None,
        decisions: Iterable[Decision] = (),
    ) -> bool:
        """Re-create a COMMITTED batch found in a Delta log (ledger rebuild). Idempotent."""

    def insert_unfinished(
        self,
        *,
        pipeline: str,
        app_id: str,
        kind: BatchKind,
        batch_id: int,
        ranges: Iterable[OffsetRange],
        params: Mapping[str, Any] | None,
        reason: str,
        metrics: Mapping[str, Any],
        topic_id: str | None = None,
        decisions: Iterable[Decision] = (),
    ) -> bool:
        """Re-create a batch some outputs hold and others not (ledger rebuild). Idempotent."""

    def insert_decision(self, decision: Decision) -> bool:
        """Re-create a decision found in a Delta log's commit metadata. Idempotent."""
