"""`exactly backfill`: fill or replace an offset range, exactly once, beside the live pipeline."""

from __future__ import annotations

import argparse

from exactly_cli.pipeline_cmd import progress_sink, say
from ledger.coordinator.backfill import plan_backfill
from ledger.core.backfill import BackfillMode
from ledger.core.batch import BatchKind
from ledger.core.errors import ConfigError
from ledger.core.protocol import OffsetRange
from resources.config.loading import load_config
from resources.config.transforms import absolute_spec


def register(sub: argparse._SubParsersAction) -> None:
    cmd = sub.add_parser(
        "backfill",
        help="ingest (fill) or reprocess (replace) an offset range of one partition",
        description=(
            "fill ingests offsets no committed batch covers (before the live pipeline's start); "
            "replace reprocesses committed offsets, swapping their rows in one Delta commit."
        ),
    )
    cmd.add_argument("-c", "--config", required=True, help="pipeline config file (YAML)")
    cmd.add_argument("--partition", type=int, required=True)
    cmd.add_argument("--from", dest="start", type=int, required=True, help="first offset")
    cmd.add_argument("--to", dest="end", type=int, required=True, help="offset after the last")
    cmd.add_argument(
        "--topic", help="default: the pipeline's topic (required when it reads several)"
    )
    cmd.add_argument("--mode", choices=[m.value for m in BackfillMode], default="fill")
    cmd.add_argument("--transform", help="module:function to use instead of the config's")
    cmd.add_argument("--again", action="store_true", help="repeat an identical finished backfill")
    cmd.set_defaults(func=cmd_backfill)


def cmd_backfill(args: argparse.Namespace) -> int:
    from jobs.wiring.pipeline import Pipeline

    config = load_config(args.config)
    topic = args.topic or config.kafka.topic
    if topic is None:
        raise ConfigError(
            f"--topic: pipeline {config.pipeline} reads several topics (kafka.topics or "
            "kafka.pattern): name the topic whose offsets to backfill"
        )
    if config.kafka.topic is not None and topic != config.kafka.topic:
        raise ConfigError(
            f"--topic {topic}: pipeline {config.pipeline} reads topic {config.kafka.topic} only"
        )
    if args.start < 0 or args.end <= args.start:
        raise ConfigError(f"--from {args.start} --to {args.end} is not a non-empty range")
    rng = OffsetRange(topic, args.partition, args.start, args.end)
    transform = absolute_spec(args.transform) if args.transform else config.transform
    with Pipeline(config, log=say, progress=progress_sink(None)) as pipeline:
        tpc = pipeline.backfill(transform)
        for done in pipeline.recover(BatchKind.BACKFILL):
            say(f"recovered batch {done.app_id}/{done.batch_id}: {done.state}")
        batch, planned = plan_backfill(
            tpc,
            live_app_id=config.app_id,
            mode=BackfillMode(args.mode),
            ranges=[rng],
            transform=transform,
            again=args.again,
            replace_refusals=config.replace_refusals(),
        )
        if not planned:
            say(
                f"{args.mode} of {rng} already done as backfill batch "
                f"{batch.app_id}/{batch.batch_id} ({batch.state}); nothing to do "
                "(use --again to run it again)"
            )
            return 0
        report = tpc.finish(batch)
    say(f"{args.mode} {report.line()}")
    return 0
