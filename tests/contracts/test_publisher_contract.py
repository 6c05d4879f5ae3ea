"""The publisher's contract (ledger/core/ports.py `Publisher`), pinned on the fake and the real.

The coordinator's tests run against `FakePublisher` (tests/fixtures/fakes.py); what they
prove holds for the product only as far as the fake behaves like `DeltaPublisher`
(jobs/publish/delta_publisher.py). So every test here runs twice: on the fake, and on the real
publisher over two local Delta tables (delta-rs, Parquet files written by pyarrow: no JVM).
A behaviour the coordinator relies on that the two do not share fails here, on the side
that drifted.

What the coordinator relies on, and the protocol's word for it (docs/protocol.md):
- `publish` is idempotent per output by its app-transaction version (invariants 2, 12);
- `committed_version` / `committed_batches` rebuild a lost ledger from every output's log,
  an output that holds a batch the data table lacks reported unfinished (invariants 7, 12);
- `outputs_holding` and `rows_held` decide what a re-drive checks and publishes
  (invariants 11, 12);
- `file_size` is the vote's check on storage (invariant 11);
- `check_schemas` refuses an incompatible schema before the vote (invariant 14);
- `rows_reach` is the resume-at hint when the log is gone (invariant 15).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from jobs.publish.delta_publisher import DeltaPublisher
from jobs.stage.staging import QUARANTINE, TABLE, attempt_folder, parquet_files
from ledger.core.batch import Batch, BatchKind, StagedFile
from ledger.core.errors import RefusedBatchError
from ledger.core.layout import derived_target
from ledger.core.protocol import BatchState, OffsetRange
from ledger.host.process import this_owner
from resources.delta.schema import encode_schema
from resources.delta.table import DeltaTarget
from tests.fixtures.batches import a_batch
from tests.fixtures.fakes import FakePublisher

APP = "pageviews"
TOPIC = "pageviews"
SCHEMA = pa.schema(
    [
        ("_kafka_topic", pa.string()),
        ("_kafka_partition", pa.int32()),
        ("_kafka_offset", pa.int64()),
        ("value", pa.binary()),
    ]
)
SCHEMAS = {TABLE: encode_schema(SCHEMA), QUARANTINE: encode_schema(SCHEMA)}
#: batch 1 reads partition 0 [0, 10) and partition 1 [0, 5); batch 2 partition 0 [10, 14)
R1 = (OffsetRange(TOPIC, 0, 0, 10), OffsetRange(TOPIC, 1, 0, 5))
R2 = (OffsetRange(TOPIC, 0, 10, 14),)


def batch(batch_id: int, ranges: Sequence[OffsetRange], **fields: Any) -> Batch:
    """A PREPARED batch of APP as the coordinator hands it to `publish`."""
    fields.setdefault("token", f"tok{batch_id}")
    fields.setdefault("app_id", APP)
    return a_batch(
        batch_id,
        BatchState.PREPARED,
        owner=this_owner(),
        ranges=tuple(ranges),
        schemas=dict(SCHEMAS),
        topic_id="topic-id-1",
        topic_ids={TOPIC: "topic-id-1"},
        **fields,
    )


class Edge(Protocol):
    """A publisher under contract, and what the test needs around it: the stager's storage
    (to stage files onto, and to lose one from) and a crash between two outputs' commits."""

    publisher: Any

    def stage(self, b: Batch, target: str, rows: Mapping[int, Sequence[int]]) -> list[StagedFile]:
        """Stage for output `target` of `b` one file per partition holding these offsets."""

    def lose(self, f: StagedFile) -> None:
        """Delete a staged file from storage."""

    def publish_only(self, target: str, b: Batch, files: Sequence[StagedFile]) -> None:
        """Commit `b` to output `target` alone: the process died before the next output."""

    def expire_log(self) -> None:
        """Log retention: every output's log loses the commit info of every batch so far."""


