"""The seed's storage-fault incident, on S3: a fault proxy between every S3 client and the
loopback S3 server answers 503 SlowDown in bursts, executes a request and drops its answer
(the client retries an operation that already happened), delays answers, or refuses
connections for a while. Under each, the commit path must publish every batch once and say
truthfully whether it was this call that published it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict

import pytest
from deltalake import DeltaTable

from jobs.parquet_files import describe
from ledger.batch import StagedFile
from ledger.protocol import OffsetRange
from resources import storage
from resources.delta import DeltaTarget
from tests.fixtures.fault_proxy import DropResponse, Fault, FaultProxy, SlowDown
from tests.fixtures.race_publisher import SCHEMA, parquet_of
from tests.fixtures.s3 import put_object

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
    assert target.publish(app_id=APP, batch_id=1, files=first, schema=SCHEMA, metadata=meta).published
    second = staged(root, 2, OffsetRange(TOPIC, 0, 10, 25))
    proxy.inject(fault)
    outcome = target.publish(app_id=APP, batch_id=2, files=second, schema=SCHEMA, metadata=meta)
    assert fault.times == 0, f"the fault never fired: {proxy.log}"
    assert outcome.published, f"the batch's own commit was reported as someone else's: {outcome}"
    assert target.transaction_version(APP) == 2
    assert offsets(root) == Counter((0, o) for o in range(25))
    print([entry for entry in proxy.log if "_delta_log" in entry.path])
