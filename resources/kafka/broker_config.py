"""The embedded broker's configuration files in its data directory: server.properties for
one KRaft node (broker and controller in one JVM, every internal topic on its one replica)
with its listeners, and log4j2.properties.

server.properties is written on the first start and kept: later starts rewrite only the
listener ports that have to move, so hand edits survive. The controller port is chosen once
and kept. What the optional SASL_SSL listener adds is resources/kafka/secure_listener.py's;
running the JVM on this configuration is resources/kafka/embedded_broker.py's.
"""

from __future__ import annotations

import base64
import uuid
from pathlib import Path

from resources.jvm.process import HOST, free_port, port_in_use
from resources.kafka.secure_listener import SecureListener, security_properties

SERVER_PROPERTIES = "server.properties"
LOG4J_PROPERTIES = "log4j2.properties"

LOG4J2 = """\
# Written by exactly on every broker start; edits are overwritten.
status = warn
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
"""


def cluster_id() -> str:
    """A KRaft cluster id: the 16 bytes of a uuid4, base64url without padding.

    Never one that starts with '-' (1 in 64 would): kafka-storage's argument parser takes
    it for an option and formatting fails. Kafka's own Uuid.randomUuid skips those too.
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not text.startswith("-"):
            return text


def read_properties(path: Path) -> dict[str, str]:
    """The `key=value` lines of a properties file we wrote (no continuations or escapes)."""
    result: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith(("#", "!")) and "=" in stripped:
            key, value = stripped.split("=", 1)
            result[key.strip()] = value.strip()
    return result


def update_properties(path: Path, updates: dict[str, str]) -> None:
    """Rewrite only the given keys, keeping every other line (and hand edits) as it was."""
    lines = path.read_text(encoding="utf-8").splitlines()
    pending = dict(updates)
    for index, line in enumerate(lines):
        key = line.split("=", 1)[0].strip()
        if "=" in line and key in pending:
            lines[index] = f"{key}={pending.pop(key)}"
    lines.extend(f"{key}={value}" for key, value in pending.items())
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_config(
    data_dir: Path, port: int, secure: SecureListener | None, storage_dir: Path
) -> None:
    """Write server.properties once; later starts only move ports that have to move.

    The controller port is kept across restarts, and re-chosen only if something else has
    taken it meanwhile: with a static single-voter quorum the endpoint is not recorded in
    the metadata log, so moving it is safe.
    """
    (data_dir / LOG4J_PROPERTIES).write_text(LOG4J2, encoding="utf-8")
    properties_path = data_dir / SERVER_PROPERTIES
    if not properties_path.is_file():
        initial = initial_properties(port, secure, storage_dir)
        properties_path.write_text(initial, encoding="utf-8")
    current = read_properties(properties_path)
    controller_port = int(current["controller.quorum.voters"].rsplit(":", 1)[1])
    if port_in_use(controller_port) or controller_port == port:
        controller_port = _pick_controller_port(port)
    update_properties(properties_path, listener_properties(port, controller_port, secure))


def _pick_controller_port(port: int) -> int:
    while (controller_port := free_port()) == port:
        continue
    return controller_port


def listener_properties(
    port: int, controller_port: int, secure: SecureListener | None
) -> dict[str, str]:
    """The listeners on loopback: the clients' plaintext one on `port`, the controller's,
    and `secure`'s SASL_SSL one."""
    listeners = [f"PLAINTEXT://{HOST}:{port}", f"CONTROLLER://{HOST}:{controller_port}"]
    advertised = [f"PLAINTEXT://{HOST}:{port}"]
    if secure is not None:
        listeners.append(f"SASL_SSL://{secure.bootstrap}")
        advertised.append(f"SASL_SSL://{secure.bootstrap}")
    return {
        "listeners": ",".join(listeners),
        "advertised.listeners": ",".join(advertised),
        "controller.quorum.voters": f"1@{HOST}:{controller_port}",
    }


def initial_properties(port: int, secure: SecureListener | None, storage_dir: Path) -> str:
    """server.properties as the first start writes it, with a newly chosen controller port."""
    listeners = listener_properties(port, _pick_controller_port(port), secure)
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        **listeners,
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        **security_properties(secure),
        "log.dirs": str(storage_dir),
        # One node: every internal topic has exactly one replica, or transactions and
        # group commits would wait forever for replicas that cannot exist.
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "10",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "10",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "min.insync.replicas": "1",
        "group.initial.rebalance.delay.ms": "0",
        # Topics exist because someone created them with a partition count on purpose;
        # a typo in a topic name must fail, not create an empty one-partition topic.
        "auto.create.topics.enable": "false",
        # Two cores: fewer threads than Kafka's defaults (3 network, 8 I/O).
        "num.network.threads": "2",
        "num.io.threads": "4",
        "num.recovery.threads.per.data.dir": "1",
        "log.cleaner.dedupe.buffer.size": str(32 * 1024 * 1024),
    }
    body = "\n".join(f"{key}={value}" for key, value in settings.items())
    return (
        "# Written by `exactly kafka start` on first start. Ports are rewritten when\n"
        "# --port changes; other edits are kept.\n" + body + "\n"
    )