class FakeEdge:
    """The fake publisher over the fake stager's storage (path -> size)."""

    def __init__(self) -> None:
        self.disk: dict[str, int] = {}
        self.publisher = FakePublisher(disk=self.disk)

    def stage(self, b: Batch, target: str, rows: Mapping[int, Sequence[int]]) -> list[StagedFile]:
        folder = f"staging-{target}/{b.app_id}/batch={b.batch_id}/attempt={b.attempt}-{b.token}"
        files = [
            StagedFile(target, f"{folder}/part-{p}.parquet", 100 + len(o), len(o), 0, "{}")
            for p, o in rows.items()
            if o
        ]
        self.disk.update({f.path: f.size for f in files})
        return files

    def lose(self, f: StagedFile) -> None:
        del self.disk[f.path]

    def publish_only(self, target: str, b: Batch, files: Sequence[StagedFile]) -> None:
        self.publisher.publish_only(target, b, files)

    def expire_log(self) -> None:
        self.publisher.drop_metadata_of = set(self.publisher.published_ids())


class DeltaEdge:
    """The real publisher: the data table and the quarantine as local Delta tables."""

    def __init__(self, root: Path) -> None:
        self.roots = {TABLE: str(root / "table"), QUARANTINE: str(root / "quarantine")}
        self.publisher = DeltaPublisher(
            DeltaTarget(self.roots[TABLE]), DeltaTarget(self.roots[QUARANTINE]), app_ids=(APP,)
        )

    def stage(self, b: Batch, target: str, rows: Mapping[int, Sequence[int]]) -> list[StagedFile]:
        root = self.roots[target]
        folder = attempt_folder(root, b.app_id, b.batch_id, b.attempt, b.token)
        Path(folder).mkdir(parents=True, exist_ok=True)
        for p, offsets in rows.items():
            if offsets:
                data = pa.table(
                    {
                        "_kafka_topic": [TOPIC] * len(offsets),
                        "_kafka_partition": [p] * len(offsets),
                        "_kafka_offset": list(offsets),
                        "value": [b"v"] * len(offsets),
                    },
                    schema=SCHEMA,
                )
                pq.write_table(data, f"{folder}/part-{p}.parquet")
        return parquet_files.describe(folder, root, target)

    def lose(self, f: StagedFile) -> None:
        Path(self.roots[f.target], f.path).unlink()

    def publish_only(self, target: str, b: Batch, files: Sequence[StagedFile]) -> None:
        delta = DeltaTarget(self.roots[target])
        delta.publish(
            app_id=b.app_id,
            batch_id=b.batch_id,
            files=files,
            schema=SCHEMA,
            metadata=b.commit_metadata(),
        )

    def expire_log(self) -> None:
        for root in self.roots.values():
            table = DeltaTable(root)
            table.alter.set_table_properties({"delta.logRetentionDuration": "interval 0 seconds"})
            table.create_checkpoint()
            table.cleanup_metadata()


@pytest.fixture(params=["fake", "delta"])
def edge(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Edge]:
    yield FakeEdge() if request.param == "fake" else DeltaEdge(tmp_path)


def publish_one(edge: Edge) -> tuple[Batch, list[StagedFile]]:
    """Batch 1 published: 13 rows in the table, offsets 8 and 9 of partition 0 quarantined."""
    b1 = batch(1, R1)
    files = [
        *edge.stage(b1, TABLE, {0: range(8), 1: range(5)}),
        *edge.stage(b1, QUARANTINE, {0: [8, 9]}),
    ]
    assert edge.publisher.publish(b1, files).published
    return b1, files


# -- the contract ---------------------------------------------------------------------------


def test_a_new_publisher_holds_nothing(edge: Edge) -> None:
    p, b1 = edge.publisher, batch(1, R1)
    assert p.committed_version(APP) is None
    assert p.committed_batches(APP) == []
    assert p.outputs_holding(b1) == set()
    assert p.rows_held(b1, TABLE) == 0
    assert p.rows_reach(TOPIC) == {}
    assert p.topics_in_rows([TOPIC]) == {}


