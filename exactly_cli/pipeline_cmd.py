"""`exactly run | recover | ledger`: the pipeline from the command line."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exactly_cli.progress import ProgressLine
from jobs.metrics.exposition import MetricsOutput
from jobs.wiring.continuous import Cadence, run_continuously
from ledger.core.batch import Batch
from ledger.core.errors import BusyError, ExactlyError
from ledger.core.protocol import BatchState
from ledger.store.ledger_store import LedgerStore
from resources.config.loading import load_config
from resources.config.pipeline_config import PipelineConfig
from resources.delta.compaction import compacted_text
from resources.spark.progress import ProgressSink

#: States whose batches published what they were planned on.
COMMITTED_STATES = (BatchState.COMMITTED, BatchState.ACKED)


def register(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="run micro-batches of a pipeline")
    run.add_argument("-c", "--config", required=True, help="pipeline config file (YAML)")
    how_many = run.add_mutually_exclusive_group()
    how_many.add_argument("--batches", type=int, default=1, help="at most N batches (default 1)")
    how_many.add_argument(
        "--until-caught-up",
        action="store_true",
        help="run batches until the last stable offsets are reached",
    )
    how_many.add_argument(
        "--continuous",
        action="store_true",
        help="run batch after batch until SIGTERM or Ctrl-C (the batch in flight commits first)",
    )
    run.add_argument(
        "--min-interval",
        type=float,
        default=1.0,
        help="with --continuous: seconds between the starts of two batches at least (default 1)",
    )
    run.add_argument(
        "--recover-interval",
        type=float,
        default=30.0,
        help="with --continuous: seconds between two recoveries of backfills whose process "
        "died while it runs (default 30)",
    )
    run.add_argument(
        "--allow-empty",
        action="store_true",
        help="commit a batch even when no partition has new offsets",
    )
    run.add_argument(
        "--busy-timeout",
        type=float,
        default=120.0,
        help="seconds to wait while another live process owns a batch",
    )
    run.add_argument(
        "--progress-every",
        type=float,
        default=None,
        help="seconds between two progress lines of a running stage (default: 1 on a "
        "terminal, updated in place; 10 otherwise, one line each); 0 shows none",
    )
    run.add_argument(
        "--metrics",
        metavar="ADDR",
        help="serve the pipeline's figures for Prometheus at host:port (:port: every "
        "interface) while the command runs",
    )
    run.add_argument(
        "--metrics-textfile",
        metavar="PATH",
        type=Path,
        help="write the same figures to PATH after every batch (node-exporter's textfile "
        "collector)",
    )
    run.set_defaults(func=cmd_run)

    recover = sub.add_parser("recover", help="finish prepared batches, abandon dead ones")
    recover.add_argument("-c", "--config", required=True)
    recover.add_argument("--reason", default="", help="why; journaled in the ledger")
    recover.add_argument("--by", default=None, help="who asks (default: the OS user)")
    recover.set_defaults(func=cmd_recover)

    ledger = sub.add_parser("ledger", help="show the batches of a pipeline")
    ledger.add_argument("-c", "--config", required=True)
    ledger.add_argument("--json", action="store_true", help="one JSON document")
    ledger.add_argument("--limit", type=int, default=50)
    ledger.add_argument(
        "--decisions",
        action="store_true",
        help="list only the operator decisions (skipped ranges, accepted topics, resumes)",
    )
    ledger.set_defaults(func=cmd_ledger)


#: Everything the pipeline commands print, so a progress line in place is cleared first.
_LINE = ProgressLine()


def say(message: str) -> None:
    """Print a line for the user (clearing the stage's progress line first)."""
    _LINE.say(message)


def progress_sink(every: float | None) -> ProgressSink | None:
    """The stage's progress line, every `every` seconds (None: the line's own default)."""
    if every is not None and every <= 0:
        return None
    return ProgressSink(_LINE.show, every if every is not None else _LINE.every())


def _with_busy_retry(action, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return action()
        except BusyError as exc:
            if time.monotonic() >= deadline:
                raise
            say(f"waiting: {exc}")
            time.sleep(2.0)


def run_pipeline(
    config: PipelineConfig,
    *,
    batches: int | None,
    allow_empty: bool = False,
    busy_timeout: float = 120.0,
    spark_factory: Callable[[], Any] | None = None,
    progress: ProgressSink | None = None,
    metrics: Metrics = (None, None),
) -> int:
    """Recover, then run batches; returns how many batches were committed.

    `spark_factory` is for a caller that has a Spark session already (the tests): the
    command itself starts the process's own. `metrics`: where to serve and write the
    pipeline's figures (jobs/metrics)."""
    from jobs.wiring.pipeline import Pipeline

    with (
        Pipeline(config, log=say, spark_factory=spark_factory, progress=progress) as pipeline,
        metrics_output(pipeline, metrics) as figures,
    ):
        tpc = pipeline.live
        for batch in _with_busy_retry(pipeline.recover, busy_timeout):
            say(f"recovered batch {batch.app_id}/{batch.batch_id}: {batch.state}")
        done = 0
        while batches is None or done < batches:
            report = _with_busy_retry(lambda: tpc.run_batch(allow_empty=allow_empty), busy_timeout)
            if report is None:
                say(f"{config.pipeline}: caught up, nothing new to read")
                break
            say(report.line())
            figures.after_batch()
            done += 1
    return done


#: (address to serve at, text file to write), each optional: `exactly run --metrics ...`
Metrics = tuple[str | None, Path | None]


def metrics_output(pipeline: Any, metrics: Metrics) -> MetricsOutput:
    """The run's metrics output: served and written as `metrics` asks, or nowhere."""
    from jobs.metrics.collector import PipelineCollector

    collector = PipelineCollector(pipeline.config.pipeline, lambda: pipeline, log=say)
    return MetricsOutput(collector, *metrics)


def run_continuous(
    config: PipelineConfig,
    cadence: Cadence,
    *,
    allow_empty: bool = False,
    busy_timeout: float = 120.0,
    progress: ProgressSink | None = None,
    metrics: Metrics = (None, None),
) -> int:
    """Recover, then run batches until SIGTERM or SIGINT; returns how many committed.

    The first signal asks the loop to stop after the batch in flight (jobs/wiring/continuous.py);
    the handlers are then the previous ones again, so a second Ctrl-C interrupts at once,
    which is a crash that the next start recovers from. The Spark session starts before the
    handlers are set, because pyspark sets its own SIGINT handler (cancel every job) when it
    starts one, and that would turn a polite Ctrl-C into a failed batch.
    """
    from jobs.wiring.pipeline import Pipeline

    stop = threading.Event()
    signals = (signal.SIGTERM, signal.SIGINT)
    with (
        Pipeline(config, log=say, progress=progress) as pipeline,
        metrics_output(pipeline, metrics) as figures,
    ):
        tpc = pipeline.live
        for batch in _with_busy_retry(pipeline.recover, busy_timeout):
            say(f"recovered batch {batch.app_id}/{batch.batch_id}: {batch.state}")
        pipeline.spark()
        previous = {sig: signal.getsignal(sig) for sig in signals}

        def request_stop(signum: int, _frame: Any) -> None:
            name = signal.Signals(signum).name
            say(f"{config.pipeline}: {name}: stopping after the batch in flight")
            stop.set()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        def on_batch(report: Any) -> None:
            say(report.line())
            figures.after_batch()

        def sweep() -> None:
            for batch in pipeline.recover_backfills():
                say(f"recovered batch {batch.app_id}/{batch.batch_id}: {batch.state}")
            for target, done in pipeline.compact_piled().items():
                say(compacted_text(target, done))

        for sig in signals:
            signal.signal(sig, request_stop)
        try:
            done = run_continuously(
                lambda: _with_busy_retry(
                    lambda: tpc.run_batch(allow_empty=allow_empty), busy_timeout
                ),
                cadence,
                stop,
                on_batch,
                sweep=sweep,
            )
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    say(f"{config.pipeline}: stopped after {done} batch(es)")
    return done


def cmd_run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if args.batches is not None and args.batches < 1 and not args.until_caught_up:
        raise ExactlyError(f"--batches must be at least 1, not {args.batches}")
    if args.continuous:
        if args.min_interval < 0:
            raise ExactlyError(f"--min-interval must be at least 0, not {args.min_interval}")
        if args.recover_interval <= 0:
            raise ExactlyError(f"--recover-interval must be over 0, not {args.recover_interval}")
        run_continuous(
            config,
            Cadence(min_interval=args.min_interval, sweep_interval=args.recover_interval),
            allow_empty=args.allow_empty,
            busy_timeout=args.busy_timeout,
            progress=progress_sink(args.progress_every),
            metrics=(args.metrics, args.metrics_textfile),
        )
        return 0
    run_pipeline(
        config,
        batches=None if args.until_caught_up else args.batches,
        allow_empty=args.allow_empty,
        busy_timeout=args.busy_timeout,
        progress=progress_sink(args.progress_every),
        metrics=(args.metrics, args.metrics_textfile),
    )
    return 0


def cmd_recover(args: argparse.Namespace) -> int:
    from exactly_cli.skip_cmd import default_user
    from jobs.wiring.pipeline import Pipeline

    config = load_config(args.config)
    with Pipeline(config, log=say) as pipeline:
        finished, _ = pipeline.recover_asked(who=args.by or default_user(), reason=args.reason)
    for batch in finished:
        say(f"recovered batch {batch.app_id}/{batch.batch_id}: {batch.state}")
    say(f"{config.pipeline}: recovered {len(finished)} batch(es)")
    return 0


def cmd_ledger(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    store = LedgerStore(config.ledger.url)
    decisions = store.decisions(pipeline=config.pipeline)
    if args.decisions:
        if args.json:
            json.dump([d.as_dict() for d in decisions], sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            _print_decisions(decisions, store, config.pipeline)
        return 0
    found = store.batches(pipeline=config.pipeline, limit=args.limit)
    if args.json:
        json.dump([b.as_dict() for b in found], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    for line in ledger_lines(found, with_topics=config.kafka.topic is None):
        say(line)
    if decisions:
        say("")
        _print_decisions(decisions, store, config.pipeline)
    return 0


def batch_kind(batch: Batch) -> str:
    """What a batch is, as an operator names it: `live`, or a backfill's mode (`fill`,
    `replace`); `+rebuilt` when a lost ledger re-created it from the outputs' logs."""
    kind = str(batch.params.get("mode", batch.kind))
    return f"{kind}+rebuilt" if batch.params.get("rebuilt_from_delta_log") else kind


def ledger_lines(batches: list[Batch], *, with_topics: bool = False) -> list[str]:
    """`exactly ledger`'s table: a header, then one line per batch. `with_topics`: the
    pipeline reads several topics, and each range is named `topic-partition:[start,end)`."""
    lines = [
        f"{'batch':>6} {'app_id':<20} {'kind':<15} {'state':<10} {'att':>3} {'records':>9} "
        f"{'files s/c/a/m':>13}  ranges"
    ]
    for b in batches:
        ranges = " ".join(
            f"{f'{r.topic}-' if with_topics else ''}{r.partition}:[{r.start},{r.end})"
            for r in b.ranges
        )
        records = b.metrics.get("records_read", "")
        lines.append(
            f"{b.batch_id:>6} {b.app_id:<20} {batch_kind(b):<15} {b.state:<10} {b.attempt:>3} "
            f"{records!s:>9} {file_counts(b.metrics):>13}  {ranges}"
        )
    return lines


#: The per-batch file counts of invariant 11, in the order `exactly ledger` shows them.
FILE_COUNTS = ("files_staged", "files_committed", "files_already_committed", "files_missing")


def file_counts(metrics: dict) -> str:
    """staged/committed/already committed/missing, as recorded by the commit; a batch not
    committed yet shows only how many files went missing so far."""
    if "files_staged" not in metrics:
        missing = metrics.get("files_missing")
        return f"-/-/-/{missing}" if missing else ""
    return "/".join(str(metrics.get(k, 0)) for k in FILE_COUNTS)


def _print_decisions(decisions: list[Any], store: LedgerStore, pipeline: str) -> None:
    """Every decision with the committed batch that carried it (invariant 15): skipped
    ranges are never only in the ledger's history."""
    carried: dict[str, str] = {}
    committed = store.batches(pipeline=pipeline, states=COMMITTED_STATES)
    for batch in sorted(committed, key=lambda b: b.batch_id):
        for d in batch.decisions:
            carried.setdefault(d.id, f"carried by batch {batch.batch_id}")
    say(f"decisions ({len(decisions)}):")
    for d in decisions:
        where = carried.get(d.id, "not committed yet")
        say(f"  {d.id[:8]} after batch {d.after_batch_id}, {where}: {d.describe()}")
