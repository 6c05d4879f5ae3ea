"""`exactly spark-server`: the host's shared Spark Connect servers
(resources/spark/shared_server.py).

    exactly spark-server status   every shared server recorded here: pid, port, running or not
    exactly spark-server stop     stop them all

A shared server outlives the runs that use it, by design; `stop` is how an operator frees its
memory or makes it start again with a changed jar or setting (a changed setting already
starts a server of its own). A run staging at that moment fails before its vote, and its
batch is planned again.
"""

from __future__ import annotations

import argparse

from resources.spark.shared_server import servers, state_dir, stop_servers


def register(sub: argparse._SubParsersAction) -> None:
    cmd = sub.add_parser(
        "spark-server",
        help="list or stop this host's shared Spark Connect servers (spark.server: shared)",
    )
    actions = cmd.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("status", help="list the shared servers").set_defaults(func=status)
    actions.add_parser("stop", help="stop every shared server").set_defaults(func=stop)


def status(_args: argparse.Namespace) -> int:
    found = servers()
    if not found:
        print(f"no shared Spark server recorded under {state_dir()}")
    for server in found:
        state = "running" if server.is_ours() else "gone"
        print(
            f"{server.url}  pid {server.pid}  master {server.master}  {state}  "
            f"log {server.folder / 'server' / 'connect-server.log'}"
        )
    return 0


def stop(_args: argparse.Namespace) -> int:
    stopped = stop_servers()
    print(f"stopped {len(stopped)} shared Spark server(s)")
    return 0