def test_a_published_batch_is_held_with_its_commit_info(edge: Edge) -> None:
    """Invariant 7: the log alone says what the batch was (ranges, kind, attempt, topic
    ids, params, decisions), so a lost ledger is rebuilt from it."""
    p = edge.publisher
    b1 = batch(1, R1, params={"why": "contract"}, kind=BatchKind.LIVE)
    files = [
        *edge.stage(b1, TABLE, {0: range(8), 1: range(5)}),
        *edge.stage(b1, QUARANTINE, {0: [8, 9]}),
    ]
    result = p.publish(b1, files)
    assert result.published
    assert p.committed_version(APP) == 1
    assert p.committed_version("another-app") is None
    assert p.committed_batches("another-app") == []
    assert p.outputs_holding(b1) == {TABLE, QUARANTINE}
    assert p.outputs_holding(batch(2, R2)) == set()
    (entry,) = p.committed_batches(APP)
    assert entry.get("complete", True) is True
    assert [OffsetRange.from_dict(r) for r in entry["ranges"]] == list(R1)
    assert (entry["batch_id"], entry["attempt"], entry["kind"]) == (1, 1, BatchKind.LIVE)
    assert (entry["topic_id"], entry["topic_ids"]) == ("topic-id-1", {TOPIC: "topic-id-1"})
    assert (entry["params"], entry["decisions"]) == ({"why": "contract"}, [])
    assert entry["table_version"] == result.table_version


def test_publishing_a_batch_again_adds_nothing(edge: Edge) -> None:
    """Invariant 2: the app-transaction version is a compare-and-set; a re-drive of a batch
    the tables hold (a crash after the commit) publishes nothing, and says so."""
    p = edge.publisher
    b1, files = publish_one(edge)
    first = p.committed_batches(APP)
    again = p.publish(b1, files)
    assert not again.published
    assert again.table_version == first[0]["table_version"]
    assert p.committed_batches(APP) == first
    assert (p.rows_held(b1, TABLE), p.rows_held(b1, QUARANTINE)) == (13, 2)


def test_a_batch_below_the_held_one_is_not_published(edge: Edge) -> None:
    """Invariant 2: a batch id at or below the version publishes nothing, even one the
    table never held (a stale attempt of an older batch): its rows never appear."""
    p = edge.publisher
    b2 = batch(2, R2)
    assert p.publish(b2, edge.stage(b2, TABLE, {0: range(10, 14)})).published
    held = p.committed_batches(APP)
    b1 = batch(1, R1)
    stale = p.publish(b1, edge.stage(b1, TABLE, {0: range(10), 1: range(5)}))
    assert not stale.published
    assert stale.table_version == held[0]["table_version"]
    assert p.committed_version(APP) == 2
    assert p.committed_batches(APP) == held
    assert p.rows_held(b1, TABLE) == 0


def test_another_application_id_has_its_own_version(edge: Edge) -> None:
    """A backfill's app id (`<pipeline>.backfill`) publishes its batch 1 after the live
    pipeline's batch 2: each app id's version is its own compare-and-set."""
    p = edge.publisher
    b2 = batch(2, R2)
    assert p.publish(b2, edge.stage(b2, TABLE, {0: range(10, 14)})).published
    fill = batch(1, R1, app_id=f"{APP}.backfill", kind=BatchKind.BACKFILL, pipeline=APP)
    assert p.outputs_holding(fill) == set()
    assert p.publish(fill, edge.stage(fill, TABLE, {0: range(10), 1: range(5)})).published
    assert (p.committed_version(APP), p.committed_version(fill.app_id)) == (2, 1)
    assert [e["batch_id"] for e in p.committed_batches(fill.app_id)] == [1]
    assert [e["batch_id"] for e in p.committed_batches(APP)] == [2]


def test_rows_held_counts_each_outputs_rows_in_the_batch_ranges(edge: Edge) -> None:
    """Invariant 12 (`check_same_split`): a re-staged batch is compared, per output that
    holds it, with the rows that output holds in the batch's ranges; a derived output's
    rows are not records, so it answers None and the check skips it."""
    p = edge.publisher
    b1, _files = publish_one(edge)
    assert (p.rows_held(b1, TABLE), p.rows_held(b1, QUARANTINE)) == (13, 2)
    assert p.rows_held(batch(2, R2), TABLE) == 0
    assert p.rows_held(b1, derived_target("counts")) is None


def test_file_size_is_the_staged_files_size_on_storage_now(edge: Edge) -> None:
    """Invariant 11: the vote's check reads each voted file's size; a lost file is None."""
    p, b1 = edge.publisher, batch(1, R1)
    table, quarantine = edge.stage(b1, TABLE, {0: range(8)}), edge.stage(b1, QUARANTINE, {0: [8]})
    for f in [*table, *quarantine]:
        assert p.file_size(f.target, f.path) == f.size
    edge.lose(quarantine[0])
    assert p.file_size(QUARANTINE, quarantine[0].path) is None
    assert p.file_size(TABLE, table[0].path) == table[0].size
    assert p.file_size(TABLE, "staged/never/written.parquet") is None


