"""How far a running stage job has got, as Spark itself reports it.

A batch of a million records stages for tens of seconds with nothing on the terminal; an
operator cannot tell a slow stage from a hung one. `watch` samples Spark's own status while
a block of code runs Spark jobs and hands each sample to a reporter (the CLI's progress line,
exactly_cli/progress.py). It observes only: nothing here takes part in the exactly-once
argument, and any failure to read the status ends the sampling, never the stage.

Where the figures come from:

- a classic session (local or a standalone cluster): the driver's status store, the source
  of Spark's web UI. Per stage: tasks done of all, records read from the source (Kafka) and
  records written. Running tasks report at each executor heartbeat, finished ones at once;
- a Spark Connect session (the shared server): the progress the server streams back to its
  client with every query. Per stage: tasks done of all and bytes read; no record counts.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StageProgress:
    """One sample over every Spark stage run since the watch began."""

    tasks_done: int
    tasks: int
    #: records read from the source and written, when Spark reports them (classic only)
    records_read: int | None = None
    records_written: int | None = None
    #: bytes read from the source, when Spark reports them (Spark Connect)
    bytes_read: int | None = None


@dataclass(frozen=True)
class ProgressSink:
    """Where a stager sends its samples: `report(batch label, planned offsets, sample)`,
    every `every` seconds while a stage runs."""

    report: Callable[[str, int, StageProgress], None]
    every: float


@dataclass
class _Stages:
    """The latest figures of every stage seen, by stage id: a finished stage keeps its
    last ones, so the totals never go back."""

    seen: dict[int, tuple[int, int, int | None, int | None, int | None]] = field(
        default_factory=dict
    )

    def update(self, stage_id: int, *figures: int | None) -> None:
        self.seen[stage_id] = figures  # type: ignore[assignment]

    def total(self) -> StageProgress | None:
        if not self.seen:
            return None
        columns = list(zip(*self.seen.values(), strict=True))

        def add(values: tuple[int | None, ...]) -> int | None:
            return None if any(v is None for v in values) else sum(v or 0 for v in values)

        done, tasks = sum(columns[0]), sum(columns[1])
        return StageProgress(done, tasks, add(columns[2]), add(columns[3]), add(columns[4]))


class _Classic:
    """Samples the driver's status store through py4j: the stages running now, and the last
    figures of those seen running before (a stage that starts and ends between two samples
    is missed; the next sample's totals still grow)."""

    def __init__(self, spark: Any) -> None:
        context = spark.sparkContext
        self._store = context._jsc.sc().statusStore()
        self._to_java = context._jvm.scala.jdk.javaapi.CollectionConverters.asJava
        # stages of jobs that were running before the watch began are not this block's
        self._before = {stage.stageId() for stage in self._active()}
        self._stages_seen = _Stages()

    def _active(self) -> Any:
        return self._to_java(self._store.activeStages())

    def _keep(self, stage: Any) -> None:
        self._stages_seen.update(
            stage.stageId(),
            stage.numCompleteTasks(),
            stage.numTasks(),
            stage.inputRecords(),
            stage.outputRecords(),
            None,
        )

    def sample(self) -> StageProgress | None:
        running = set()
        for stage in self._active():
            if stage.stageId() not in self._before:
                running.add(stage.stageId())
                self._keep(stage)
        for stage_id in set(self._stages_seen.seen) - running:
            self._keep(self._store.lastStageAttempt(stage_id))
        return self._stages_seen.total()

    def close(self) -> None:
        pass


class _Connect:
    """Keeps the progress the Connect server streams to this client."""

    def __init__(self, spark: Any) -> None:
        self._spark = spark
        self._stages_seen = _Stages()
        self._lock = threading.Lock()
        spark.registerProgressHandler(self)

    def __call__(self, stages: Any, inflight_tasks: int, operation_id: Any, done: bool) -> None:
        with self._lock:
            for stage in stages or ():
                self._stages_seen.update(
                    stage.stage_id,
                    stage.num_completed_tasks,
                    stage.num_tasks,
                    None,
                    None,
                    stage.num_bytes_read,
                )

    def sample(self) -> StageProgress | None:
        with self._lock:
            return self._stages_seen.total()

    def close(self) -> None:
        self._spark.removeProgressHandler(self)


def _sampler(spark: Any) -> _Classic | _Connect | None:
    try:
        if type(spark).__module__.startswith("pyspark.sql.connect"):
            return _Connect(spark)
        return _Classic(spark)
    except Exception:  # progress is a courtesy: no status, no line
        return None


@contextlib.contextmanager
def watch(spark: Any, report: Callable[[StageProgress], None], every: float) -> Iterator[None]:
    """Hand `report` a sample every `every` seconds while the block runs (none before the
    first `every` seconds, so a quick stage shows nothing), and none once it has ended."""
    sampler = _sampler(spark)
    if sampler is None:
        yield
        return
    stop = threading.Event()

    def sample_until_stopped() -> None:
        while not stop.wait(every):
            try:
                progress = sampler.sample()
            except Exception:  # see the module docstring
                return
            if progress is not None:
                report(progress)

    thread = threading.Thread(target=sample_until_stopped, name="exactly-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        with contextlib.suppress(Exception):
            sampler.close()
