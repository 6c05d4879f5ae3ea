"""A raw table restored behind the pipeline (Delta RESTORE), against the real broker, Spark
and delta-rs: the restore keeps the application transactions of the commits it takes out,
so the table claims batches whose rows it no longer holds (resources/delta/restores.py)."""

from __future__ import annotations

from typing import Any

import pytest
from deltalake import DeltaTable, write_deltalake

from jobs.examples.sample_data import pageviews
from jobs.wiring.pipeline import build
from ledger.core.errors import InconsistencyError, RefusedBatchError
from ledger.core.protocol import BatchState
from ledger.store.ledger_store import LedgerStore
from tests.fixtures.pipeline import assert_exactly_once


def run_until_caught_up(tpc: Any) -> None:
    tpc.recover_and_commit()
    while tpc.run_batch() is not None:
        pass


def test_a_raw_table_restored_behind_the_pipeline_is_refused_until_the_restore_is_undone(
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    """Restored to the version of its first batch, the table still said it held the later
    ones, the next batch committed on top, and their records were lost for good (the
    exactly-once check found them missing). Refused before the vote, naming the batches
    and the version to restore to; restored back, the pipeline goes on, every record once."""
    config = pipeline_factory(2, max_records=40)
    topic = config.kafka.topic
    kafka_client.produce(topic, pageviews(120))
    run_until_caught_up(build(config, spark_factory=lambda: spark))
    table = DeltaTable(config.delta.table_uri)
    first = min(e["version"] for e in table.history() if e.get("operation") != "CREATE TABLE")
    table.restore(first)  # the batches after the first are taken out
    restored_at = DeltaTable(config.delta.table_uri).version()
    kafka_client.produce(topic, pageviews(30, start=120))

    with pytest.raises(RefusedBatchError, match=f"restored at log version {restored_at}") as e:
        run_until_caught_up(build(config, spark_factory=lambda: spark))
    said = str(e.value)
    assert "\n" not in said and f"Restore it to version {restored_at - 1}" in said
    assert f"{config.app_id}/2" in said and f"{config.app_id}/3" in said
    store = LedgerStore(config.ledger.url)
    assert not store.batches(app_id=config.app_id, states=[BatchState.PREPARED])

    DeltaTable(config.delta.table_uri).restore(restored_at - 1)
    run_until_caught_up(build(config, spark_factory=lambda: spark))
    assert assert_exactly_once(config, kafka_client)[0] == 150


def _options(uri: str) -> dict[str, str]:
    """delta-rs's options for `uri` as the product opens it (S3: the process's access)."""
    from resources.delta.options import storage_options_for

    return storage_options_for(uri, {})


def _restore(uri: str, version: int) -> None:
    DeltaTable(uri, storage_options=_options(uri)).restore(version)


def _commit(uri: str, batch_id: int, rows: int, partition: int = 0) -> None:
    """One exactly-like batch commit of `rows` rows at offsets from 10 * batch_id."""
    import pyarrow as pa
    from deltalake import CommitProperties, Transaction

    start = 10 * batch_id
    table = pa.table(
        {
            "_kafka_topic": pa.array(["t"] * rows, pa.string()),
            "_kafka_partition": pa.array([partition] * rows, pa.int32()),
            "_kafka_offset": pa.array(range(start, start + rows), pa.int64()),
            "_batch_id": pa.array([batch_id] * rows, pa.int64()),
        }
    )
    ranges = [{"topic": "t", "partition": partition, "start": start, "end": start + rows}]
    meta = {"exactly": {"app_id": "app", "batch_id": batch_id, "ranges": ranges}}
    write_deltalake(
        uri,
        table,
        mode="append",
        storage_options=_options(uri),
        commit_properties=CommitProperties(
            app_transactions=[Transaction("app", batch_id)], custom_metadata=meta
        ),
    )


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.wide)])
def root(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """Where the tables go: a local folder, or a bucket of the loopback S3 server (the log
    read through boto3, the rows through pyarrow, the commits through delta-rs)."""
    if request.param == "local":
        return str(tmp_path)
    request.getfixturevalue("s3_env")
    return f"s3://{request.getfixturevalue('s3_bucket')}"


def test_a_restore_names_the_batches_it_took_out_and_not_those_with_no_rows(root: str) -> None:
    """delta-rs's own RESTORE on a table of exactly-like commits: the batches after the
    version restored to are named, not one that added no row (all its records were
    quarantined: nothing of it could be taken out), and the refusal ends once the restore
    is undone; a second restore is found by the same DeltaTarget, reading on."""
    from jobs.publish.restore_check import restore_refusal
    from resources.delta.table import DeltaTarget

    uri = f"{root}/raw"
    _commit(uri, 1, 3)
    _commit(uri, 2, 3)
    _commit(uri, 3, 0)  # every record quarantined
    _commit(uri, 4, 2)
    target = DeltaTarget(uri, _options(uri))
    assert restore_refusal(target, ["app"]) is None
    _restore(uri, 0)
    said = restore_refusal(target, ["app"])
    assert said is not None and "restored at log version 4" in said
    assert "batch(es) app/2, app/4 " in said and "app/3" not in said
    _restore(uri, 3)  # undone: the version just before the restore
    assert restore_refusal(target, ["app"]) is None
    _commit(uri, 5, 2)
    _restore(uri, 5)  # takes out batch 5 only
    again = restore_refusal(target, ["app"])
    assert again is not None and "batch(es) app/5 " in again
    fresh = DeltaTarget(uri, _options(uri))  # a new process finds it too
    assert restore_refusal(fresh, ["app"]) == again
    assert "also undoes" not in again
    other = DeltaTable(uri, storage_options=_options(uri)).to_pyarrow_table().slice(0, 1)
    write_deltalake(uri, other, mode="append", storage_options=_options(uri))
    later = restore_refusal(target, ["app"])  # another writer committed after the restore
    assert later is not None and "also undoes log version(s) 8 to 8" in later


def test_a_table_restored_between_the_vote_and_the_commit_keeps_the_batch_waiting(
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    """A batch voted before the restore and committed after it put its rows on top of the
    restored table: the batches restored away were lost, and restoring to the version just
    before the restore (the refusal's way out) then took the new batch out as well. The
    commit is refused the same way, the batch waits voted, and commits once it is undone."""
    config = pipeline_factory(2, max_records=40)
    topic = config.kafka.topic
    kafka_client.produce(topic, pageviews(120))
    run_until_caught_up(build(config, spark_factory=lambda: spark))
    kafka_client.produce(topic, pageviews(30, start=120))
    tpc = build(config, spark_factory=lambda: spark)
    voted = tpc.pre_commit(*tpc.invoke(tpc.begin()))  # type: ignore[arg-type]
    table = DeltaTable(config.delta.table_uri)
    first = min(e["version"] for e in table.history() if e.get("operation") != "CREATE TABLE")
    table.restore(first)
    restored_at = DeltaTable(config.delta.table_uri).version()

    with pytest.raises(InconsistencyError, match=f"restored at log version {restored_at}") as e:
        tpc.commit(voted)
    assert not isinstance(e.value, RefusedBatchError) and "waits" in str(e.value)
    assert DeltaTable(config.delta.table_uri).version() == restored_at  # nothing on top
    store = LedgerStore(config.ledger.url)
    waiting = store.batches(app_id=config.app_id, states=[BatchState.PREPARED])
    assert [b.batch_id for b in waiting] == [voted.batch_id]

    DeltaTable(config.delta.table_uri).restore(restored_at - 1)
    run_until_caught_up(build(config, spark_factory=lambda: spark))
    assert assert_exactly_once(config, kafka_client)[0] == 150


def test_a_derived_rebuild_from_a_restored_raw_table_is_refused(root: str) -> None:
    """`exactly derived rebuild` read the restored raw table as it was and wrote the output
    short of the batches restored away, at the raw table's transaction versions: once the
    restore was undone, the output said it held those batches without their rows, for good.
    Refused in the same words as a batch, and built once the restore is undone."""
    from jobs.derived.rebuild import raw_snapshot
    from resources.delta.table import DeltaTarget

    uri = f"{root}/raw"
    for batch_id in (1, 2, 3):
        _commit(uri, batch_id, 3)
    _restore(uri, 1)
    with pytest.raises(RefusedBatchError, match=r"restored at log version 3 .* app/3 "):
        raw_snapshot("views", DeltaTarget(uri, _options(uri)), ["app"])
    _restore(uri, 2)
    snapshot, holds = raw_snapshot("views", DeltaTarget(uri, _options(uri)), ["app"])
    assert holds == {"app": 3} and snapshot.to_pyarrow_table().num_rows == 9


def test_a_restore_back_to_a_restored_version_is_refused_again(root: str) -> None:
    """Undone, a restore is remembered as resolved; restoring the table to the version
    that first restore wrote takes its batches out again, while the new restore's own
    window (between its target and itself) holds no batch: only the undo. Seen by the
    same DeltaTarget, it was taken as harmless and the next batch committed on top."""
    from jobs.publish.restore_check import restore_refusal
    from resources.delta.table import DeltaTarget

    uri = f"{root}/raw"
    for batch_id in (1, 2, 3):
        _commit(uri, batch_id, 3)
    target = DeltaTarget(uri, _options(uri))
    _restore(uri, 0)  # version 3: batches 2 and 3 out
    assert restore_refusal(target, ["app"]) is not None
    _restore(uri, 2)  # version 4: undone
    assert restore_refusal(target, ["app"]) is None
    _restore(uri, 3)  # version 5: the state of version 3 again
    again = restore_refusal(target, ["app"])
    assert again is not None and "app/2, app/3 " in again
    assert restore_refusal(DeltaTarget(uri, _options(uri)), ["app"]) is not None


def _merge_like(uri: str, batch_id: int, rows: int = 1) -> None:
    """A derived output's commit of one batch (app id `app.derived.v`), `rows` rows of
    groups; 0 rows: a commit recording the version alone, as a MERGE with nothing to do."""
    import pyarrow as pa
    from deltalake import CommitProperties, Transaction

    meta = {"exactly": {"app_id": "app.derived.v", "batch_id": batch_id, "ranges": []}}
    properties = CommitProperties(
        app_transactions=[Transaction("app.derived.v", batch_id)], custom_metadata=meta
    )
    data = pa.table({"g": pa.array([f"k{batch_id}"] * rows, pa.string())})
    if rows:
        write_deltalake(
            uri, data, mode="append", storage_options=_options(uri), commit_properties=properties
        )
    else:
        table = DeltaTable(uri, storage_options=_options(uri))
        table.create_write_transaction([], "append", table.schema(), commit_properties=properties)


def test_a_derived_table_s_restores_are_told_from_its_log(root: str) -> None:
    """A derived output's rows carry no coordinates, so which of its batch merges its
    state holds is told from the log: a restore takes out the merges it jumps over; an
    undo (a restore to the version before) puts them back; a restore back to the version
    the first one wrote takes them out again; a merge that changed nothing loses nothing."""
    from resources.delta.restores import LogWalk

    uri = f"{root}/views"
    for batch_id in (1, 2):
        _merge_like(uri, batch_id)  # versions 0, 1
    _merge_like(uri, 3, rows=0)  # version 2: recorded alone
    _merge_like(uri, 4)  # version 3
    walk, own = LogWalk(), {"app.derived.v"}

    def taken() -> Any:
        return walk.taken_out(DeltaTable(uri, storage_options=_options(uri)), uri, own)

    assert taken() is None
    _restore(uri, 0)  # version 4: out go 2 and 4 (3 changed nothing)
    first = taken()
    assert first is not None and (first.at, first.to) == (4, 0)
    assert [m["batch_id"] for m in first.removed] == [4, 2]
    assert walk.taken_out(DeltaTable(uri, storage_options=_options(uri)), uri, {"other"}) is None
    _restore(uri, 3)  # version 5: undone
    assert taken() is None
    _restore(uri, 4)  # version 6: the first restore's state again
    again = taken()
    assert again is not None and [m["batch_id"] for m in again.removed] == [4, 2]
    assert LogWalk().taken_out(DeltaTable(uri, storage_options=_options(uri)), uri, own) == again
    _restore(uri, 5)  # version 7: undone again
    assert taken() is None


def test_a_derived_output_restored_behind_its_batches_is_refused_until_undone(
    spark: Any, kafka_client: Any, pipeline_factory: Any, tmp_path: Any
) -> None:
    """The aggregate's table restored to its first batch's version kept the application
    transactions of the later merges: the next batches merged on top, and its counts
    stayed short of the raw table's for good (its recomputation differed). Refused
    before the vote naming the batches, the way back, and the rebuild; undone, the
    pipeline goes on and the output matches its recomputation."""
    from tests.fixtures.derived import (
        TRANSFORM,
        assert_derived_match,
        derived_outputs,
        user_events,
    )

    (per_app,) = [o for o in derived_outputs(tmp_path / "derived") if o["name"] == "views_per_app"]
    config = pipeline_factory(2, max_records=60, transform=TRANSFORM, derived=[per_app])
    topic = config.kafka.topic
    kafka_client.produce_records(topic, user_events(0, 240, 2, malformed_every=20))
    run_until_caught_up(build(config, spark_factory=lambda: spark))
    aggregate = per_app["table_uri"]
    history = DeltaTable(aggregate).history()
    first = min(e["version"] for e in history if e.get("operation") != "CREATE TABLE")
    DeltaTable(aggregate).restore(first)
    restored_at = DeltaTable(aggregate).version()
    kafka_client.produce_records(topic, user_events(240, 60, 2, malformed_every=20))

    with pytest.raises(
        RefusedBatchError, match=f"views_per_app .* restored at log version {restored_at}"
    ) as e:
        run_until_caught_up(build(config, spark_factory=lambda: spark))
    said = str(e.value)
    assert "\n" not in said and f"TO VERSION AS OF {restored_at - 1}" in said
    assert f"{config.app_id}.derived.views_per_app/2" in said and "derived rebuild" in said
    assert DeltaTable(aggregate).version() == restored_at

    DeltaTable(aggregate).restore(restored_at - 1)
    run_until_caught_up(build(config, spark_factory=lambda: spark))
    table, quarantined = assert_exactly_once(config, kafka_client)
    assert table + quarantined == 300
    assert_derived_match(config)