def test_a_batch_one_output_holds_is_reported_unfinished_then_finished(edge: Edge) -> None:
    """Invariant 12: the quarantine committed the batch and the process died before the
    data table. Every output's log is read: the batch is the newest held, unfinished, held
    by the quarantine alone; publishing it again adds it to the table only."""
    p, b1 = edge.publisher, batch(1, R1)
    quarantined = edge.stage(b1, QUARANTINE, {0: [8, 9]})
    edge.publish_only(QUARANTINE, b1, quarantined)
    assert p.committed_version(APP) == 1
    assert p.outputs_holding(b1) == {QUARANTINE}
    (entry,) = p.committed_batches(APP)
    assert (entry["batch_id"], entry["complete"], entry["outputs"]) == (1, False, [QUARANTINE])
    assert [OffsetRange.from_dict(r) for r in entry["ranges"]] == list(R1)
    assert (p.rows_held(b1, QUARANTINE), p.rows_held(b1, TABLE)) == (2, 0)
    # recovery stages the batch again (attempt 2) and publishes it: the quarantine, which
    # holds it, gets nothing of the new stage
    again = replace(b1, attempt=2, token="tok1b")
    table = edge.stage(again, TABLE, {0: range(8), 1: range(5)})
    assert p.publish(again, [*table, *edge.stage(again, QUARANTINE, {0: [8, 9]})]).published
    assert p.outputs_holding(b1) == {TABLE, QUARANTINE}
    assert (p.rows_held(b1, QUARANTINE), p.rows_held(b1, TABLE)) == (2, 13)
    (entry,) = p.committed_batches(APP)
    assert entry.get("complete", True) is True


def test_rows_reach_is_one_past_the_highest_published_offset(edge: Edge) -> None:
    """Invariant 15: when the log is gone, resume-at is told where each partition's rows
    end, over both tables."""
    p = edge.publisher
    publish_one(edge)
    assert p.rows_reach(TOPIC) == {0: 10, 1: 5}
    b2 = batch(2, R2)
    p.publish(b2, edge.stage(b2, TABLE, {0: range(10, 14)}))
    assert p.rows_reach(TOPIC) == {0: 14, 1: 5}
    assert p.rows_reach("another-topic") == {}


def test_log_retention_keeps_the_version_and_loses_the_commit_info(edge: Edge) -> None:
    """Invariant 7's limit: retention removes old commit info, never the app-transaction
    version; `rebuild_from_log` then finds the newest batch gone and refuses."""
    p = edge.publisher
    b1, _files = publish_one(edge)
    b2 = batch(2, R2)
    assert p.publish(b2, edge.stage(b2, TABLE, {0: range(10, 14)})).published
    edge.expire_log()
    assert p.committed_version(APP) == 2
    assert p.committed_batches(APP) == []
    assert p.outputs_holding(b1) == {TABLE, QUARANTINE}
    assert p.rows_reach(TOPIC) == {0: 14, 1: 5}
    # the rows still say which topic they came from, where the log no longer does
    held = p.topics_in_rows([TOPIC, "another-topic"])
    assert held and all(found == {TOPIC} for found in held.values()), held


def test_check_schemas_refuses_what_the_tables_cannot_take(edge: Edge) -> None:
    """Invariant 14: before a table exists any schema fits; then a new nullable column fits
    (it is added with the batch) and a type change is refused before the vote."""
    p = edge.publisher
    changed = SCHEMA.set(3, pa.field("value", pa.string()))
    wider = SCHEMA.append(pa.field("note", pa.string()))
    p.check_schemas({TABLE: encode_schema(changed)})
    publish_one(edge)
    p.check_schemas(SCHEMAS)
    p.check_schemas({TABLE: encode_schema(wider), QUARANTINE: encode_schema(wider)})
    with pytest.raises(RefusedBatchError, match="value"):
        p.check_schemas({TABLE: encode_schema(changed)})
    with pytest.raises(RefusedBatchError, match="value"):
        p.check_schemas({QUARANTINE: encode_schema(changed)})
