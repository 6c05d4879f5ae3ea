"""The seed's storage-fault incident, on S3: a fault proxy between every S3 client and the
loopback S3 server answers 503 SlowDown in bursts, executes a request and drops its answer
(the client retries an operation that already happened), delays answers, or refuses
connections for a while. Under each, the commit path must publish every batch once and say
truthfully whether it was this call that published it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import yaml
from deltalake import DeltaTable

from jobs.examples.sample_data import pageviews
from jobs.stage.parquet_files import describe
from ledger.coordinator.crash import CRASH_EXIT_CODE
from ledger.core.batch import StagedFile
from ledger.core.layout import QUARANTINE, TABLE
from ledger.core.protocol import BatchState, OffsetRange
from ledger.store.ledger_store import LedgerStore
from resources.config.pipeline_config import PipelineConfig
from resources.delta.table import DeltaTarget
from resources.object_storage import storage
from resources.object_storage.embedded_s3 import S3Server
from resources.object_storage.s3 import S3Access
from tests.fixtures.fault_proxy import Delay, DropResponse, Fault, FaultProxy, SlowDown
from tests.fixtures.pipeline import assert_exactly_once
from tests.fixtures.race_publisher import SCHEMA, parquet_of
from tests.fixtures.s3 import put_object
from tests.fixtures.soak import full_size
from tests.test_cli import EXACTLY
from tests.test_s3_pipeline import write_config

pytestmark = pytest.mark.integration

APP = "pageviews"
TOPIC = "pageviews"


def staged(root: str, batch_id: int, rng: OffsetRange) -> list[StagedFile]:
    folder = storage.join(root, "staged", APP, f"batch-{batch_id}-attempt-1")
    put_object(storage.join(folder, "part-0.parquet"), parquet_of(rng, f"{batch_id}"))
    return [StagedFile(**asdict(f)) for f in describe(folder, root, "table")]


def offsets(root: str) -> Counter[tuple[int, int]]:
    data = DeltaTable(root, storage_options=DeltaTarget(root).storage_options).to_pyarrow_table()
    return Counter(
        zip(
            data.column("_kafka_partition").to_pylist(),
            data.column("_kafka_offset").to_pylist(),
            strict=True,
        )
    )


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(DropResponse(methods=frozenset({"PUT"}), path_contains="/_delta_log/0"),
                     id="log-entry-written-answer-dropped"),
        pytest.param(SlowDown(times=3, methods=frozenset({"PUT"}), path_contains="/_delta_log/0"),
                     id="log-entry-slowdown-burst"),
        pytest.param(SlowDown(times=4, methods=frozenset({"GET"}), path_contains="_delta_log"),
                     id="log-listing-slowdown-burst"),
    ],
)  # fmt: skip
def test_a_commit_under_a_storage_fault_lands_once_and_knows_it_is_ours(
    faulty_s3: tuple[FaultProxy, dict[str, str]], s3_bucket: str, fault: Fault
) -> None:
    proxy, _env = faulty_s3
    root = f"s3://{s3_bucket}/pv"
    target = DeltaTarget(root)
    first = staged(root, 1, OffsetRange(TOPIC, 0, 0, 10))
    meta = {"app_id": APP}
    assert target.publish(
        app_id=APP, batch_id=1, files=first, schema=SCHEMA, metadata=meta
    ).published
    second = staged(root, 2, OffsetRange(TOPIC, 0, 10, 25))
    proxy.inject(fault)
    outcome = target.publish(app_id=APP, batch_id=2, files=second, schema=SCHEMA, metadata=meta)
    assert fault.times == 0, f"the fault never fired: {proxy.log}"
    assert outcome.published, f"the batch's own commit was reported as someone else's: {outcome}"
    assert target.transaction_version(APP) == 2
    assert offsets(root) == Counter((0, o) for o in range(25))
    print([entry for entry in proxy.log if "_delta_log" in entry.path])


# -- the whole pipeline under each fault, killed and restarted ------------------------------

RUN_TIMEOUT = 600
#: 2 partitions x 100 records per batch: a batch of 200 and one of the rest.
RECORDS = 350
MALFORMED_EVERY = 40
MAX_RECORDS = 100
REFUSE_SECONDS = 30.0
#: How late a delayed answer comes: far beyond a loopback answer's milliseconds, far below
#: any client's timeout (the clients wait it out either way; each second here is a second
#: of the test, several times over).
DELAY_SECONDS = 2.0


def exactly_run(
    *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        [*EXACTLY, *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        env={**os.environ, **(env or {})},
    )
    return done, time.monotonic() - started


def arm(proxy: FaultProxy, fault: str) -> None:
    """Faults for the next `exactly run`, aimed at every client and phase a batch goes
    through: Spark's staged writes (s3a), the vote's reads of the staged files (boto3,
    pyarrow), the Delta log's conditional writes (delta-rs)."""
    staged, log = "/staged/", "/_delta_log/0"
    puts, reads = frozenset({"PUT"}), frozenset({"HEAD", "GET"})
    if fault == "slowdown":
        proxy.inject(
            SlowDown(times=3, methods=puts, path_contains=staged),
            SlowDown(times=3, methods=reads, path_contains=staged),
            SlowDown(times=3, methods=puts, path_contains=log),
        )
    elif fault == "dropped":
        proxy.inject(
            DropResponse(times=2, methods=puts, path_contains=staged),
            DropResponse(times=1, methods=puts, path_contains=log),
        )
    elif fault == "delayed":
        proxy.inject(
            Delay(times=4, methods=puts, path_contains=staged, seconds=DELAY_SECONDS),
            Delay(times=2, methods=puts, path_contains=log, seconds=DELAY_SECONDS),
        )


