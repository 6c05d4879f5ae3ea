"""The embedded broker and the Kafka client against a real broker: no mocks.

What these tests pin down is what the exactly-once protocol leans on: one JVM per data dir,
exact offsets per partition, and a partition end that is the last stable offset, never the
high watermark.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from ledger.core.errors import ExactlyError
from ledger.core.protocol import Available
from resources.jvm.process import free_port
from resources.kafka.broker_config import cluster_id, read_properties
from resources.kafka.client import KafkaClient
from resources.kafka.embedded_broker import AlreadyRunningError, EmbeddedBroker
from tests.fixtures.kafka_reader import Record, consume_range

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT = 180.0


def exactly_command() -> list[str]:
    """The installed console script, or the module if the venv has no script yet."""
    script = Path(sys.executable).parent / "exactly"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "exactly_cli"]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*exactly_command(), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def broker_jvms(data_dir: Path) -> list[int]:
    """Pids of every kafka.Kafka JVM running this data dir's server.properties."""
    properties = str(data_dir.resolve() / "server.properties")
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "kafka.Kafka" in args and properties in args:
            pids.append(int(cmdline.parent.name))
    return pids


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


# -- broker lifecycle ---------------------------------------------------------------------------


def test_broker_lifecycle_keeps_one_jvm_per_data_dir(tmp_path: Path) -> None:
    data_dir = tmp_path / "kafka"
    broker = EmbeddedBroker(data_dir, port=free_port())
    bootstrap = broker.start(timeout=START_TIMEOUT)
    try:
        assert bootstrap == f"127.0.0.1:{broker.port}"
        KafkaClient(bootstrap).check_reachable(timeout=30)
        status = broker.status()
        assert status.running and status.bootstrap == bootstrap and status.data_dir == data_dir
        assert status.pid == int((data_dir / "broker.pid").read_text())
        assert broker_jvms(data_dir) == [status.pid]

        with pytest.raises(AlreadyRunningError, match=f"already running at {bootstrap}"):
            EmbeddedBroker(data_dir, port=broker.port).start(timeout=START_TIMEOUT)
        cli = run_cli("kafka", "start", "--data-dir", str(data_dir), "--port", str(broker.port))
        assert cli.returncode == 0, cli.stderr
        assert f"already running at {bootstrap} (pid {status.pid}" in cli.stdout
        assert run_cli("kafka", "status", "--data-dir", str(data_dir)).returncode == 0
        assert broker_jvms(data_dir) == [status.pid]
    finally:
        assert broker.stop() is True

    assert not broker.status().running
    assert not (data_dir / "broker.pid").exists()
    assert broker_jvms(data_dir) == []
    assert broker.stop() is False
    assert run_cli("kafka", "status", "--data-dir", str(data_dir)).returncode == 1


def test_restart_reuses_storage_moves_port_and_ignores_stale_pid(tmp_path: Path) -> None:
    data_dir = tmp_path / "kafka"
    with EmbeddedBroker(data_dir, port=free_port()) as first:
        KafkaClient(first.bootstrap).create_topic("kept", 2)
    meta = (data_dir / "kafka-logs" / "meta.properties").read_text()

    (data_dir / "broker.pid").write_text(f"{dead_pid()}\n")
    assert not EmbeddedBroker(data_dir).status().running

    with EmbeddedBroker(data_dir, port=free_port()) as second:
        assert second.port != first.port
        listeners = read_properties(data_dir / "server.properties")["listeners"]
        assert f"PLAINTEXT://127.0.0.1:{second.port}," in listeners
        assert KafkaClient(second.bootstrap).partitions("kept") == [0, 1]
    assert (data_dir / "kafka-logs" / "meta.properties").read_text() == meta


