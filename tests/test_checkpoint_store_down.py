"""A store that stops answering while a checkpoint is written (resources/delta/checkpoints.py),
on the loopback S3 server behind the fault proxy: the process that committed the batches
ends without waiting out the store's retries, says in one warning what it left, and the
next process's first commit writes the checkpoint. A process killed while its checkpoint is in
flight leaves nothing a reader trips on, even when that PUT lands after its death.

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
from collections.abc import Callable
from dataclasses import dataclass
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


def publish_batches(uri: str, batch_ids: list[int]) -> None:
    """In the child: the table with checkpoint interval 2 (created if absent), then one
    publish of one staged file per batch id."""
    from deltalake import write_deltalake

    from jobs.stage.parquet_files import describe
    from tests.fixtures.s3 import put_object

    target = DeltaTarget(uri)
    if target.load() is None:
        configuration = {"delta.checkpointInterval": "2"}
        write_deltalake(
            uri,
            pa.table({"n": []}, SCHEMA),
            configuration=configuration,
            storage_options=target.storage_options,
        )
    for batch_id in batch_ids:
        buffer = io.BytesIO()
        pq.write_table(pa.table({"n": [batch_id]}, SCHEMA), buffer)
        folder = storage.join(uri, "staged", f"batch-{batch_id}")
        put_object(storage.join(folder, "part-0.parquet"), buffer.getvalue())
        staged = describe(folder, uri, "table")  # as the vote records them
        target.publish(app_id="p", batch_id=batch_id, files=staged, schema=SCHEMA, metadata={})
    print("published", batch_ids, flush=True)


def child(
    uri: str, batch_ids: list[int], env: dict[str, str], work: Callable[..., None] | None = None
) -> tuple[float, str, str, int]:
    """Run `work(uri, batch_ids)` (publish_batches by default) in a child process: (seconds
    until it ended, its stdout, its stderr, its exit code)."""
    started = time.monotonic()
    args, child_env = child_command(uri, batch_ids, env, work)
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, env=child_env)
    return time.monotonic() - started, done.stdout, done.stderr, done.returncode


def child_command(
    uri: str, batch_ids: list[int], env: dict[str, str], work: Callable[..., None] | None = None
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of a child that runs `work(uri, batch_ids)`."""
    name = "publish_batches" if work is None else work.__name__
    code = f"from {__name__} import {name}; {name}({uri!r}, {batch_ids!r})"
    return [sys.executable, "-c", code], {
        **os.environ,
        **env,
        "PYTHONPATH": str(Path(__file__).parents[1]),
    }


def hold_checkpoint_puts(proxy: FaultProxy, path_contains: str) -> None:
    """The store stops answering the PUTs of checkpoint files (`path_contains`)."""
    puts = frozenset({"PUT"})
    proxy.inject(Delay(times=100, methods=puts, path_contains=path_contains, seconds=HELD_SECONDS))


def answer_again(proxy: FaultProxy) -> None:
    for fault in proxy.armed():
        fault.times = 0


def assert_ended_quietly(took: float, err: str) -> None:
    """The child ended without waiting out delta-rs's retries, with no traceback."""
    assert took < ENDS_WITHIN, f"the process ended {took:.0f} s after it started: {err}"
    assert "Traceback" not in err and "Fatal" not in err and "panicked" not in err


@dataclass
class Store:
    """The loopback S3 server, the fault proxy in front of it, and this test's bucket."""

    proxy: FaultProxy
    env: dict[str, str]  # the AWS variables that point a child at the proxy
    server: S3Server
    bucket: str
    monkeypatch: pytest.MonkeyPatch

    def read_past_the_proxy(self, uri: str) -> DeltaTable:
        """The table read from the server itself: delta-rs holds the GIL that the proxy's
        threads (this process's) would need to answer it."""
        for name, value in self.server.env().items():
            self.monkeypatch.setenv(name, value)
        return DeltaTable(uri, storage_options=DeltaTarget(uri).storage_options)


