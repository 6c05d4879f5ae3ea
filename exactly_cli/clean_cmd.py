"""`exactly clean`: delete staged files that no batch needs any more
(jobs/maintenance/cleaner.py)."""

from __future__ import annotations

import argparse

from ledger.core.cleaning import parse_duration
from resources.config.loading import load_config


def register(sub: argparse._SubParsersAction) -> None:
    cmd = sub.add_parser(
        "clean",
        help="delete orphaned staged files of fenced or abandoned attempts",
        description=(
            "Deletes files under the tables' staged/ folders that no vote names, that no "
            "version of either table reads, that no batch in flight may still use, and that "
            "are older than the grace period. Never touches anything else."
        ),
    )
    cmd.add_argument("-c", "--config", required=True, help="pipeline config file (YAML)")
    cmd.add_argument(
        "--older-than",
        metavar="DURATION",
        help="grace period: 30m, 6h, 7d, 0s... (default: the config's clean.older_than, 24h)",
    )
    cmd.add_argument("--dry-run", action="store_true", help="list what would go; delete nothing")
    cmd.set_defaults(func=cmd_clean)


def cmd_clean(args: argparse.Namespace) -> int:
    from jobs.maintenance.cleaner import clean

    grace = parse_duration(args.older_than, "--older-than") if args.older_than else None
    config = load_config(args.config)
    clean(
        config,
        older_than=grace if grace is not None else config.clean.grace,
        dry_run=args.dry_run,
        log=lambda line: print(line, flush=True),
    )
    return 0
