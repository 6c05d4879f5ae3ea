"""`exactly skip`: an operator's recorded decision to continue where the pipeline refuses.

    exactly skip lost-offsets -c FILE [--partition P] [--to OFFSET] [--force] --reason TEXT
    exactly skip new-topic    -c FILE --topic-id ID [--force] --reason TEXT
    exactly skip resume-at    -c FILE --position P=OFFSET [...] [--force] --reason TEXT
    exactly skip retire-topic -c FILE --topic TOPIC [--force] --reason TEXT

Every decision names who took it (`--by`, default the OS user) and why; it is recorded in
the ledger and carried by the next batch's commit (ledger/core/decisions.py), and `exactly
ledger --decisions` lists them. A decision that would skip records Kafka still holds, or
read committed ones again, is refused unless `--force`.
"""

from __future__ import annotations

import argparse
import getpass
import os

from ledger.core.decisions import DecisionKind, Request
from ledger.core.errors import ConfigError
from resources.config.loading import load_config


def default_user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return f"uid {os.getuid()}"


def _position(text: str) -> tuple[int, int]:
    partition, sep, offset = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return int(partition), int(offset)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not PARTITION=OFFSET") from None


def register(sub: argparse._SubParsersAction) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-c", "--config", required=True, help="pipeline config file (YAML)")
    common.add_argument("--reason", required=True, help="why; recorded with the decision")
    common.add_argument("--by", default=default_user(), help="who decides (default: the OS user)")
    common.add_argument(
        "--topic", help="the topic the decision is about (required when the pipeline reads several)"
    )

    skip = sub.add_parser(
        "skip",
        help="record an operator decision to continue past offsets the pipeline cannot read",
        description=(
            "The pipeline stops, and says so, rather than skip records on its own. Each "
            "decision is recorded in the ledger and in the next commit's metadata."
        ),
    )
    kinds = skip.add_subparsers(dest="kind", required=True, metavar="KIND")

    lost = kinds.add_parser(
        str(DecisionKind.LOST_OFFSETS),
        parents=[common],
        help="skip offsets retention deleted before they were read",
    )
    lost.add_argument("--partition", type=int, help="default: every partition with a loss")
    lost.add_argument("--to", type=int, help="skip up to here (default: the earliest offset)")
    lost.add_argument(
        "--force", action="store_true", help="allow --to past what is lost (drops records)"
    )
    lost.set_defaults(func=cmd_skip)

    topic = kinds.add_parser(
        str(DecisionKind.NEW_TOPIC),
        parents=[common],
        help="accept a re-created (or another) topic; positions restart at starting_offsets",
    )
    topic.add_argument("--topic-id", required=True, help="the id Kafka reports now")
    topic.add_argument(
        "--force",
        action="store_true",
        help="accept even when the positions carry no topic id (they may be this topic)",
    )
    topic.set_defaults(func=cmd_skip)

    resume = kinds.add_parser(
        str(DecisionKind.RESUME_AT),
        parents=[common],
        help="state where each partition continues when the Delta log cannot say",
    )
    resume.add_argument(
        "--position",
        type=_position,
        action="append",
        required=True,
        metavar="PARTITION=OFFSET",
        help="the next offset to read of a partition; once per partition",
    )
    resume.add_argument(
        "--force", action="store_true", help="allow positions that skip or re-read records"
    )
    resume.set_defaults(func=cmd_skip)

    retire = kinds.add_parser(
        str(DecisionKind.RETIRE_TOPIC),
        parents=[common],
        help="let a pipeline on several topics go on without a topic it no longer reads",
    )
    retire.add_argument(
        "--force",
        action="store_true",
        help="retire even though Kafka still holds records of it that were never read",
    )
    retire.set_defaults(func=cmd_skip)


def cmd_skip(args: argparse.Namespace) -> int:
    from jobs.wiring.pipeline import Pipeline

    kind = DecisionKind(args.kind)
    positions: dict[int, int] = {}
    for partition, offset in getattr(args, "position", None) or ():
        if partition in positions:
            raise ConfigError(f"--position names partition {partition} twice")
        positions[partition] = offset
    config = load_config(args.config)
    request = Request(
        kind=kind,
        reason=args.reason,
        decided_by=args.by,
        partition=getattr(args, "partition", None),
        to=getattr(args, "to", None),
        topic_id=getattr(args, "topic_id", None),
        positions=positions,
        force=getattr(args, "force", False),
        topic=args.topic,
    )
    with Pipeline(config, log=print) as pipeline:
        decision = pipeline.decide(request)
    print(f"recorded decision {decision.id[:8]} of {config.pipeline}: {decision.describe()}")
    print("the next batch continues from there, and its commit carries this decision")
    return 0
