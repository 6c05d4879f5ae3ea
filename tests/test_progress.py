"""The stage's progress line (resources/spark/progress.py, exactly_cli/progress.py): what
Spark reports while a job runs, in place on a terminal and as plain lines elsewhere."""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from exactly_cli import pipeline_cmd
from exactly_cli.pipeline_cmd import run_pipeline
from exactly_cli.progress import ProgressLine, describe
from jobs.examples.sample_data import pageviews
from resources.spark.progress import ProgressSink, StageProgress, _Stages, watch
from tests.fixtures.pipeline import assert_exactly_once, config_path

REPO = Path(__file__).resolve().parent.parent


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_one_line_updated_in_place_and_cleared_before_a_message() -> None:
    out = _Terminal()
    line = ProgressLine(out)
    line.show("p/3", 1000, StageProgress(1, 4, 250, 240))
    line.show("p/3", 1000, StageProgress(3, 4, 0, 740))  # Spark's Kafka source counts none
    line.say("batch p/3: ACKED")
    assert out.getvalue() == (
        "\r\x1b[Kstage p/3: 250 of at most 1,000 records read, 240 rows written, tasks 1/4"
        "\r\x1b[Kstage p/3: 740 rows written of at most 1,000 records, tasks 3/4"
        "\r\x1b[Kbatch p/3: ACKED\n"
    )
    assert line.every() == 1.0


def test_a_log_gets_plain_lines_and_nothing_to_clear() -> None:
    out = io.StringIO()
    line = ProgressLine(out)
    line.show("p/3", 10, StageProgress(0, 2, bytes_read=2_500_000))
    line.say("batch p/3: ACKED")
    assert out.getvalue() == (
        "stage p/3: 2.5 MB read of at most 10 records, tasks 0/2\nbatch p/3: ACKED\n"
    )
    assert line.every() == 10.0


def test_totals_keep_a_finished_stages_figures_and_say_unknown_when_one_is_unknown() -> None:
    stages = _Stages()
    assert stages.total() is None
    stages.update(1, 4, 4, 100, 100, None)
    stages.update(2, 1, 8, 20, 0, None)
    assert stages.total() == StageProgress(5, 12, 120, 100, None)
    stages.update(2, 8, 8, 160, 150, None)
    assert describe("p/1", 300, stages.total()) == (  # type: ignore[arg-type]
        "stage p/1: 260 of at most 300 records read, 250 rows written, tasks 12/12"
    )


def test_watch_samples_a_running_spark_job_as_it_goes(spark: Any, tmp_path: Path) -> None:
    """A real job of 8 tasks on 2 cores: the samples see tasks finish one after another, and
    the records written grow to all of them."""
    samples: list[StageProgress] = []
    lock = threading.Lock()

    def keep(sample: StageProgress) -> None:
        with lock:
            samples.append(sample)

    def slow(rows: Any) -> Any:
        for row in rows:
            time.sleep(0.0005)
            yield row

    frame = spark.range(0, 8000, numPartitions=8)
    with watch(spark, keep, 0.2):
        rows = frame.rdd.mapPartitions(slow).map(lambda r: (r[0],))
        spark.createDataFrame(rows, "id long").write.parquet(str(tmp_path / "out"))
    assert len(samples) >= 3, samples
    done = [s.tasks_done for s in samples]
    assert done == sorted(done) and len(set(done)) > 1, done
    assert all(s.tasks == 8 for s in samples), samples
    assert samples[-1].records_written is not None
    written = [s.records_written for s in samples]
    assert written == sorted(written) and written[-1] > 0, written  # type: ignore[type-var]
    time.sleep(0.5)
    assert len(samples) == len(done), "sampling went on after the block ended"


def _exactly(args: list[str], terminal: bool) -> tuple[int, str]:
    """Run `exactly` with its stdout on a pseudo-terminal, or on a pipe."""
    command = [sys.executable, "-m", "exactly_cli", *args]
    if not terminal:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)
        return done.returncode, done.stdout
    main, child = pty.openpty()
    process = subprocess.Popen(command, stdout=child, stderr=subprocess.DEVNULL, cwd=REPO)
    os.close(child)
    chunks = []
    while True:
        ready, _, _ = select.select([main], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the child closed its end
                break
            if not chunk:
                break
            chunks.append(chunk)
        elif process.poll() is not None:
            break
    os.close(main)
    return process.wait(timeout=60), b"".join(chunks).decode()


def test_exactly_run_shows_the_stage_in_place_on_a_terminal_and_in_lines_in_a_log(
    kafka_client: Any, pipeline_factory: Any
) -> None:
    config = pipeline_factory(4)
    path = str(config_path(config))
    kafka_client.produce(config.kafka.topic, pageviews(4000))
    code, shown = _exactly(["run", "-c", path, "--progress-every", "0.2"], terminal=True)
    assert code == 0, shown
    assert "\r\x1b[Kstage pageviews/1 attempt 1: " in shown and "tasks " in shown, shown
    assert "\r\x1b[Kbatch " in shown  # the line in place was cleared before the batch line

    assert assert_exactly_once(config, kafka_client) == (4000, 0)


def test_a_log_gets_the_stages_progress_in_plain_lines(
    spark: Any, kafka_client: Any, pipeline_factory: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same command's code with its output captured (not a terminal), in this process's
    Spark session rather than a new JVM."""
    config = pipeline_factory(4)
    kafka_client.produce(config.kafka.topic, pageviews(4000))
    sink = ProgressSink(pipeline_cmd._LINE.show, 0.1)
    run_pipeline(config, batches=None, spark_factory=lambda: spark, progress=sink)
    logged = capsys.readouterr().out
    lines = logged.splitlines()
    progress = [line for line in lines if line.startswith("stage pageviews/1 attempt 1: ")]
    assert progress and "\r" not in logged and "\x1b" not in logged, logged
    assert "rows written of at most 4,000 records" in progress[-1], progress
    assert lines.index(progress[-1]) < next(i for i, x in enumerate(lines) if "ACKED" in x)
    assert assert_exactly_once(config, kafka_client) == (4000, 0)