def arm_deletes(proxy: FaultProxy, fault: str) -> None:
    """The fault for the cleaner's deletes (boto3), the seed's retried delete among them."""
    deletes = frozenset({"DELETE", "POST"})
    if fault == "slowdown":
        proxy.inject(SlowDown(times=2, methods=deletes))
    elif fault == "dropped":
        proxy.inject(DropResponse(times=1, methods=deletes))
    elif fault == "delayed":
        proxy.inject(Delay(times=1, methods=deletes, seconds=DELAY_SECONDS))


def delta_log(access: S3Access, uri: str) -> list[dict[str, Any]]:
    """Every action of a table's log, in version order, read from the server itself."""
    bucket, key = storage.split_s3(uri)
    client = access.boto3_client()
    listed = client.list_objects_v2(Bucket=bucket, Prefix=f"{key}/_delta_log/")
    names = sorted(o["Key"] for o in listed.get("Contents", []) if o["Key"].endswith(".json"))
    actions = []
    for name in names:
        text = client.get_object(Bucket=bucket, Key=name)["Body"].read().decode()
        actions += [json.loads(line) for line in text.splitlines() if line.strip()]
    return actions


def referenced_objects(config: PipelineConfig, access: S3Access) -> set[str]:
    """`/bucket/key` of every object a vote in the ledger names or a table version adds."""
    roots = {TABLE: config.delta.table_uri, QUARANTINE: config.delta.quarantine_uri}
    store = LedgerStore(config.ledger.url)
    try:
        named = {
            storage.join(roots[f.target], f.path)
            for batch in store.batches(pipeline=config.pipeline)
            for f in store.files(batch.app_id, batch.batch_id)
        }
    finally:
        store.dispose()
    for root in roots.values():
        named |= {
            storage.join(root, a["add"]["path"]) for a in delta_log(access, root) if "add" in a
        }
    return {"/" + uri.removeprefix("s3://") for uri in named}