def test_start_on_a_taken_port_names_the_port(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        broker = EmbeddedBroker(tmp_path / "kafka", port=port)
        with pytest.raises(ExactlyError, match=f"port {port} on 127.0.0.1 is already in use"):
            broker.start(timeout=START_TIMEOUT)
    assert not broker.status().running
    assert broker_jvms(tmp_path / "kafka") == []


def test_free_ports_are_picked_below_the_range_outgoing_connections_take() -> None:
    """The kernel's pick (bind to port 0) is an ephemeral port, which any outgoing
    connection may take before the server binds it; free_port picks below that range, a
    different port each time, each one bindable, also with `random` seeded alike."""
    import random

    from resources.jvm.process import LISTEN_PORTS_FROM, _ephemeral_start

    random.seed(7)
    picked = [free_port() for _ in range(20)]
    assert all(LISTEN_PORTS_FROM <= p < _ephemeral_start() for p in picked), picked
    assert len(set(picked)) > 15
    for port in picked[:3]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_taken_after_the_check_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A port checked free can be taken before the JVM binds it, seconds later (an outgoing
    connection's ephemeral port, another server): the broker then exits, and the error
    quoted the last lines of its log, its shutdown, not the bind that failed. The port is
    taken here after the check (the check made a no-op), by a real listening socket."""
    from resources.kafka.embedded_broker import PortTakenError

    monkeypatch.setattr(EmbeddedBroker, "_require_free_port", lambda *_args: None)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        broker = EmbeddedBroker(tmp_path / "kafka", port=port)
        with pytest.raises(PortTakenError, match=f"could not listen on 127.0.0.1:{port}") as e:
            broker.start(timeout=START_TIMEOUT)
    assert "\n" not in str(e.value) and "broker.log" in str(e.value)
    assert not broker.status().running
    assert broker_jvms(tmp_path / "kafka") == []


# -- client against the session broker ----------------------------------------------------------


def test_produce_and_consume_round_trip_with_exact_offsets(
    kafka_broker: str, kafka_client: KafkaClient, topic_factory: Callable[[int], str]
) -> None:
    topic = topic_factory(3)
    by_partition = {p: [f"p{p}-r{i}".encode() for i in range(3 + 2 * p)] for p in range(3)}
    assert kafka_client.produce_to_partitions(topic, by_partition) == 3 + 5 + 7
    assert kafka_client.produce(topic, ["extra-0", "extra-1"], partition=1) == 2

    expected = {**by_partition, 1: [*by_partition[1], b"extra-0", b"extra-1"]}
    for partition, values in expected.items():
        records = consume_range(kafka_client, topic, partition, 0, len(values))
        assert records == [Record(offset, value) for offset, value in enumerate(values)]
    assert consume_range(kafka_client, topic, 2, 3, 5) == [
        Record(3, b"p2-r3"),
        Record(4, b"p2-r4"),
    ]
    assert kafka_client.offsets(topic, [0, 1, 2]) == {
        0: Available(0, 3),
        1: Available(0, 7),
        2: Available(0, 7),
    }
    assert KafkaClient(kafka_broker).partitions(topic) == [0, 1, 2]


def test_offsets_end_at_the_last_stable_offset_of_transactions(
    kafka_broker: str, kafka_client: KafkaClient, topic_factory: Callable[[int], str]
) -> None:
    topic = topic_factory(1)
    producer = Producer(
        {"bootstrap.servers": kafka_broker, "transactional.id": f"test-{uuid.uuid4().hex}"}
    )
    producer.init_transactions(60)

    def transaction(values: list[bytes], *, commit: bool | None) -> None:
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, value=value, partition=0)
        producer.flush(60)
        if commit is True:
            producer.commit_transaction(60)
        elif commit is False:
            producer.abort_transaction(60)

    transaction([b"a", b"b", b"c"], commit=True)  # offsets 0-2, marker 3
    transaction([b"x", b"y"], commit=False)  # offsets 4-5 aborted, marker 6
    transaction([b"d"], commit=True)  # offset 7, marker 8
    # the coordinator writes the markers after commit_transaction returns: wait for them
    assert settled_offsets(kafka_client, topic, 9) == Available(earliest=0, last_stable=9)

    transaction([b"open"], commit=None)  # offset 9, still open: LSO stays 9, high watermark 10
    assert kafka_client.offsets(topic, [0])[0].last_stable == 9
    assert high_watermark(kafka_broker, topic) == 10

    producer.commit_transaction(60)  # marker 10
    assert settled_offsets(kafka_client, topic, 11) == Available(earliest=0, last_stable=11)
    committed = consume_range(kafka_client, topic, 0, 0, 11)
    assert committed == [
        Record(0, b"a"),
        Record(1, b"b"),
        Record(2, b"c"),
        Record(7, b"d"),
        Record(9, b"open"),
    ]
    assert len(committed) < 11
    assert consume_range(kafka_client, topic, 0, 4, 7) == []


def settled_offsets(
    client: KafkaClient, topic: str, last_stable: int, timeout: float = 30
) -> Available:
    """Partition 0's offsets once the LSO reached `last_stable` (or the last seen on timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        offsets = client.offsets(topic, [0])[0]
        if offsets.last_stable >= last_stable or time.monotonic() > deadline:
            return offsets
        time.sleep(0.1)


def high_watermark(bootstrap: str, topic: str) -> int:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-{uuid.uuid4().hex}",
            "isolation.level": "read_uncommitted",
        }
    )
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1]
    finally:
        consumer.close()