@pytest.fixture
def store(
    faulty_s3: tuple[FaultProxy, dict[str, str]],
    s3_server: S3Server,
    s3_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Store:
    return Store(*faulty_s3, s3_server, s3_bucket, monkeypatch)


def test_a_store_down_for_the_checkpoint_does_not_hold_the_process_and_the_next_writes_it(
    store: Store,
) -> None:
    proxy, env, uri = store.proxy, store.env, f"s3://{store.bucket}/table"
    hold_checkpoint_puts(proxy, "/_delta_log/00000000000000000002.checkpoint.parquet")

    took, out, err, code = child(uri, [1, 2], env)  # version 2 is due
    assert code == 0, err
    assert "published [1, 2]" in out
    assert_ended_quietly(took, err)
    assert "checkpoint of" in err and "at version 2" in err and "next commit" in err

    answer_again(proxy)
    took, out, err, code = child(uri, [3], env)  # version 3: no multiple of 2 passed
    assert code == 0, err
    assert storage.exists(storage.join(uri, "_delta_log/00000000000000000003.checkpoint.parquet"))

    table = store.read_past_the_proxy(uri)
    assert sorted(table.to_pyarrow_table()["n"].to_pylist()) == [1, 2, 3]
    assert table.transaction_version("p") == 3


def merge_batches(uri: str, batch_ids: list[int]) -> None:
    """In the child: an aggregate output at `uri` (checkpoint interval 2 from its second
    version), and one MERGE per batch id, each of one row of app "a" sized by the id."""
    from jobs.derived.invariants import recompute_aggregate
    from resources.delta.merge import merge_aggregate
    from tests.test_derived_merge import aggregate_spec, raw

    target, spec = DeltaTarget(uri), aggregate_spec(uri)
    for batch_id in batch_ids:
        rows = raw([("a", batch_id, batch_id)], first_offset=batch_id)
        outcome = merge_aggregate(
            target, spec, recompute_aggregate(rows, spec), app_id="p", batch_id=batch_id
        )
        print("merged", batch_id, outcome.applied, flush=True)
        table = target.load()
        if table is not None and "delta.checkpointInterval" not in table.metadata().configuration:
            table.alter.set_table_properties({"delta.checkpointInterval": "2"})


#: `make test-wide`: a derived output's MERGE checkpoints through the same
#: `checkpoint_if_due` as a batch's commit (resources/delta/merge.py), whose bound on a store
#: that does not answer is the case above in `make test`.
@pytest.mark.wide
def test_a_store_down_for_a_derived_output_s_checkpoint_holds_neither_its_merge_nor_the_process(
    store: Store,
) -> None:
    proxy, env, uri = store.proxy, store.env, f"s3://{store.bucket}/views"
    hold_checkpoint_puts(proxy, ".checkpoint")

    took, out, err, code = child(uri, [1, 2, 3], env, merge_batches)
    assert code == 0, err
    assert [line for line in out.splitlines() if line.startswith("merged")] == [
        "merged 1 True",
        "merged 2 True",
        "merged 3 True",
    ]
    assert_ended_quietly(took, err)

    answer_again(proxy)
    took, out, err, code = child(uri, [4], env, merge_batches)
    assert (code, out.splitlines()[-1]) == (0, "merged 4 True"), err
    table = store.read_past_the_proxy(uri)
    assert table.to_pyarrow_table().to_pylist()[0]["bytes"] == 1 + 2 + 3 + 4
    assert table.transaction_version("p") == 4
    newest = json.loads(storage.read_bytes(storage.join(uri, "_delta_log", "_last_checkpoint")))
    assert newest["version"] >= table.version() - 1


def test_a_process_killed_while_its_checkpoint_is_written_leaves_a_table_every_reader_opens(
    store: Store,
) -> None:
    """SIGKILL while the checkpoint's PUT is in flight (the proxy holds it, body read), the
    way a machine dies: the dead process wrote no `_last_checkpoint`, and its PUT lands 15 s
    after its death, as a request delayed in the network does. The next process's first
    commit writes a checkpoint of its own; readers then open the table at every version,
    the late checkpoint's included, with every row once."""
    proxy, env, uri = store.proxy, store.env, f"s3://{store.bucket}/table"
    version_2 = "_delta_log/00000000000000000002.checkpoint.parquet"
    late = storage.join(uri, version_2)
    proxy.inject(Delay(times=1, methods=frozenset({"PUT"}), path_contains=version_2, seconds=15))
    (held,) = proxy.armed()
    args, child_env = child_command(uri, [1, 2], env)
    dying = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env
    )
    deadline = time.monotonic() + 120
    while held.times:  # the checkpoint's PUT has not reached the store yet
        assert dying.poll() is None, dying.communicate()
        assert time.monotonic() < deadline, "the checkpoint's PUT never came"
        time.sleep(0.05)
    landed_after = time.monotonic() + 15
    dying.kill()
    out, err = dying.communicate(timeout=30)
    assert dying.returncode == -9 and "published [1, 2]" in out, err
    last = storage.join(uri, "_delta_log", "_last_checkpoint")
    assert not storage.exists(last), "the dead process wrote no checkpoint hint"

    _took, out, err, code = child(uri, [3], env)  # its first commit: version 3
    assert code == 0, err
    assert storage.exists(storage.join(uri, "_delta_log/00000000000000000003.checkpoint.parquet"))

    while time.monotonic() < landed_after + 5 and not storage.exists(late):
        time.sleep(0.2)
    assert storage.exists(late), "the late PUT landed"
    assert json.loads(storage.read_bytes(last))["version"] == 3
    table = store.read_past_the_proxy(uri)
    assert sorted(table.to_pyarrow_table()["n"].to_pylist()) == [1, 2, 3]
    assert table.transaction_version("p") == 3
    table.load_as_version(2)
    assert sorted(table.to_pyarrow_table()["n"].to_pylist()) == [1, 2]
