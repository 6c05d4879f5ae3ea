"""The stager's contract (ledger/core/ports.py `Stager`), pinned on the fakes and the real.

The coordinator's tests stage with `FakeStager` and `TopicsStager` (tests/fixtures/); the
product stages with `SparkStager` (jobs/stage/spark_stager.py). Every test here runs on each: the
fakes as unit tests, the real one as an integration test (its param is marked
`integration`: it needs the Kafka broker and a local Spark session).

What the coordinator relies on from a stage's `StageOutput` (docs/protocol.md):
- the files are in folders unique to the attempt (app id, batch id, attempt, token), so a
  stage never writes over another attempt's files, voted or published (invariants 3, 4);
- each file is on storage with the size the vote records, which the commit checks again
  (invariant 11);
- every record read is in exactly one output's files, and the counts say so (invariants 9,
  13; `check_same_split` compares per-output records with what an output holds);
- a schema for the data table and for every output it staged files for: the vote records
  them, `check_schemas` checks them and the publisher commits with them (invariant 14).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from ledger.core.batch import Batch, StagedFile
from ledger.core.ports import StageOutput, Stager
from ledger.core.protocol import BatchState, OffsetRange
from ledger.host.process import this_owner
from resources.delta.schema import decode_schema
from tests.fixtures.batches import a_batch
from tests.fixtures.fake_topics import TopicsStager
from tests.fixtures.fakes import TOPIC, FakeStager

TABLE, QUARANTINE = "table", "quarantine"  # jobs/stage/staging.py's, which imports Spark


@dataclass
class StageEdge:
    """A stager under contract, the batch ranges it can read, and its storage."""

    stager: Stager
    app_id: str
    #: ranges holding records (two partitions)
    ranges: tuple[OffsetRange, ...]
    #: a staged file's size on storage now, None if it is not there
    size: Callable[[StagedFile], int | None]
    #: the outputs the ranges' records go to
    outputs: frozenset[str] = frozenset({TABLE})


def fake_edge(stager: FakeStager) -> StageEdge:
    ranges = (OffsetRange(TOPIC, 0, 0, 10), OffsetRange(TOPIC, 1, 5, 12))
    outputs = frozenset(stager.outputs)
    return StageEdge(stager, "pageviews", ranges, lambda f: stager.disk.get(f.path), outputs)


def spark_edge(request: pytest.FixtureRequest) -> StageEdge:
    """The real stager: the example transform over a fresh topic of two partitions, the
    invalid JSON records quarantined; Kafka and Spark are the session's."""
    from jobs.stage.spark_stager import SparkStager

    config = request.getfixturevalue("pipeline_factory")(partitions=2)
    client, spark = request.getfixturevalue("kafka_client"), request.getfixturevalue("spark")

    def view(i: int) -> str:
        if i % 3 == 0:
            return "not json"
        return json.dumps({"event_id": f"e{i}", "app": "web", "user": "u", "url": "/", "ts": ""})

    topic = config.kafka.topic
    client.produce_to_partitions(
        topic, {0: [view(i) for i in range(10)], 1: [view(i) for i in range(12)]}
    )
    roots = {TABLE: config.delta.table_uri, QUARANTINE: config.delta.quarantine_uri}

    def size(f: StagedFile) -> int | None:
        path = Path(roots[f.target], f.path)
        return path.stat().st_size if path.is_file() else None

    ranges = (OffsetRange(topic, 0, 0, 10), OffsetRange(topic, 1, 5, 12))
    outputs = frozenset({TABLE, QUARANTINE})
    return StageEdge(SparkStager(config, lambda: spark), config.app_id, ranges, size, outputs)


@pytest.fixture(
    params=[
        "fake",
        "fake-with-quarantine",
        "topics",
        pytest.param("spark", marks=pytest.mark.integration),
    ]
)
def edge(request: pytest.FixtureRequest) -> Iterator[StageEdge]:
    if request.param == "fake":
        yield fake_edge(FakeStager())
    elif request.param == "fake-with-quarantine":
        yield fake_edge(FakeStager(outputs=(TABLE, QUARANTINE)))
    elif request.param == "topics":
        yield fake_edge(TopicsStager())
    else:
        yield spark_edge(request)


def batch(edge: StageEdge, ranges: tuple[OffsetRange, ...] | None = None, **fields: Any) -> Batch:
    """Batch 1 of the edge's app id, attempt 1, as the coordinator hands it to `stage`."""
    fields.setdefault("app_id", edge.app_id)
    fields.setdefault("token", "tok1")
    return a_batch(
        1,
        BatchState.PLANNED,
        owner=this_owner(),
        ranges=edge.ranges if ranges is None else ranges,
        topic_id="topic-id-1",
        **fields,
    )


def assert_describes_storage(edge: StageEdge, b: Batch, output: StageOutput) -> None:
    """The vote's input says what is on storage, and every record read is in one output."""
    paths = [f.path for f in output.files]
    assert len(set(paths)) == len(paths), "two staged files share a path"
    for f in output.files:
        assert edge.size(f) == f.size, f"{f.path}: the vote's size is not the file's"
    for target in {TABLE} | {f.target for f in output.files}:
        decode_schema(output.schemas[target])  # what check_schemas and publish decode
    table = sum(f.records for f in output.files if f.target == TABLE)
    quarantine = sum(f.records for f in output.files if f.target == QUARANTINE)
    assert (output.table_records, output.quarantine_records) == (table, quarantine)
    assert output.records_read == b.span == table + quarantine


# -- the contract ---------------------------------------------------------------------------


def test_a_stage_describes_the_files_it_wrote(edge: StageEdge) -> None:
    b = batch(edge)
    output = edge.stager.stage(b)
    assert {f.target for f in output.files} == edge.outputs
    assert_describes_storage(edge, b, output)


def test_every_attempt_stages_into_files_of_its_own(edge: StageEdge) -> None:
    """Invariant 4: a re-stage (attempt 2), a rebuilt ledger's attempt that got the same
    batch id and attempt number again (another token) and a backfill's batch of the same
    id (another app id) each write new paths, and leave every earlier file as it was."""
    first = batch(edge)
    attempts = [
        first,
        replace(first, attempt=2, token="tok2"),
        replace(first, token="tok-rebuilt"),
        replace(first, app_id=f"{first.app_id}.backfill", token="tok-fill"),
    ]
    seen: dict[str, StagedFile] = {}
    for b in attempts:
        output = edge.stager.stage(b)
        assert_describes_storage(edge, b, output)
        mine = {f.path for f in output.files}
        assert not mine & set(seen), f"{b.label} staged over an earlier attempt's files"
        seen.update({f.path: f for f in output.files})
    for f in seen.values():
        assert edge.size(f) == f.size, f"{f.path} changed after its attempt"


def test_a_batch_of_empty_ranges_stages_no_records(edge: StageEdge) -> None:
    """`begin(allow_empty=True)` plans a batch of empty ranges; it votes and commits too."""
    empty = tuple(replace(r, start=r.end) for r in edge.ranges)
    b = batch(edge, empty)
    output = edge.stager.stage(b)
    assert sum(f.records for f in output.files) == 0
    assert_describes_storage(edge, b, output)
