"""`exactly derived rebuild`: build a derived output's table from the raw table
(jobs/derived/rebuild.py), for an output added to a pipeline with history or whose table was
deleted; the publisher refuses to merge into such an output until it is built."""

from __future__ import annotations

import argparse

from ledger.core.errors import ConfigError
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
            "commit that records the batches it holds; the pipeline's next batches merge on "
            "top. An output that holds batches is refused."
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
    rebuild.set_defaults(func=cmd_rebuild)


def cmd_rebuild(args: argparse.Namespace) -> int:
    from jobs.derived.rebuild import rebuild_output
    from jobs.publish.delta_publisher import DeltaPublisher
    from resources.config.derived_spec import UpsertOutput
    from resources.kafka.client import KafkaClient

    config = load_config(args.config)
    publisher = DeltaPublisher.for_config(config)
    found = {spec.name: (spec, delta) for spec, delta in publisher.derived}
    if args.name not in found:
        known = ", ".join(sorted(found)) or "none"
        raise ConfigError(
            f"derived output {args.name!r} is not in {args.config} (its Delta outputs: {known})"
        )
    spec, delta = found[args.name]
    topic_id_now = None
    if isinstance(spec, UpsertOutput) and not args.empty:
        # a full upsert rebuild must know each topic's incarnation now, for every topic the
        # raw table holds rows of, read or not (jobs/derived/rebuild.py)
        kafka = KafkaClient(config.kafka.bootstrap_servers, config.kafka.resolved_options())
        listed = set(kafka.topic_names())

        def topic_id_now(topic: str) -> str | None:
            return kafka.topic_id(topic) if topic in listed else None

    done = rebuild_output(
        spec,
        delta,
        publisher.table,
        publisher.app_ids,
        topic_id_now=topic_id_now,
        empty=args.empty,
    )
    holds = ", ".join(f"{a} up to batch {v}" for a, v in done.holds.items()) or "no batch"
    print(
        f"rebuilt derived output {done.name}: {done.rows} rows at version {done.version}, "
        f"from raw table version {done.raw_version} ({holds})",
        flush=True,
    )
    return 0
