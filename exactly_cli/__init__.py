"""The `exactly` command line.

Each sub-command lives in a module of this package with a `register(subparsers)` function;
`main` turns every `ExactlyError` into one line on stderr and exit code 2, so scripts and
operators get the problem, not a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ledger.errors import ExactlyError


def build_parser() -> argparse.ArgumentParser:
    from exactly_cli import backfill_cmd, bench_cmd, clean_cmd, kafka_cmd, pipeline_cmd

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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ExactlyError as exc:
        print(f"exactly: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("exactly: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
