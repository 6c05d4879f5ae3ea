"""The publisher's view of its two real Delta tables (delta-rs, no Spark): which tables hold a
batch, a batch the quarantine holds and the data table not (invariant 12), the sizes of
staged files (invariant 11), and the rows an output holds in a batch's ranges."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.derived.replace import in_ranges
from jobs.publish.delta_publisher import DeltaPublisher
from jobs.stage import parquet_files
from jobs.stage.staging import attempt_folder
from ledger.core.batch import Batch, StagedFile
from ledger.core.errors import RefusedBatchError
from ledger.core.layout import QUARANTINE, TABLE
from ledger.core.protocol import BatchState, OffsetRange
from ledger.host.process import this_owner
from resources.delta.schema import encode_schema
from resources.delta.table import DeltaTarget
from tests.fixtures.batches import a_batch

APP = "pageviews"
TOPIC = "pv-" + "x" * 80  # longer than the 64 characters kept in statistics


def batch(batch_id: int, ranges: list[OffsetRange], token: str = "t0ken") -> Batch:
    return a_batch(
        batch_id,
        BatchState.PREPARED,
        app_id=APP,
        token=token,
        owner=this_owner(),
        ranges=tuple(ranges),
    )


def stage(root: Path, target: str, b: Batch, offsets: list[int]) -> list[StagedFile]:
    """One Parquet file of rows with these offsets of partition 0, in the attempt's folder."""
    folder = attempt_folder(str(root), b.app_id, b.batch_id, b.attempt, b.token)
    Path(folder).mkdir(parents=True)
    rows = pa.table(
        {
            "_kafka_topic": [TOPIC] * len(offsets),
            "_kafka_partition": pa.array([0] * len(offsets), pa.int32()),
            "_kafka_offset": pa.array(offsets, pa.int64()),
        }
    )
    pq.write_table(rows, f"{folder}/part-0.parquet")
    return parquet_files.describe(folder, str(root), target)


def test_a_batch_in_the_quarantine_only_is_reported_unfinished(tmp_path: Path) -> None:
    publisher = DeltaPublisher(
        DeltaTarget(str(tmp_path / "table")), DeltaTarget(str(tmp_path / "quarantine"))
    )
    first = batch(1, [OffsetRange(TOPIC, 0, 0, 10)])
    files = [
        *stage(tmp_path / "table", TABLE, first, list(range(8))),
        *stage(tmp_path / "quarantine", QUARANTINE, first, [8, 9]),
    ]
    schema = pa.schema(
        [
            ("_kafka_topic", pa.string()),
            ("_kafka_partition", pa.int32()),
            ("_kafka_offset", pa.int64()),
        ]
    )
    first = Batch(
        **{
            **first.__dict__,
            "schemas": {TABLE: encode_schema(schema), QUARANTINE: encode_schema(schema)},
        }
    )
    assert publisher.publish(first, files).published
    assert publisher.outputs_holding(first) == {TABLE, QUARANTINE}

    # batch 2 reaches the quarantine, and the process dies before the data table
    second = Batch(**{**first.__dict__, "batch_id": 2, "ranges": (OffsetRange(TOPIC, 0, 10, 13),)})
    quarantined = stage(tmp_path / "quarantine", QUARANTINE, second, [11])
    publisher.quarantine.publish(
        app_id=APP,
        batch_id=2,
        files=quarantined,
        schema=schema,
        metadata=second.commit_metadata(),
    )
    assert publisher.committed_version(APP) == 2  # the newest either table holds
    assert publisher.outputs_holding(second) == {QUARANTINE}
    entries = publisher.committed_batches(APP)
    assert [(e["batch_id"], e["outputs"], e["complete"]) for e in entries] == [
        (1, [QUARANTINE, TABLE], True),
        (2, [QUARANTINE], False),
    ]
    assert [OffsetRange.from_dict(r) for r in entries[1]["ranges"]] == list(second.ranges)
    # the rows each table holds in a batch's ranges
    assert publisher.rows_held(second, QUARANTINE) == 1
    assert publisher.rows_held(second, TABLE) == 0
    assert publisher.rows_held(first, TABLE) == 8

    # staged files as storage has them now
    (kept,) = quarantined
    assert publisher.file_size(QUARANTINE, kept.path) == kept.size
    Path(tmp_path / "quarantine" / kept.path).unlink()
    assert publisher.file_size(QUARANTINE, kept.path) is None

    # publishing batch 2 again adds nothing to the quarantine, and the data table gets it
    version = publisher.quarantine.load().version()  # type: ignore[union-attr]
    table_files = stage(
        tmp_path / "table", TABLE, Batch(**{**second.__dict__, "token": "n3w"}), [10, 12]
    )
    assert publisher.publish(second, [*table_files, *quarantined]).published
    assert publisher.quarantine.load().version() == version  # type: ignore[union-attr]
    assert publisher.committed_batches(APP)[1]["complete"] is True


