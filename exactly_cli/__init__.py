"""The `exactly` command line.

Each sub-command lives in a module of this package with a `register(subparsers)` function;
`main` turns every `ExactlyError` into one line on stderr and exit code 2, so scripts and
operators get the problem, not a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ledger.errors import ExactlyError, with_config


def build_parser() -> argparse.ArgumentParser:
    from exactly_cli import (
        backfill_cmd,
        bench_cmd,
        clean_cmd,
        derived_cmd,
        kafka_cmd,
        pipeline_cmd,
        skip_cmd,
        spark_cmd,
    )

    parser = argparse.ArgumentParser(
        prog="exactly",
        description="Exactly-once micro-batches from Kafka into Delta Lake.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    kafka_cmd.register(sub)
    pipeline_cmd.register(sub)
    bench_cmd.register(sub)
    backfill_cmd.register(sub)
    clean_cmd.register(sub)
    derived_cmd.register(sub)
    skip_cmd.register(sub)
    spark_cmd.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ExactlyError as exc:
        print(f"exactly: error: {error_line(exc, args)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("exactly: interrupted", file=sys.stderr)
        return 130


def error_line(exc: ExactlyError, args: argparse.Namespace) -> str:
    """The error as one line; a command it tells the operator to run names the config file
    this command was given, so it can be copied as it is.

    One line even when a driver's message spans several (psycopg's "Connection refused" is
    followed by a tab-indented "Is the server running ...?"; Java exceptions bring their
    causes): scripts and alert rules read the first line of stderr, and a second line
    would look like a second error. The lines are joined, nothing is dropped.
    """
    config = getattr(args, "config", None)
    text = with_config(str(exc), str(config)) if config else str(exc)
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
