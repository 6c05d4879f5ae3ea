"""A store that stops answering while a checkpoint is written (resources/delta/checkpoints.py),
on the loopback S3 server behind the fault proxy: the process that committed the batches
ends without waiting out the store's retries, says in one warning what it left, and the
next process's first commit writes the checkpoint.

The publishing runs in a child process (the product's DeltaTarget.publish, the same call the
publish op makes), because what is under test is how a process ends; and because the
proxy's threads are this process's, and delta-rs holds the GIL while it waits for a store.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from resources.delta.table import DeltaTarget
from resources.object_storage import storage
from resources.object_storage.embedded_s3 import S3Server
from tests.fixtures.fault_proxy import Delay, FaultProxy

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("n", pa.int64())])
#: delta-rs gives up on a store that does not answer after its retry timeout, 120 s; the
#: checkpoint's PUT is held far longer, so only the process's own bound can end it sooner.
HELD_SECONDS = 400.0
#: Well under delta-rs's 120 s and well over a child's start, publishes and bounded wait.
ENDS_WITHIN = 75.0


def publish_batches(uri: str, batch_ids: list[int], interval: int) -> None:
    """In the child: the table with checkpoint interval `interval` (created if absent), then
    one publish of one staged file per batch id."""
    from deltalake import write_deltalake

    from ledger.core.batch import StagedFile
    from resources.delta.stats import delta_stats
    from tests.fixtures.s3 import put_object

    target = DeltaTarget(uri)
    if target.load() is None:
        configuration = {"delta.checkpointInterval": str(interval)}
        write_deltalake(
            uri,
            pa.table({"n": []}, SCHEMA),
            configuration=configuration,
            storage_options=target.storage_options,
        )
    for batch_id in batch_ids:
        buffer = io.BytesIO()
        pq.write_table(pa.table({"n": [batch_id]}, SCHEMA), buffer)
        body, name = buffer.getvalue(), f"staged/b{batch_id}.parquet"
        put_object(storage.join(uri, name), body)
        stats = json.dumps(delta_stats(pq.read_metadata(io.BytesIO(body))))
        staged = StagedFile("table", name, len(body), 1, int(time.time() * 1000), stats)
        target.publish(app_id="p", batch_id=batch_id, files=[staged], schema=SCHEMA, metadata={})
    print("published", batch_ids, flush=True)


def child(uri: str, batch_ids: list[int], env: dict[str, str]) -> tuple[float, str, str, int]:
    started = time.monotonic()
    code = f"from {__name__} import publish_batches; publish_batches({uri!r}, {batch_ids!r}, 2)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env, "PYTHONPATH": str(Path(__file__).parents[1])},
    )
    return time.monotonic() - started, done.stdout, done.stderr, done.returncode


def test_a_store_down_for_the_checkpoint_does_not_hold_the_process_and_the_next_writes_it(
    faulty_s3: tuple[FaultProxy, dict[str, str]],
    s3_server: S3Server,
    s3_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proxy, env = faulty_s3
    uri = f"s3://{s3_bucket}/table"
    checkpoint = "/_delta_log/00000000000000000002.checkpoint.parquet"
    puts = frozenset({"PUT"})
    proxy.inject(Delay(times=100, methods=puts, path_contains=checkpoint, seconds=HELD_SECONDS))

    took, out, err, code = child(uri, [1, 2], env)  # version 2 is due
    assert code == 0, err
    assert "published [1, 2]" in out
    assert took < ENDS_WITHIN, f"the process ended {took:.0f} s after it started: {err}"
    assert "checkpoint of" in err and "at version 2" in err and "next commit" in err
    assert "Traceback" not in err and "Fatal" not in err and "panicked" not in err

    for fault in proxy.armed():
        fault.times = 0  # the store answers again
    took, out, err, code = child(uri, [3], env)  # version 3: no multiple of 2 passed
    assert code == 0, err
    assert storage.exists(storage.join(uri, "_delta_log/00000000000000000003.checkpoint.parquet"))

    # read past the proxy: delta-rs holds the GIL the proxy's threads need to answer it
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    table = DeltaTable(uri, storage_options=DeltaTarget(uri).storage_options)
    assert sorted(table.to_pyarrow_table()["n"].to_pylist()) == [1, 2, 3]
    assert table.transaction_version("p") == 3
