"""`exactly derived rebuild`: build a derived output's table from the raw table
(jobs/derived/rebuild.py), for an output added to a pipeline with history or whose table was
deleted; the publisher refuses to merge into such an output until it is built."""

from __future__ import annotations

import argparse

from resources.config.loading import load_config


def register(sub: argparse._SubParsersAction) -> None:
    cmd = sub.add_parser("derived", help="maintain the derived outputs (derived tables)")
    actions = cmd.add_subparsers(dest="action", required=True, metavar="ACTION")
    rebuild = actions.add_parser(
        "rebuild",
        help="build a derived output's table from the raw table",
        description=(
            "Builds the table of a derived output that holds no batch yet (new on a "
            "pipeline with history, or deleted) from one snapshot of the raw table, in one "
            "commit (one SQL transaction for a PostgreSQL output) that records the batches "
            "it holds; the pipeline's next batches merge on top. An output that holds "
            "batches is refused."
        ),
    )
    rebuild.add_argument("-c", "--config", required=True, help="pipeline config file (YAML)")
    rebuild.add_argument(
        "--empty",
        action="store_true",
        help="start the output empty at the raw table's batches: it holds only what is "
        "published from now on (an upsert after its topic was re-created)",
    )
    rebuild.add_argument("name", help="the derived output's name (config `derived:`)")
    rebuild.add_argument(
        "--reason", default="", help="why; kept with the rebuilt output and in the ledger"
    )
    rebuild.add_argument("--by", default=None, help="who asks (default: the OS user)")
    rebuild.set_defaults(func=cmd_rebuild)


def cmd_rebuild(args: argparse.Namespace) -> int:
    from exactly_cli.skip_cmd import default_user
    from jobs.derived.rebuild import rebuilt_text
    from jobs.wiring.pipeline import Pipeline

    with Pipeline(load_config(args.config)) as pipeline:
        who = args.by or default_user()
        done = pipeline.rebuild_derived(args.name, empty=args.empty, who=who, reason=args.reason)
    print(rebuilt_text(done), flush=True)
    return 0