def test_group_offsets_round_trip(
    kafka_client: KafkaClient, topic_factory: Callable[[int], str]
) -> None:
    topic = topic_factory(3)
    kafka_client.produce_to_partitions(topic, {0: [b"a"] * 5, 1: [b"b"] * 7})
    group = f"test-group-{uuid.uuid4().hex[:8]}"
    assert kafka_client.group_offsets(group, topic) == {}

    kafka_client.commit_group_offsets(group, topic, {0: 5, 1: 3})
    assert kafka_client.group_offsets(group, topic) == {0: 5, 1: 3}
    kafka_client.commit_group_offsets(group, topic, {1: 7, 2: 0})
    assert kafka_client.group_offsets(group, topic) == {0: 5, 1: 7, 2: 0}


@pytest.mark.integration
def test_reading_an_unseen_group_on_a_fresh_cluster_does_not_kill_the_process(
    tmp_path: Path,
) -> None:
    """The checks sensor reads the consumer lag before the group ever committed, and a
    fresh cluster answers its first offset fetch with NOT_COORDINATOR while it loads the
    group metadata: librdkafka's admin offset listing dies of SIGSEGV on that answer. A
    child process asks, so a crash is this test's failure and not the test run's."""
    with EmbeddedBroker(tmp_path / "kafka", port=free_port()) as broker:
        bootstrap = broker.bootstrap
        with KafkaClient(bootstrap, timeout=60) as client:
            client.create_topic("fresh", 2)
        code = (
            "from resources.kafka.client import KafkaClient\n"
            f"with KafkaClient({bootstrap!r}, timeout=60) as client:\n"
            "    print(client.group_offsets('never-committed', 'fresh'))\n"
        )
        child = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
        )
    assert child.returncode == 0, f"exit {child.returncode}: {child.stderr[-2000:]}"
    assert child.stdout.strip() == "{}"


def test_topics_are_created_once_and_must_exist(
    kafka_broker: str, kafka_client: KafkaClient, topic_factory: Callable[[int], str]
) -> None:
    topic = topic_factory(2)
    assert kafka_client.create_topic(topic, 2) is False
    with pytest.raises(ExactlyError, match="already exists with 2 partitions, not 3"):
        kafka_client.create_topic(topic, 3)
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ExactlyError) as missing_error:
        kafka_client.partitions(missing)
    assert (
        str(missing_error.value) == f"topic '{missing}' does not exist on Kafka at {kafka_broker}"
    )


# -- command line -------------------------------------------------------------------------------


def test_cli_create_topic_is_idempotent(kafka_broker: str, kafka_client: KafkaClient) -> None:
    topic = f"cli-{uuid.uuid4().hex[:8]}"
    created = run_cli(
        "kafka", "create-topic", topic, "--partitions", "3", "--bootstrap", kafka_broker
    )
    assert created.returncode == 0, created.stderr
    assert kafka_client.partitions(topic) == [0, 1, 2]
    again = run_cli(
        "kafka", "create-topic", topic, "--partitions", "3", "--bootstrap", kafka_broker
    )
    assert again.returncode == 0, again.stderr
    assert "already exists" in again.stdout

    other = run_cli(
        "kafka", "create-topic", topic, "--partitions", "4", "--bootstrap", kafka_broker
    )
    assert other.returncode == 2
    assert other.stderr.splitlines() == [
        f"exactly: error: topic '{topic}' on Kafka at {kafka_broker} already exists with "
        "3 partitions, not 4"
    ]


def test_cli_create_topic_on_unreachable_kafka_prints_one_line() -> None:
    bootstrap = f"127.0.0.1:{free_port()}"  # bound and closed again: nothing listens
    result = run_cli(
        "kafka",
        "create-topic",
        "t",
        "--partitions",
        "3",
        "--bootstrap",
        bootstrap,
        "--timeout",
        "2",
    )
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"exactly: error: Kafka at {bootstrap} did not answer within 2s")
    assert "Connection refused" in lines[0]
    assert result.stdout == ""


def test_cluster_ids_never_look_like_options() -> None:
    """kafka-storage parses a leading '-' as an option; 1 in 64 random ids would have one."""
    ids = [cluster_id() for _ in range(2000)]
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(i) == 22 for i in ids)