def test_attempt_folders_differ_by_token_alone() -> None:
    one = attempt_folder("/t", APP, 7, 1, "aaaa")
    other = attempt_folder("/t", APP, 7, 1, "bbbb")
    assert one != other and one.startswith("/t/staged/pageviews/batch-000000000007-attempt-1-")


# -- derived outputs ----------------------------------------------------------------------


def test_derived_outputs_publish_between_the_quarantine_and_the_table_once_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The publisher MERGEs each derived output's voted partial under the output's own app
    id, before the data table; a crash before the data table leaves a batch the derived
    output holds and the data table not, reported unfinished (invariant 12); publishing it
    again adds nothing to the output (its counts are not doubled) and completes the table."""
    from deltalake import DeltaTable

    import jobs.publish.delta_publisher as publisher_module
    from jobs.publish.delta_publisher import DERIVED_METRICS
    from ledger.core.layout import derived_target
    from resources.config.derived_spec import parse_output

    spec = parse_output(
        {
            "kind": "aggregate",
            "name": "views_per_app",
            "table_uri": str(tmp_path / "views"),
            "group_by": ["app"],
            "measures": [{"name": "views", "fn": "count"}],
        }
    )
    assert spec.kind == "aggregate"
    target = derived_target(spec.name)
    publisher = DeltaPublisher(
        DeltaTarget(str(tmp_path / "table")),
        DeltaTarget(str(tmp_path / "quarantine")),
        [(spec, DeltaTarget(spec.table_uri))],
    )
    rows_schema = pa.schema(
        [
            ("_kafka_topic", pa.string()),
            ("_kafka_partition", pa.int32()),
            ("_kafka_offset", pa.int64()),
        ]
    )
    partial_schema = pa.schema([("app", pa.string()), ("views", pa.int64())])

    def voted(
        batch_id: int, offsets: list[int], views: dict[str, int]
    ) -> tuple[Batch, list[StagedFile]]:
        b = batch(batch_id, [OffsetRange(TOPIC, 0, offsets[0], offsets[-1] + 1)])
        b = Batch(
            **{
                **b.__dict__,
                "schemas": {
                    TABLE: encode_schema(rows_schema),
                    QUARANTINE: encode_schema(rows_schema),
                    target: encode_schema(partial_schema),
                },
            }
        )
        folder = attempt_folder(spec.table_uri, APP, batch_id, b.attempt, b.token)
        Path(folder).mkdir(parents=True)
        partial = pa.table({"app": list(views), "views": list(views.values())}, partial_schema)
        pq.write_table(partial, f"{folder}/part-0.parquet")
        files = [
            *stage(tmp_path / "table", TABLE, b, offsets),
            *parquet_files.describe(folder, spec.table_uri, target),
        ]
        return b, files

    def counts() -> dict[str, int]:
        rows = DeltaTable(spec.table_uri).to_pyarrow_table().to_pylist()
        return {r["app"]: r["views"] for r in rows}

    first, files = voted(1, [0, 1, 2], {"web": 2, "ios": 1})
    result = publisher.publish(first, files)
    assert result.metrics[DERIVED_METRICS]["views_per_app"]["applied"] is True
    assert result.metrics[DERIVED_METRICS]["views_per_app"]["rows_inserted"] == 2
    assert publisher.outputs_holding(first) == {TABLE, target}
    # the output's own app id, never the pipeline's, is in its table
    assert DeltaTable(spec.table_uri).transaction_version(APP) is None
    assert DeltaTable(spec.table_uri).transaction_version(spec.app_id(APP)) == 1

    second, files = voted(2, [3, 4], {"web": 1, "tv": 1})

    def crash(name: str, at: str | None = None) -> None:
        if name == "between_table_commits":
            raise SystemExit("crashed")

    monkeypatch.setattr(publisher_module, "crashpoint", crash)
    with pytest.raises(SystemExit):
        publisher.publish(second, files)
    assert counts() == {"web": 3, "ios": 1, "tv": 1}
    assert publisher.outputs_holding(second) == {target}
    assert publisher.committed_version(APP) == 2
    entries = publisher.committed_batches(APP)
    assert [(e["batch_id"], e["outputs"], e["complete"], e["app_id"]) for e in entries] == [
        (1, [target, TABLE], True, APP),
        (2, [target], False, APP),
    ]
    assert publisher.rows_held(second, target) is None  # groups, not records

    monkeypatch.setattr(publisher_module, "crashpoint", lambda _name, _at=None: None)
    again = publisher.publish(second, files)
    assert again.metrics[DERIVED_METRICS]["views_per_app"]["applied"] is False
    assert counts() == {"web": 3, "ios": 1, "tv": 1}  # not added twice
    assert publisher.outputs_holding(second) == {TABLE, target}


# -- a PostgreSQL output: the previous committed batch the compare-and-set needs -----------


class _Table:
    """The data table as `_apply_postgres` reads it: its app-transaction version."""

    def __init__(self, version: int | None) -> None:
        self.version = version

    def transaction_version(self, app_id: str) -> int | None:
        return self.version


class _Postgres:
    """A PostgreSQL output as the publisher holds it, holding batch `held` of every app id."""

    def __init__(self, held: int | None) -> None:
        from resources.config.derived_spec import PostgresOutput, parse_output

        spec = parse_output(
            {
                "kind": "postgres",
                "name": "dash",
                "url": "postgresql://exactly@db/x",
                "table": "views",
                "group_by": ["app"],
                "measures": [{"name": "views", "fn": "count"}],
            }
        )
        assert isinstance(spec, PostgresOutput)
        self.spec, self.root, self.engine, self.held = spec, "/tables/raw", None, held
        self.where = "postgres output dash (views at postgresql://exactly@db/x)"

    def held_batch(self, app_id: str) -> int | None:
        return self.held


@pytest.mark.parametrize(
    ("table_version", "held", "expected"),
    [
        (None, None, ("apply", None)),  # the app id's first batch
        (4, 4, ("apply", 4)),  # ids 5 and 6 were aborted: the gap is no hole
        (4, 7, ("apply", 4)),  # a racing committer applied it: the state's id skips it
        (7, 7, ("held", None)),  # a re-drive after the data table's commit
        (9, 9, ("held", None)),  # ... of an older batch
        (7, 4, ("refused", None)),  # the output was reset behind the pipeline
        (7, None, ("refused", None)),
    ],
)
def test_a_postgres_output_s_previous_batch_is_the_data_table_s_version(
    monkeypatch: pytest.MonkeyPatch,
    table_version: int | None,
    held: int | None,
    expected: tuple[str, int | None],
) -> None:
    """Batch 7: while the data table (published last) does not hold it, its version is the
    last batch committed whole, which the compare-and-set gets as the previous batch; once
    it holds it, nothing is applied and the output must hold it too."""
    import jobs.publish.postgres_outputs as publisher_module
    from ledger.core.errors import InconsistencyError
    from resources.postgres.apply import PostgresOutcome

    calls: list[tuple[str, int, int | None]] = []

    def apply(engine, spec, app_id, batch_id, previous, partial, metadata):  # type: ignore[no-untyped-def]
        calls.append((app_id, batch_id, previous))
        return PostgresOutcome(applied=True, held_batch_id=batch_id, tries=1, seconds=0.0)

    monkeypatch.setattr(publisher_module, "apply_partial", apply)
    monkeypatch.setattr(DeltaPublisher, "read_partial", staticmethod(lambda *a: pa.table({})))
    publisher = DeltaPublisher(_Table(table_version), _Table(None))  # type: ignore[arg-type]
    pg = _Postgres(held)
    seventh = batch(7, [OffsetRange(TOPIC, 0, 0, 10)])
    kind, previous = expected
    if kind == "refused":
        with pytest.raises(InconsistencyError, match="reset behind the pipeline"):
            publisher._apply_postgres(seventh, pg, [], {})  # type: ignore[arg-type]
        assert calls == []
        return
    outcome = publisher._apply_postgres(seventh, pg, [], {})  # type: ignore[arg-type]
    if kind == "held":
        assert (outcome.applied, calls) == (False, [])
    else:
        assert calls == [(f"{APP}.derived.dash", 7, previous)]


def test_a_derived_table_deleted_after_the_vote_is_not_re_created_by_another_app_s_batch(
    tmp_path: Path,
) -> None:
    """The live batches reached the derived output; its table is then deleted while a fill
    (the backfill app id, whose batches the raw table holds none of) waits voted. Merging the
    fill would re-create the table holding that one batch, silently short of every live
    batch: the commit refuses it, naming the output and the rebuild, for any of the
    pipeline's app ids the output is behind on, not only the batch's own."""
    import shutil

    from ledger.core.errors import InconsistencyError
    from ledger.core.layout import derived_target
    from resources.config.derived_spec import parse_output

    spec = parse_output(
        {
            "kind": "aggregate",
            "name": "per_partition",
            "table_uri": str(tmp_path / "derived"),
            "group_by": ["_kafka_partition"],
            "measures": [{"name": "n", "fn": "count"}],
        }
    )
    assert spec.kind == "aggregate"
    target = derived_target(spec.name)
    backfill = f"{APP}.backfill"
    publisher = DeltaPublisher(
        DeltaTarget(str(tmp_path / "table")),
        DeltaTarget(str(tmp_path / "quarantine")),
        [(spec, DeltaTarget(spec.table_uri))],
        app_ids=(APP, backfill),
    )
    rows = pa.schema(
        [
            ("_kafka_topic", pa.string()),
            ("_kafka_partition", pa.int32()),
            ("_kafka_offset", pa.int64()),
        ]
    )
    partial = pa.schema([("_kafka_partition", pa.int32()), ("n", pa.int64())])

    def voted(app_id: str, offsets: list[int]) -> tuple[Batch, list[StagedFile]]:
        b = a_batch(
            1,
            BatchState.PREPARED,
            app_id=app_id,
            pipeline=APP,
            token="t0ken",
            owner=this_owner(),
            ranges=(OffsetRange(TOPIC, 0, offsets[0], offsets[-1] + 1),),
        )
        schemas = {TABLE: encode_schema(rows), QUARANTINE: encode_schema(rows)}
        b = Batch(**{**b.__dict__, "schemas": {**schemas, target: encode_schema(partial)}})
        folder = attempt_folder(spec.table_uri, app_id, 1, b.attempt, b.token)
        Path(folder).mkdir(parents=True)
        counted = pa.table({"_kafka_partition": [0], "n": [len(offsets)]}, partial)
        pq.write_table(counted, f"{folder}/part-0.parquet")
        return b, [
            *stage(tmp_path / "table", TABLE, b, offsets),
            *parquet_files.describe(folder, spec.table_uri, target),
        ]

    live, live_files = voted(APP, [0, 1, 2])
    fill, fill_files = voted(backfill, [3, 4])
    publisher.publish(live, live_files)
    shutil.rmtree(Path(spec.table_uri) / "_delta_log")
    with pytest.raises(InconsistencyError, match=r"per_partition .*exactly derived rebuild"):
        publisher.publish(fill, fill_files)
    assert not (Path(spec.table_uri) / "_delta_log").exists()


def test_a_replace_that_would_delete_rows_it_does_not_stage_again_is_refused(
    tmp_path: Path,
) -> None:
    """A replace's staged rows against the rows its ranges hold in both tables: a held row
    whose record is not staged again (the compacted topic no longer holds it) refuses the
    replace before the vote; the rows all staged again, or a live batch, pass."""
    publisher = DeltaPublisher(
        DeltaTarget(str(tmp_path / "table")), DeltaTarget(str(tmp_path / "quarantine"))
    )
    first = batch(1, [OffsetRange(TOPIC, 0, 0, 10)])
    files = [
        *stage(tmp_path / "table", TABLE, first, list(range(8))),
        *stage(tmp_path / "quarantine", QUARANTINE, first, [8, 9]),
    ]
    schema = encode_schema(pq.read_schema(tmp_path / "table" / files[0].path))
    first = Batch(**{**first.__dict__, "schemas": {TABLE: schema, QUARANTINE: schema}})
    assert publisher.publish(first, files).published
    publisher.check_replace(first, files)  # not a replace: nothing read

    def replace(token: str, table_offsets: list[int], quarantined: list[int]) -> None:
        b = batch(1, [OffsetRange(TOPIC, 0, 2, 10)], token=token)
        b = Batch(**{**b.__dict__, "app_id": f"{APP}.backfill", "params": {"mode": "replace"}})
        staged = stage(tmp_path / "table", TABLE, b, table_offsets)
        staged += stage(tmp_path / "quarantine", QUARANTINE, b, quarantined)
        publisher.check_replace(b, staged)

    replace("all", [2, 3, 4, 5, 6, 7, 9], [8])  # every held row staged again, 9 now good
    with pytest.raises(RefusedBatchError) as refused:
        replace("gone", [3, 7], [9])  # 2, 4, 5, 6 and 8 are no longer in Kafka
    assert (
        f"the replace would delete 5 row(s) whose records Kafka no longer holds, e.g. {TOPIC}-0@2 "
    ) in str(refused.value)


def test_no_row_of_an_empty_table_is_in_a_replace_s_ranges() -> None:
    """A replace over offsets whose every record was quarantined finds no raw row there:
    an empty answer (an untyped empty array made pyarrow refuse, and the voted replace's
    derived corrections failed at every commit)."""
    empty = pa.table(
        {
            "_kafka_topic": pa.array([], pa.string()),
            "_kafka_partition": pa.array([], pa.int32()),
            "_kafka_offset": pa.array([], pa.int64()),
        }
    )
    hit = in_ranges(empty, [OffsetRange(TOPIC, 0, 0, 5)])
    assert hit.type == pa.bool_() and len(hit) == 0
