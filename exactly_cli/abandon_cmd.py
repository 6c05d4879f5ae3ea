"""`exactly abandon`: release a batch its hung owner holds (ledger/coordinator/release.py).

    exactly abandon -c FILE BATCH_ID [--backfill] --reason TEXT [--by WHO]

Recovery leaves a batch to an owner that may be alive, so a hung process holds its batch,
and the pipeline, until someone decides. This is that decision: a batch that never voted
is abandoned (its attempt fenced, its ranges read again by the next batch); one that voted
is taken over and finished now. Stop the hung process too where you can; once fenced, it
can change nothing. In Dagster, the `<pipeline>_abandon` job does the same and terminates
the runs that hold the batch.
"""

from __future__ import annotations

import argparse

from exactly_cli.skip_cmd import default_user
from resources.config.loading import load_config


def register(sub: argparse._SubParsersAction) -> None:
    cmd = sub.add_parser(
        "abandon",
        help="release a batch a hung process holds: abandon it, or finish it if it voted",
        description=(
            "A batch that never voted is abandoned and its ranges read again by the next "
            "batch; one that voted is taken over and finished now. Either way the hung "
            "attempt is fenced: its next write is refused."
        ),
    )
    cmd.add_argument("-c", "--config", required=True, help="pipeline config file (YAML)")
    cmd.add_argument("batch_id", type=int, metavar="BATCH_ID", help="the batch to release")
    cmd.add_argument(
        "--backfill", action="store_true", help="a backfill batch (`exactly ledger` shows its id)"
    )
    cmd.add_argument("--reason", required=True, help="why; recorded with the batch")
    cmd.add_argument("--by", default=default_user(), help="who decides (default: the OS user)")
    cmd.set_defaults(func=cmd_abandon)


def cmd_abandon(args: argparse.Namespace) -> int:
    from jobs.wiring.pipeline import Pipeline
    from ledger.coordinator.release import released_text

    config = load_config(args.config)
    with Pipeline(config, log=print) as pipeline:
        batch = pipeline.abandon(
            args.batch_id, backfill=args.backfill, who=args.by, reason=args.reason
        )
    print(released_text(batch))
    return 0