#: In `make soak` only, beside the others: the control (the same kills, restarts and
#: cleaning with no fault, whose timings are the baseline the faults' are read against),
#: answers delayed by seconds, which every client waits out (no timeout fires, so the path
#: is the control's, slower), and 503s, which every client retries with backoff until one
#: lands (the path of a lost reply's retry, below, which stays). `make test` keeps the
#: faults whose retries must decide by content: a reply lost after the write landed, and a
#: store refusing every connection.
SOAK_ONLY = pytest.mark.skipif(not full_size(), reason="runs in make soak")
CONTROL = pytest.param("none", marks=[pytest.mark.soak, SOAK_ONLY])
DELAYED = pytest.param("delayed", marks=[pytest.mark.soak, SOAK_ONLY])
SLOWDOWN = pytest.param("slowdown", marks=[pytest.mark.soak, SOAK_ONLY])
#: a store refusing every connection under kills: `make test-wide` (its one line is
#: test_a_store_down_while_spark_stages_is_one_line..., its kills the dropped reply's)
REFUSED = pytest.param("refused", marks=pytest.mark.wide)


@pytest.mark.parametrize("fault", [CONTROL, SLOWDOWN, "dropped", DELAYED, REFUSED])
def test_every_record_once_under_a_storage_fault_with_kills_and_restarts(
    faulty_s3: tuple[FaultProxy, dict[str, str]],
    s3_server: S3Server,
    s3_bucket: str,
    kafka_broker: str,
    kafka_client: Any,
    topic_factory: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fault: str,
) -> None:
    """The first run dies while it stages (its folder is left half written); the second,
    under the fault, recovers that batch as a new attempt and catches up; the cleaner,
    under the fault too, deletes the dead attempt's leftovers. "refused": the store refuses
    every connection for 30 s from the moment the first batch has staged."""
    proxy, _env = faulty_s3
    config = write_config(tmp_path, s3_bucket, kafka_broker, topic_factory(2), MAX_RECORDS)
    path = str(tmp_path / f"{config.pipeline}.yaml")
    kafka_client.produce(config.kafka.topic, pageviews(RECORDS, malformed_every=MALFORMED_EVERY))
    timings: dict[str, float] = {}

    arm(proxy, fault)
    killed, timings["killed run"] = exactly_run(
        "run", "-c", path, env={"EXACTLY_CRASH_AT": "during_stage"}
    )
    assert killed.returncode == CRASH_EXIT_CODE, killed.stdout + killed.stderr

    arm(proxy, fault)
    if fault == "refused":
        pauses = tmp_path / "pauses"
        pauses.mkdir()
        env = {"EXACTLY_PAUSE_AT": "after_stage", "EXACTLY_PAUSE_DIR": str(pauses)}
        started = time.monotonic()
        child = subprocess.Popen([*EXACTLY, "run", "-c", path, "--until-caught-up"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env={**os.environ, **env})  # fmt: skip
        while not (pauses / "after_stage.reached").exists():
            assert child.poll() is None, child.communicate()
            time.sleep(0.1)
        reopened = proxy.refuse_for(REFUSE_SECONDS)
        (pauses / "after_stage.resume").touch()
        out, err = child.communicate(timeout=RUN_TIMEOUT)
        timings["run under the fault"] = time.monotonic() - started
        reopened.join()
        print(f"refused: the run under the fault exited {child.returncode}:\n{err[-3000:]}")
        if child.returncode != 0:
            lines = [line for line in err.splitlines() if line.startswith("exactly:")]
            assert child.returncode == 2 and "Traceback" not in err, out + err
            assert lines, err
            caught, timings["recovery run"] = exactly_run("run", "-c", path, "--until-caught-up")
            assert caught.returncode == 0, caught.stdout + caught.stderr
    else:
        caught, timings["run under the fault"] = exactly_run("run", "-c", path, "--until-caught-up")
        assert caught.returncode == 0, caught.stdout + caught.stderr
        assert "caught up" in caught.stdout + caught.stderr

    arm_deletes(proxy, fault)
    cleaned, timings["clean"] = exactly_run("clean", "-c", path, "--older-than", "0s")
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    unfired = [f for f in proxy.armed() if f.times]
    print(f"storage fault {fault}: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))

    # read the results from the server itself: a delta-rs call that holds the GIL in this
    # process would wait forever on the proxy, whose threads are this process's too
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    access = s3_server.access()
    deleted = {key for entry in proxy.log for key in entry.deleted}
    assert deleted, "the cleaner deleted nothing: the dead attempt left no staged file?"
    referenced = referenced_objects(config, access)
    assert not deleted & referenced, (
        f"deleted objects a vote or the table names: {sorted(deleted & referenced)[:5]}"
    )
    assert not [k for k in deleted if "/_delta_log/" in k]
    store = LedgerStore(config.ledger.url)
    committed = {
        b.batch_id
        for b in store.batches(
            pipeline=config.pipeline, states=[BatchState.COMMITTED, BatchState.ACKED]
        )
    }
    store.dispose()
    # each committed batch in each table's log at most once (a batch with no row for a
    # table leaves that table alone), and every one in one of them at least
    in_logs: set[int] = set()
    for root in (config.delta.table_uri, config.delta.quarantine_uri):
        txns = Counter(
            (a["txn"]["appId"], a["txn"]["version"]) for a in delta_log(access, root) if "txn" in a
        )
        assert set(txns.values()) == {1}, f"{root}: a batch committed twice: {txns}"
        in_logs |= {version for _app, version in txns}
    assert in_logs == committed, f"batches in the Delta logs {in_logs}, ledger: {committed}"
    assert assert_exactly_once(config, kafka_client)[0] > 0
    assert not unfired, f"faults that never fired: {unfired}"


#: s3a's own retries cut, so Spark gives up on a store that refuses in seconds, not minutes
S3A_GIVES_UP_SOONER = {
    "spark.hadoop.fs.s3a.retry.limit": "1",
    "spark.hadoop.fs.s3a.retry.interval": "100ms",
    "spark.hadoop.fs.s3a.attempts.maximum": "1",
    "spark.hadoop.fs.s3a.connection.establish.timeout": "2s",
}


def test_a_store_down_while_spark_stages_is_one_line_and_the_next_run_finishes(
    faulty_s3: tuple[FaultProxy, dict[str, str]],
    s3_server: S3Server,
    s3_bucket: str,
    kafka_broker: str,
    kafka_client: Any,
    topic_factory: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The store refuses every connection from just before Spark reads the batch until the
    run has ended: s3a gives up inside Spark, which must reach the operator as one line
    naming the store and the batch (not the Java stack), and nothing is lost."""
    proxy, _env = faulty_s3
    config = write_config(tmp_path, s3_bucket, kafka_broker, topic_factory(2), MAX_RECORDS)
    path = tmp_path / f"{config.pipeline}.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["spark"]["conf"].update(S3A_GIVES_UP_SOONER)
    path.write_text(yaml.safe_dump(doc))
    kafka_client.produce(config.kafka.topic, pageviews(RECORDS, malformed_every=MALFORMED_EVERY))

    pauses = tmp_path / "pauses"
    pauses.mkdir()
    env = {"EXACTLY_PAUSE_AT": "before_stage", "EXACTLY_PAUSE_DIR": str(pauses)}
    started = time.monotonic()
    child = subprocess.Popen(
        [*EXACTLY, "run", "-c", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    while not (pauses / "before_stage.reached").exists():
        assert child.poll() is None, child.communicate()
        time.sleep(0.1)
    proxy.refuse()
    try:
        (pauses / "before_stage.resume").touch()
        _out, err = child.communicate(timeout=RUN_TIMEOUT)
    finally:
        proxy.reopen()
    failed_after = time.monotonic() - started
    unstacked = "\n".join(ln for ln in err.splitlines() if not ln.lstrip().startswith("at "))
    assert child.returncode == 2 and "Traceback" not in err, unstacked[-8000:]
    (line,) = [ln for ln in err.splitlines() if ln.startswith("exactly: error: ")]
    assert f"s3://{s3_bucket}/" in line and "while Spark staged" in line, line
    assert "\tat " not in line and len(line) < 1000, line

    caught, recovery = exactly_run("run", "-c", str(path), "--until-caught-up")
    assert caught.returncode == 0, caught.stdout + caught.stderr
    print(f"store down while Spark stages: failed {failed_after:.1f}s, recovery {recovery:.1f}s")
    # from the server itself: delta-rs in this process would wait on the in-process proxy
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    assert_exactly_once(config, kafka_client)
