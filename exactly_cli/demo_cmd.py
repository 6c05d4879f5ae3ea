"""`exactly demo`: the main job on embedded defaults: an embedded broker, sample page views,
exactly-once batches into Delta, and the per-app counts read back."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from exactly_cli.pipeline_cmd import run_pipeline, say
from resources.config.loading import load_config
from resources.config.pipeline_config import PipelineConfig

_DEMO_CONFIG = Path(__file__).resolve().parent.parent / "pipelines" / "pageviews.yaml"
_DEMO_S3_CONFIG = Path(__file__).resolve().parent.parent / "pipelines" / "s3" / "pageviews.yaml"


def register(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser("demo", help="the main job on embedded defaults")
    demo.add_argument("--events", type=int, default=20_000)
    demo.add_argument(
        "--s3",
        action="store_true",
        help="tables in a bucket of an S3-compatible server started on loopback (s3proxy)",
    )
    demo.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    """Embedded broker -> sample page views -> exactly-once batches -> Delta -> per-app counts."""
    from resources.kafka.embedded_broker import AlreadyRunningError, EmbeddedBroker

    # everything the demo writes lives under ./data, as pipelines/pageviews.yaml says
    broker = EmbeddedBroker(Path("data") / "kafka", 9092)
    try:
        started = time.perf_counter()
        bootstrap = broker.start()
        say(f"embedded Kafka broker started at {bootstrap} in {time.perf_counter() - started:.1f}s")
    except AlreadyRunningError as exc:
        bootstrap = exc.status.bootstrap
        say(f"embedded Kafka broker already running at {bootstrap}")
    if not args.s3:
        _demo(load_config(_DEMO_CONFIG), bootstrap, args.events)
    else:
        _demo_on_s3(bootstrap, args.events)
    say("the broker keeps running for the Dagster UI; stop it with: exactly kafka stop")
    return 0


def _demo_on_s3(bootstrap: str, events: int) -> None:
    """The demo with its tables on a loopback S3 server, which runs while the demo does.

    The server is reached the way any store is: the standard AWS variables, set here for
    this process (Spark, delta-rs and boto3 read them); the config names only s3:// URIs.
    """
    import os

    from resources.object_storage import storage
    from resources.object_storage.embedded_s3 import start_s3_server

    config = load_config(_DEMO_S3_CONFIG)
    started = time.perf_counter()
    with start_s3_server(Path("data") / "s3") as server:
        say(
            f"S3 server (s3proxy) started at {server.endpoint_url} in "
            f"{time.perf_counter() - started:.1f}s, objects in {server.data_dir}"
        )
        os.environ.update(server.env())
        bucket, _key = storage.split_s3(config.delta.table_uri)
        listed = server.access().boto3_client().list_buckets()["Buckets"]
        if bucket not in {b["Name"] for b in listed}:
            server.create_bucket(bucket)
        _demo(config, bootstrap, events)
    say("the S3 server stopped; `exactly demo --s3` starts it again on the same objects")


def _demo(config: PipelineConfig, bootstrap: str, events: int) -> None:
    from jobs.examples.sample_data import pageviews
    from resources.kafka.client import KafkaClient

    client = KafkaClient(bootstrap)
    client.create_topic(config.kafka.topic, partitions=3)
    before = sum(
        o.last_stable
        for o in client.offsets(config.kafka.topic, client.partitions(config.kafka.topic)).values()
    )
    produced = client.produce(
        config.kafka.topic, pageviews(events, start=before, malformed_every=1000)
    )
    say(
        f"produced {produced} page-view events to {config.kafka.topic} "
        f"(every 1000th is malformed on purpose)"
    )
    run_pipeline(config, batches=None)
    _print_counts(config)


def _print_counts(config: PipelineConfig) -> None:
    """Page views per app recounted from the raw table, beside what each count aggregate
    kept batch by batch holds: the two agree, or a batch was counted twice or never."""
    from pyspark.sql import functions as F

    from jobs.stage.spark_stager import SharedSpark
    from resources.config.derived_spec import AggregateOutput

    spark = SharedSpark.for_config(config)()
    table = spark.read.format("delta").load(config.delta.table_uri)
    recount = {r["app"]: r["count"] for r in table.groupBy("app").count().collect()}
    kept: dict[str, dict[str, int]] = {}
    for spec in config.derived:
        if not isinstance(spec, AggregateOutput) or spec.group_by != ["app"]:
            continue
        counts = [m.name for m in spec.measures if m.fn == "count"]
        if not counts:
            continue
        rows = spark.read.format("delta").load(spec.table_uri)
        summed = rows.groupBy("app").agg(F.sum(counts[0]).alias("n")).collect()
        kept[spec.name] = {r["app"]: int(r["n"]) for r in summed}
    say(
        f"\npage views per app, recounted from {config.delta.table_uri} and as kept by "
        "each aggregate table (read through delta-spark):"
    )
    say(f"  {'app':<10} {'recount':>8}" + "".join(f" {name:>22}" for name in kept))
    for app in sorted(set(recount) | {a for k in kept.values() for a in k}, key=str):
        cells = "".join(f" {k.get(app, 0):>22}" for k in kept.values())
        say(f"  {app!s:<10} {recount.get(app, 0):>8}{cells}")
    try:
        quarantined = spark.read.format("delta").load(config.delta.quarantine_uri).count()
    except Exception:
        quarantined = 0
    say(f"  {'quarantine':<10} {quarantined:>8}")
