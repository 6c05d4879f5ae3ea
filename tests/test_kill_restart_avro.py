"""The random-kill test (tests/test_kill_restart.py) on a pipeline that decodes Avro on the
Confluent wire (`format: avro`, no transform): while a producer keeps writing orders (every
25th value broken: a cut-short datum, a wrong magic byte or an unknown schema id, by turns),
`exactly run` is SIGKILLed at random moments, process group and Spark JVM at once, and
started again; after a last run every record Kafka holds is in the table or the quarantine
exactly once, and the quarantine holds exactly the broken ones.

Its own file, beside the page-view one, which others extend (several topics, partitioned
tables); it reuses that file's kill machinery and seed (`EXACTLY_KILL_SEED`).
"""

from __future__ import annotations

import random
import subprocess
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable

from ledger.store.ledger_store import LedgerStore
from resources.config.loading import load_config
from resources.kafka.client import KafkaClient
from tests.fixtures.derived import assert_derived_match
from tests.fixtures.pipeline import assert_exactly_once, config_path
from tests.fixtures.spark_conf import suite_spark
from tests.test_avro_format import ORDER_V1, confluent, order, schema_file, with_format
from tests.test_cli import EXACTLY, REPO
from tests.test_kill_restart import (
    FINAL_RUN_TIMEOUT,
    FINISHED,
    KILL_AFTER_FIRST_BATCH,
    KILL_AFTER_START,
    KILLS,
    MAX_RECORDS_PER_PARTITION,
    MAX_RUNS,
    PRODUCE_EVERY,
    RECORDS_PER_ROUND,
    kill_seed,
    run_and_kill,
)
from tests.test_pipeline_topics import assert_exactly_once_on

#: `make test-wide`: the kills of tests/test_kill_restart.py, the decoding of
#: tests/test_avro_format.py and the partitioned tables of test_partitioned_*.py, at once.
pytestmark = [pytest.mark.integration, pytest.mark.soak, pytest.mark.wide]

BROKEN_EVERY = 25


