"""`exactly kafka ...`: run the embedded broker and create topics.

`start` returns as soon as the broker answers (the JVM keeps running in its own session), and
is safe to repeat: a second start on the same data dir reports the running broker and exits 0
instead of launching a second JVM on the same storage.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ledger.core.errors import ConfigError
from resources.kafka.client import KafkaClient
from resources.kafka.embedded_broker import AlreadyRunningError, EmbeddedBroker

DEFAULT_DATA_DIR = Path("data/kafka")
DEFAULT_PORT = 9092
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def register(subparsers: Any) -> None:
    """Add `kafka` and its actions to the top-level sub-command parsers."""
    kafka = subparsers.add_parser(
        "kafka",
        help="run the embedded single-node Kafka broker and create topics",
        description="Run the embedded single-node KRaft broker and create topics.",
    )
    actions = kafka.add_subparsers(dest="kafka_command", required=True, metavar="ACTION")
    _register_start(actions)
    _register_stop(actions)
    _register_status(actions)
    _register_create_topic(actions)


def _add_data_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA_DIR,
        help=f"the broker's config, storage, log and pid file (default: ./{DEFAULT_DATA_DIR})",
    )


def _register_start(actions: Any) -> None:
    parser = actions.add_parser("start", help="start the broker (no-op if already running)")
    _add_data_dir(parser)
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="PLAINTEXT port on 127.0.0.1"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds to wait for the broker to answer (default: 120)",
    )
    parser.set_defaults(func=start)


def _register_stop(actions: Any) -> None:
    parser = actions.add_parser("stop", help="stop the broker (SIGTERM, SIGKILL after 30 s)")
    _add_data_dir(parser)
    parser.set_defaults(func=stop)


def _register_status(actions: Any) -> None:
    parser = actions.add_parser("status", help="exit 0 if the broker runs, 1 if not")
    _add_data_dir(parser)
    parser.set_defaults(func=status)


def _register_create_topic(actions: Any) -> None:
    parser = actions.add_parser(
        "create-topic", help="create a topic (no-op if it exists with the same partitions)"
    )
    parser.add_argument("name", metavar="NAME")
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--replication-factor", type=int, default=1)
    parser.add_argument(
        "--bootstrap",
        default=DEFAULT_BOOTSTRAP,
        help=f"Kafka bootstrap servers (default: {DEFAULT_BOOTSTRAP})",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="seconds to wait for Kafka to answer (default: 10)",
    )
    parser.set_defaults(func=create_topic)


def start(args: argparse.Namespace) -> int:
    """Start, or report the broker already running on this data dir; both exit 0."""
    broker = EmbeddedBroker(args.data_dir, port=args.port)
    try:
        bootstrap = broker.start(timeout=args.timeout)
    except AlreadyRunningError as running:
        print(
            f"kafka: already running at {running.status.bootstrap} "
            f"(pid {running.status.pid}, data dir {running.status.data_dir})"
        )
        return 0
    print(f"kafka: started at {bootstrap} (data dir {broker.data_dir}, log {broker.log_path})")
    return 0


def stop(args: argparse.Namespace) -> int:
    """Stopping a broker that is not running is not an error: the goal state is reached."""
    broker = EmbeddedBroker(args.data_dir)
    before = broker.status()
    if broker.stop():
        print(f"kafka: stopped (pid {before.pid}, data dir {broker.data_dir})")
    else:
        print(f"kafka: not running (data dir {broker.data_dir})")
    return 0


def status(args: argparse.Namespace) -> int:
    current = EmbeddedBroker(args.data_dir).status()
    print(f"kafka: {current.describe()}")
    return 0 if current.running else 1


def create_topic(args: argparse.Namespace) -> int:
    """Check reachability first, so an absent broker fails in `--timeout`, with its reason."""
    if args.partitions < 1:
        raise ConfigError(f"--partitions must be at least 1, not {args.partitions}")
    client = KafkaClient(args.bootstrap, timeout=max(args.timeout, 30.0))
    client.check_reachable(timeout=args.timeout)
    created = client.create_topic(
        args.name, args.partitions, replication_factor=args.replication_factor
    )
    state = "created" if created else "already exists"
    print(
        f"kafka: topic {args.name!r} {state} with {args.partitions} partitions on {args.bootstrap}"
    )
    return 0
