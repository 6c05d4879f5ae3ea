"""The `exactly` command line.

Each sub-command lives in a module of this package with a `register(subparsers)` function;
`main` turns every failure into one line on stderr, so scripts and operators get the problem,
not a traceback: an `ExactlyError`, or an error whose cause is known (a full disk, a read-only
folder, Spark out of memory, ...: resources/failures/causes.py), is one line naming the cause and
the path or service, exit code 2; anything unforeseen is one line naming the log file (under the
state folder) that holds its full traceback, exit code 1. Log records of any library (py4j
logs a lost JVM with its traceback) go to a file there too, never to the terminal.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ledger.core.errors import ExactlyError, with_config
from resources.failures.causes import FailureContext, context_of
from resources.failures.lines import UNFORESEEN, describe_failure, log_records_to_file

#: The exit code of a failure no known cause explains (a known one's is ExactlyError's, 2).
UNFORESEEN_EXIT_CODE = 1


def build_parser() -> argparse.ArgumentParser:
    from exactly_cli import (
        abandon_cmd,
        backfill_cmd,
        bench_cmd,
        clean_cmd,
        demo_cmd,
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
    demo_cmd.register(sub)
    bench_cmd.register(sub)
    backfill_cmd.register(sub)
    clean_cmd.register(sub)
    derived_cmd.register(sub)
    skip_cmd.register(sub)
    abandon_cmd.register(sub)
    spark_cmd.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    log_records_to_file()
    try:
        return int(args.func(args) or 0)
    except ExactlyError as exc:
        print(f"exactly: error: {error_line(exc, args)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("exactly: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        line, code = failure_line(exc, args)
        print(f"exactly: error: {line}", file=sys.stderr)
        return code


def failure_line(exc: Exception, args: argparse.Namespace) -> tuple[str, int]:
    """The one line and exit code for an error that is not an `ExactlyError`.

    A known cause (resources/failures/causes.py) is said as an ExactlyError would be, exit code 2:
    the operator can act on it. Anything else is a bug or a failure nobody foresaw: its full
    traceback (the Java stack too) goes to a log file, which the line names, exit code 1.
    """
    found = describe_failure(exc, f"exactly {args.command}", failure_context(args))
    unforeseen = found.cause == UNFORESEEN
    return found.line, UNFORESEEN_EXIT_CODE if unforeseen else ExactlyError.exit_code


def failure_context(args: argparse.Namespace) -> FailureContext:
    """The pipeline's locations and services, from the config the command was given, for
    an error whose text does not name them; none when there is no config or it cannot be
    read (the error may be about that)."""
    config_file = getattr(args, "config", None)
    if not config_file:
        return FailureContext()
    try:
        from resources.config.loading import load_config

        return context_of(load_config(config_file))
    except Exception:
        return FailureContext()


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