def value(i: int) -> bytes:
    """Order `i` on the Confluent wire as schema id 1; every BROKEN_EVERY-th broken."""
    good = confluent(1, ORDER_V1, order(i))
    if i % BROKEN_EVERY != BROKEN_EVERY - 1:
        return good
    kind = (i // BROKEN_EVERY) % 3
    if kind == 0:
        return good[:8]  # the datum cut short
    if kind == 1:
        return b"\x07" + good[1:]  # a wrong magic byte
    return confluent(42, ORDER_V1, order(i))  # an unknown schema id


class AvroProducer(threading.Thread):
    """Produces orders until stopped, with a client of its own."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(name="kill-restart-avro-producer", daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.produced = 0
        self.error: BaseException | None = None
        self.writing = threading.Event()
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            with KafkaClient(self.bootstrap, timeout=60) as client:
                while not self._stopping.is_set():
                    start = self.produced
                    values = [value(i) for i in range(start, start + RECORDS_PER_ROUND)]
                    self.produced += client.produce(self.topic, values)
                    self.writing.set()
                    self._stopping.wait(PRODUCE_EVERY)
        except BaseException as error:  # re-raised by the test through `finish`
            self.error = error

    def finish(self) -> int:
        self._stopping.set()
        self.join(timeout=120)
        if self.error is not None:
            raise self.error
        return self.produced


def kill_while_producing(
    config: Any,
    producer: AvroProducer,
    tmp_path: Path,
    after_run: Callable[[int], None] = lambda _n: None,
) -> tuple[str, int]:
    """Start `producer`, kill `exactly run` KILLS times at seeded moments (calling
    `after_run(n)` after run n), stop the producer, then run once more until caught up.
    Returns the kill history (for every assertion message) and how many records were
    produced."""
    seed = kill_seed()
    rng = random.Random(seed)
    kills: list[str] = []
    producer.start()
    try:
        assert producer.writing.wait(timeout=120), "the producer wrote nothing"
        for n in range(MAX_RUNS):
            late = sum(1 for k in kills if " killed " in k) % 2 == 0
            delay = rng.uniform(*(KILL_AFTER_FIRST_BATCH if late else KILL_AFTER_START))
            last = run_and_kill(config, delay, tmp_path / f"run-{n}.log", after_first_batch=late)
            kills.append(
                f"run {n} ended on its own"
                if last is None
                else f"run {n} killed {delay:.1f} s: {last}"
            )
            after_run(n)
            if sum(1 for k in kills if " killed " in k) == KILLS:
                break
    finally:
        produced = producer.finish()
    history = f"seed {seed} (EXACTLY_KILL_SEED={seed} replays it); " + "; ".join(kills)
    assert sum(1 for k in kills if " killed " in k) == KILLS, history
    final = subprocess.run(
        [*EXACTLY, "run", "-c", str(config_path(config)), "--until-caught-up"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=FINAL_RUN_TIMEOUT,
    )
    assert final.returncode == 0, f"{history}\n{final.stdout}{final.stderr}"
    return history, produced


def test_every_avro_record_once_after_random_kills_while_producing(
    kafka_broker: str, kafka_client: KafkaClient, pipeline_factory: Any, tmp_path: Path
) -> None:
    config = with_format(
        pipeline_factory(3, max_records=MAX_RECORDS_PER_PARTITION),
        tmp_path,
        {
            "kind": "avro",
            "wire": "confluent",
            "schema_ids": {1: schema_file(tmp_path, "v1", ORDER_V1)},
        },
    )
    producer = AvroProducer(kafka_broker, config.kafka.topic)
    history, produced = kill_while_producing(config, producer, tmp_path)
    try:
        table_rows, quarantined = assert_exactly_once(config, kafka_client)
    except AssertionError as failure:
        raise AssertionError(f"{history}: {failure}") from failure
    assert table_rows + quarantined == produced, history
    assert quarantined == produced // BROKEN_EVERY, history
    store = LedgerStore(config.ledger.url)
    try:
        assert all(b.state in FINISHED for b in store.batches(app_id=config.app_id)), history
    finally:
        store.dispose()


#: Orders with an event time, for the date-partitioned table and the hourly aggregate: the
#: times walk across Paris midnights (a record at 23:30 UTC is the next day there).
ORDER_TS: dict[str, Any] = {
    "type": "record",
    "name": "TimedOrder",
    "namespace": "shop",
    "fields": [
        {"name": "order_id", "type": "long"},
        {
            "name": "amount",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2},
        },
        {"name": "city", "type": ["null", "string"], "default": None},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    ],
}
_START = datetime(2026, 3, 1, 21, 0, tzinfo=UTC)


def timed_value(i: int) -> bytes:
    """Timed order `i` on the Confluent wire; every BROKEN_EVERY-th one broken."""
    record = {
        "order_id": i,
        "amount": Decimal(f"{i % 997}.{i % 100:02d}"),
        "city": None if i % 7 == 0 else f"city-{i % 3}",
        "ts": _START + timedelta(minutes=7 * i),
    }
    good = confluent(1, ORDER_TS, record)
    return good if i % BROKEN_EVERY != BROKEN_EVERY - 1 else good[:7]


class TopicsProducer(AvroProducer):
    """Produces timed orders to every topic in `topics` (which may grow while it runs)."""

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        super().__init__(bootstrap, topics[0])
        self.topics = topics

    def run(self) -> None:
        try:
            with KafkaClient(self.bootstrap, timeout=60) as client:
                while not self._stopping.is_set():
                    for topic in list(self.topics):
                        start = self.produced
                        values = [timed_value(i) for i in range(start, start + RECORDS_PER_ROUND)]
                        self.produced += client.produce(topic, values)
                    self.writing.set()
                    self._stopping.wait(PRODUCE_EVERY)
        except BaseException as error:  # re-raised by the test through `finish`
            self.error = error


def test_two_topics_by_pattern_avro_into_a_date_partitioned_table_with_an_aggregate(
    kafka_broker: str, kafka_client: KafkaClient, tmp_path: Path
) -> None:
    """The issue's pipeline under the random kills: a pattern that matches one topic at the
    start and a second one created between two kills (picked up from `starting_offsets`),
    Avro on the Confluent wire, a table partitioned by the Paris day of the event time, and
    an hourly aggregate (a count and an exact decimal sum) partitioned by its window's day.
    After the last run: every record of both topics once in the table or the quarantine,
    the broken ones quarantined, the aggregate equal to its recomputation, every batch
    finished."""
    prefix = f"orders-{uuid.uuid4().hex[:8]}"
    first, second = f"{prefix}-eu", f"{prefix}-us"
    kafka_client.create_topic(first, 3)
    paris = {"time_zone": "Europe/Paris"}
    doc = {
        "pipeline": "orders",
        "kafka": {"bootstrap_servers": kafka_broker, "pattern": f"{prefix}-.*"},
        "delta": {
            "table_uri": f"{tmp_path}/table",
            "quarantine_uri": f"{tmp_path}/quarantine",
            "partition_by": [{"name": "order_date", "date_of": "ts", **paris}],
        },
        "ledger": {"url": f"sqlite:///{tmp_path / 'ledger.db'}"},
        "spark": suite_spark(),
        "batch": {"max_records_per_partition": MAX_RECORDS_PER_PARTITION},
        "format": {
            "kind": "avro",
            "wire": "confluent",
            "schema_ids": {1: schema_file(tmp_path, "timed", ORDER_TS)},
        },
        "derived": [
            {
                "kind": "aggregate",
                "name": "orders_per_city_hour",
                "table_uri": f"{tmp_path}/per_city_hour",
                "group_by": ["city"],
                "window": {"column": "ts", "size": "1 hour"},
                "measures": [
                    {"name": "orders", "fn": "count"},
                    {"name": "amount", "fn": "sum", "column": "amount"},
                ],
                "partition_by": [{"name": "window_date", "date_of": "window_start", **paris}],
            }
        ],
    }
    path = tmp_path / "orders.yaml"
    path.write_text(yaml.safe_dump(doc))
    config = load_config(path)
    object.__setattr__(config, "_path", path)

    topics = [first]
    producer = TopicsProducer(kafka_broker, topics)

    def second_topic_after_the_first_run(n: int) -> None:
        if n == 0:  # a second topic matches the pattern between two kills
            kafka_client.create_topic(second, 2)
            topics.append(second)

    history, produced = kill_while_producing(
        config, producer, tmp_path, after_run=second_topic_after_the_first_run
    )
    try:
        stored = assert_exactly_once_on(config, kafka_client, [first, second])
        assert_derived_match(config)
    except AssertionError as failure:
        raise AssertionError(f"{history}: {failure}") from failure
    assert stored == produced, history
    quarantined = DeltaTable(config.delta.quarantine_uri).to_pyarrow_table().num_rows
    assert quarantined == produced // BROKEN_EVERY, history
    table = DeltaTable(config.delta.table_uri)
    assert table.metadata().partition_columns == ["order_date"], history
    adds = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    assert len({add["partition.order_date"] for add in adds}) > 1, history
    topics_landed = set(table.to_pyarrow_table(columns=["_kafka_topic"]).column(0).to_pylist())
    assert topics_landed == {first, second}, history
    store = LedgerStore(config.ledger.url)
    try:
        assert all(b.state in FINISHED for b in store.batches(app_id=config.app_id)), history
    finally:
        store.dispose()
