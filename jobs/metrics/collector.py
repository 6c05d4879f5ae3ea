"""A pipeline's figures for Prometheus, read from its ledger and Kafka at each scrape.

Why from the ledger rather than counted where batches run: the processes that run batches
come and go (a Dagster run per batch, a one-shot `exactly run`), while a scrape target must
answer steadily; the ledger is what every process agrees on. So the same collector serves
`exactly run --continuous`, the Dagster code location and the text file of a one-shot run,
and all three say the same numbers for the same ledger.

- `exactly_batches{state}`: the pipeline's batches in each state, live and backfill.
- `exactly_records_read_total`, `exactly_rows_written_total{output}`,
  `exactly_bytes_written_total{output}`: sums over the published batches (SQL aggregates,
  ledger/store/totals.py), so they never go back when a process restarts.
- `exactly_consumer_lag{topic,partition}`: from Kafka; left out when Kafka cannot say.
- `exactly_phase_seconds{phase}`: a histogram of each published batch's phase durations
  (plan, stage, prepare, commit, ack), for the batches published since this collector
  began: they are kept as JSON per batch, which SQL cannot bucket portably, so they are
  read incrementally, a few batches per scrape.
- `exactly_stuck_batches`: invariant 16's rule (ledger/core/stuck.py), as the alert and the
  check apply it.
- `exactly_quarantine_ratio` and `exactly_last_commit_timestamp_seconds`: of the batch
  committed last; `exactly_newest_record_timestamp_seconds`: the Kafka timestamp of the
  newest record published (freshness: `time() - exactly_newest_record_timestamp_seconds`).
Every family carries a `pipeline` label.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from jobs.wiring.pipeline import last_committed, newest_record
from ledger.core.backfill import backfill_app_id
from ledger.core.protocol import IN_FLIGHT, PUBLISHED
from ledger.core.stuck import decide_stuck
from resources.failures.lines import one_line

if TYPE_CHECKING:
    from jobs.wiring.pipeline import Pipeline

#: the phases `TwoPhaseCommit.finish` times, in the order they run
PHASES = ("plan", "stage", "prepare", "commit", "ack")
#: histogram bounds in seconds: a commit of tens of ms to a stage of minutes
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class PhaseHistogram:
    """Cumulative bucket counts of phase durations, per phase; fed batch by batch."""

    def __init__(self) -> None:
        self.counts = {p: [0] * len(BUCKETS) for p in PHASES}
        self.totals = dict.fromkeys(PHASES, 0)
        self.sums = dict.fromkeys(PHASES, 0.0)

    def observe(self, timings: dict[str, float]) -> None:
        for phase, seconds in timings.items():
            if phase not in self.counts:
                continue
            self.totals[phase] += 1
            self.sums[phase] += float(seconds)
            for i, bound in enumerate(BUCKETS):
                if seconds <= bound:
                    self.counts[phase][i] += 1

    def buckets(self, phase: str) -> list[tuple[str, float]]:
        bounded = [(repr(b), float(n)) for b, n in zip(BUCKETS, self.counts[phase], strict=True)]
        return [*bounded, ("+Inf", float(self.totals[phase]))]


class PipelineCollector(Collector):
    """The figures of one pipeline, computed when Prometheus (or a text file) asks."""

    def __init__(
        self,
        name: str,
        pipeline: Callable[[], Pipeline],
        log: Callable[[str], None] = lambda _m: None,
    ) -> None:
        """`pipeline` (the Pipeline named `name`) is asked for on the first scrape, not
        before: a code location that serves metrics must load while the ledger is down."""
        self.name = name
        self._pipeline = pipeline
        self.log = log
        self.phases = PhaseHistogram()
        self._lock = threading.Lock()
        self._seen: dict[str, int] | None = None

    @property
    def pipeline(self) -> Pipeline:
        return self._pipeline()

    def begin(self) -> None:
        """Start the phase histogram here: it counts the batches published from now on.
        A command calls this as it opens its pipeline; the code location's endpoint, on its
        first scrape (it may load while the ledger is down)."""
        if self._seen is None:
            config = self.pipeline.config
            self._seen = {
                app: self._newest_published(app)
                for app in (config.app_id, backfill_app_id(config.pipeline))
            }

    def _newest_published(self, app_id: str) -> int:
        found = self.pipeline.store.batches(app_id=app_id, states=PUBLISHED, limit=1)
        return found[0].batch_id if found else -1

    def collect(self) -> Iterator[Metric]:
        """Every family, or only `exactly_up 0` when the ledger cannot be read: a scrape
        gets an answer either way, and the reason goes to the log in one line."""
        with self._lock:  # two scrapes at once would feed the histogram twice
            name = self.name
            try:
                self.begin()
                found = list(self._collect())
            except Exception as exc:
                self.log(f"metrics: the figures could not be read: {one_line(str(exc))}")
                yield _gauge("exactly_up", "Whether the ledger could be read", name, 0)
                return
        yield _gauge("exactly_up", "Whether the ledger could be read", name, 1)
        yield from found

    def _collect(self) -> Iterator[Metric]:
        name = self.pipeline.config.pipeline
        store = self.pipeline.store
        batches = GaugeMetricFamily(
            "exactly_batches",
            "Batches in each state, live and backfill",
            labels=["pipeline", "state"],
        )
        for state, count in sorted(store.state_counts(name).items()):
            batches.add_metric([name, state], count)
        yield batches

        read = CounterMetricFamily(
            "exactly_records_read", "Kafka records read by published batches", labels=["pipeline"]
        )
        read.add_metric([name], store.records_read_total(name))
        yield read
        rows = CounterMetricFamily(
            "exactly_rows_written",
            "Rows written by published batches",
            labels=["pipeline", "output"],
        )
        size = CounterMetricFamily(
            "exactly_bytes_written",
            "Bytes of the files published batches wrote",
            labels=["pipeline", "output"],
        )
        for output, (n, b) in sorted(store.output_totals(name).items()):
            rows.add_metric([name, output], n)
            size.add_metric([name, output], b)
        yield rows
        yield size

        yield from self._lag(name)
        yield from self._phases(name)
        yield from self._health(name)

    def _lag(self, name: str) -> Iterator[Metric]:
        try:
            lag = self.pipeline.source.consumer_lag()
        except Exception as exc:  # Kafka cannot say now: the other figures still can
            self.log(f"metrics: could not read the consumer lag of {name}: {exc}")
            return
        family = GaugeMetricFamily(
            "exactly_consumer_lag",
            "Offsets between the consumer group and the last stable offset",
            labels=["pipeline", "topic", "partition"],
        )
        topic = self.pipeline.config.kafka.topic
        for key, offsets in sorted(lag.items(), key=lambda kv: str(kv[0])):
            if isinstance(key, int):  # one topic: keyed by partition
                family.add_metric([name, str(topic), str(key)], offsets)
            else:  # several: keyed `topic-partition`
                on, _, partition = str(key).rpartition("-")
                family.add_metric([name, on, partition], offsets)
        yield family

    def _phases(self, name: str) -> Iterator[Metric]:
        assert self._seen is not None
        for app, seen in list(self._seen.items()):
            for batch in self.pipeline.store.published_after(app, seen):
                self.phases.observe(dict(batch.metrics.get("phase_s") or {}))
                self._seen[app] = batch.batch_id
        family = HistogramMetricFamily(
            "exactly_phase_seconds",
            "Phase durations of the batches published since this endpoint started",
            labels=["pipeline", "phase"],
        )
        for phase in PHASES:
            family.add_metric(
                [name, phase], self.phases.buckets(phase), sum_value=self.phases.sums[phase]
            )
        yield family

    def _health(self, name: str) -> Iterator[Metric]:
        pipeline, config = self.pipeline, self.pipeline.config
        candidates = [
            *pipeline.store.batches(app_id=config.app_id, states=IN_FLIGHT),
            *pipeline.store.batches(app_id=backfill_app_id(name), states=IN_FLIGHT),
        ]
        threshold = config.alerts.stuck_after_seconds
        stuck = decide_stuck({}, candidates, {}, pipeline.store.now(), threshold).stuck
        yield _gauge(
            "exactly_stuck_batches",
            "Batches in a state that is not final past alerts.stuck_after_seconds",
            name,
            len(stuck),
        )
        newest = newest_record(pipeline)
        if newest is not None:
            yield _gauge(
                "exactly_newest_record_timestamp_seconds",
                "Kafka timestamp of the newest record a published batch read",
                name,
                newest[1].timestamp(),
            )
        batch = last_committed(pipeline)
        if batch is None:
            return
        if batch.committed_at is not None:
            yield _gauge(
                "exactly_last_commit_timestamp_seconds",
                "When the batch committed last was committed (the ledger database's clock)",
                name,
                batch.committed_at.timestamp(),
            )
        read = batch.metrics.get("records_read")
        quarantined = batch.metrics.get("quarantine_records")
        if read is not None and quarantined is not None:
            yield _gauge(
                "exactly_quarantine_ratio",
                "Share of the last committed batch's records that went to the quarantine",
                name,
                int(quarantined) / int(read) if read else 0.0,
            )


def _gauge(metric: str, documentation: str, pipeline: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(metric, documentation, labels=["pipeline"])
    family.add_metric([pipeline], value)
    return family
