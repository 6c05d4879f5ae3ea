"""The daemon section: runs launched the way operators launch them (issue 13 item 4).

A run launched from the Dagster UI, or by the schedule, goes through the webserver (a
GraphQL mutation), the instance's run queue (QueuedRunCoordinator, orchestration/dagster.yaml),
the daemon that dequeues it, and the default run launcher, which asks the code server to
start a new process (`dagster api execute_run`) that loads the code location and then runs
the job's ops; its first stage starts a Spark session (a new JVM) in that process. That is
the path measured here: `dagster dev -w workspace.yaml` (webserver, daemon, code server) on a
DAGSTER_HOME holding a copy of orchestration/dagster.yaml, serving one pipeline, and one
`<pipeline>_next_batch` run per batch of `batch_records` new records, submitted through the
webserver's GraphQL API.

Each run's timeline comes from the instance's event log and splits into:

- Dagster's launch: submit -> RUN_ENQUEUED (the mutation), RUN_ENQUEUED -> RUN_STARTING (the
  daemon's queue loop, every `dequeue_interval_seconds`, 5 s by default, dequeues the run and
  reports RUN_STARTING as it calls the launcher) and RUN_STARTING -> RUN_START (the new
  process's start and its loading of the code location);
- the run: RUN_START -> RUN_SUCCESS, and within it each op (STEP_START -> STEP_SUCCESS), the
  time between them, and, from the ledger (the ops record `phase_s`), how much of the stage
  is outside the stage job's own parts (`stage_detail_s`): mostly the Spark session's start.

Side by side, in the same invocation and with the same records per batch: the CLI path
(`run_batch` in this process on a warm Spark session, as `exactly run --continuous` runs
its batches) and the same `<pipeline>_next_batch` job executed in this process
(`execute_in_process`, sharing that session), the two interleaved run by run. The daemon's
runs go first, while this process has no JVM of its own, so they are not charged for one.

`spark_modes` runs the daemon part once per Spark session mode of the run processes (the
pipeline config's `spark.server`: `local`, a JVM per process, or `shared`, one Spark
Connect server per host); a config that does not accept the key fails that mode alone.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import product
from bench.report import ok

#: How long one daemon-launched run may take, from its submission to its end.
RUN_TIMEOUT_S = 600.0
#: The ops of the next-batch job, in order (its commit op also acks).
STEPS = ("plan", "stage", "prepare", "commit")
#: Launch segments of a run's timeline: (name, from event, to event). The daemon of this
#: Dagster (1.13) reports RUN_STARTING when it dequeues a run, just before it asks the run
#: launcher (no RUN_DEQUEUED event), so the queue ends there.
LAUNCH_SEGMENTS = (
    ("queue", "RUN_ENQUEUED", "RUN_STARTING"),
    ("process_start", "RUN_STARTING", "RUN_START"),
)
SPARK_MODES = ("local", "shared")


@dataclass(frozen=True)
class DaemonSettings:
    runs: int = 5
    batch_records: int = 5_000
    partitions: int = 8
    record_bytes: int = 500
    spark_modes: tuple[str, ...] = ("local", "shared")
    spark_master: str = "local[2]"


# -- the timeline (pure) -----------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """One event-log entry: when (epoch seconds), its type's name (DagsterEventType), its
    step (None for run events)."""

    timestamp: float
    kind: str
    step: str | None = None


def _first(events: Iterable[Event], kind: str, step: str | None = None) -> float | None:
    found = [e.timestamp for e in events if e.kind == kind and (step is None or e.step == step)]
    return min(found) if found else None


def _span(start: float | None, end: float | None) -> float | None:
    return end - start if start is not None and end is not None else None


def timeline(
    events: Sequence[Event], pipeline: str, submitted: float | None = None
) -> dict[str, Any]:
    """A run's event log as Dagster's launch (queue, launcher, process start and code load),
    the run (RUN_START -> RUN_SUCCESS), each op's seconds and the run's time outside its
    ops; a segment whose events are missing (an in-process run is never queued) is None.

    `submitted` (epoch seconds) is when the client sent the launch request."""
    enqueued = _first(events, "RUN_ENQUEUED")
    start = _first(events, "RUN_START")
    success = _first(events, "RUN_SUCCESS")
    launch = {name: _span(_first(events, a), _first(events, b)) for name, a, b in LAUNCH_SEGMENTS}
    steps: dict[str, float] = {}
    prefix = f"{pipeline}_"
    for key in dict.fromkeys(e.step for e in events if e.step):
        began = _first(events, "STEP_START", key)
        ended = _first(events, "STEP_SUCCESS", key)
        if began is not None and ended is not None:
            steps[key.removeprefix(prefix)] = ended - began
    run = _span(start, success)
    return {
        "submit": _span(submitted, enqueued),
        **launch,
        "dagster_launch": _span(enqueued, start),
        "run": run,
        "steps": steps,
        "between_steps": run - sum(steps.values()) if run is not None else None,
        "total": _span(submitted if submitted is not None else enqueued, success),
    }


def stage_outside_job(phases: dict[str, float], stage_detail: dict[str, float]) -> float | None:
    """The stage op's seconds outside the stage job's own timed parts: in a new process,
    mostly the Spark session's start (a JVM, and its first query's set-up)."""
    if "stage" not in phases:
        return None
    return phases["stage"] - sum(stage_detail.values())


# -- the summary (pure) ------------------------------------------------------------------


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


#: The figures of one run each contender reports, and the table's columns, in order.
FIGURES = (
    "total",
    "submit",
    "queue",
    "process_start",
    "dagster_launch",
    "run",
    *STEPS,
    "between_steps",
    "stage_outside_job",
)


def medians(runs: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """Each figure's median over the runs (steps flattened to their names)."""
    flat = [{**r["timeline"], **r["timeline"]["steps"], **r["ledger"]} for r in runs]
    return {f: _median(row.get(f) for row in flat) for f in FIGURES}


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    """Medians per contender, and the differences the issue asks about: the in-process run
    against the CLI path (target: within 0.2 s), and what a daemon-launched run pays beyond
    the CLI's warm batch, Dagster's launch apart (target: under 3 s)."""
    rows: dict[str, Any] = {}
    for name, part in raw["contenders"].items():
        rows[name] = medians(part["runs"]) if ok(part) and part["runs"] else None
    cli = rows.get("cli")
    out: dict[str, Any] = {"medians": rows, "vs_cli": {}}
    if cli and cli["run"] is not None:
        for name, row in rows.items():
            if name == "cli" or not row or row["run"] is None:
                continue
            out["vs_cli"][name] = {"run_beyond_cli_s": row["run"] - cli["run"]}
        inproc = out["vs_cli"].get("in_process")
        if inproc:
            out["in_process_within_0_2_s"] = inproc["run_beyond_cli_s"] <= 0.2
        for name, diff in out["vs_cli"].items():
            if name.startswith("daemon"):
                diff["under_3_s"] = diff["run_beyond_cli_s"] < 3.0
    return out


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


LABELS = {
    "total": "submit->done",
    "submit": "submit",
    "queue": "queue",
    "process_start": "process+code",
    "dagster_launch": "Dagster launch",
    "run": "run",
    "between_steps": "between ops",
    "stage_outside_job": "stage outside job",
}


def _contender_label(name: str) -> str:
    if name.startswith("daemon_"):
        return f"daemon-launched (spark {name.removeprefix('daemon_')})"
    return {"in_process": "in-process Dagster", "cli": "CLI path (warm)"}.get(name, name)


def render(raw: dict[str, Any], summary: dict[str, Any]) -> list[str]:
    """The section's tables: medians side by side, then every daemon run."""
    from bench.report import _table

    s = raw["settings"]
    header = ["path", "runs", *(LABELS.get(f, f) for f in FIGURES)]
    out = [
        "",
        f"Runs launched by the daemon: {s['batch_records']:,} records per run over "
        f"{s['partitions']} partitions; medians of {s['runs']} runs, seconds. Dagster launch "
        "= RUN_ENQUEUED -> RUN_START (queue = until the daemon dequeues and launches it, "
        "process+code = the new process's start and code load); run = RUN_START -> "
        "RUN_SUCCESS; commit includes "
        "the ack; stage outside job = stage op minus the stage job's timed parts (mostly the "
        "Spark session's start)",
    ]
    rows = []
    for name, part in raw["contenders"].items():
        med = summary["medians"].get(name)
        if med is None:
            rows.append([_contender_label(name), "FAILED", *["-"] * len(FIGURES)])
            continue
        rows.append(
            [_contender_label(name), str(len(part["runs"])), *(_f(med[f]) for f in FIGURES)]
        )
    out += _table(header, rows)
    for name, part in raw["contenders"].items():
        if isinstance(part, dict) and "failed" in part:
            out.append(f"{_contender_label(name)} FAILED: {part['failed']}")
    alone = raw.get("session_start")
    if alone and "failed" not in alone:
        out.append(
            f"a new process's Spark session, alone: start {alone['start_s']:.2f} s, first "
            f"query {alone['first_query_s']:.2f} s (python -c, {alone['process_s']:.2f} s "
            "in all)"
        )
    for name, diff in summary["vs_cli"].items():
        line = (
            f"{_contender_label(name)}: run beyond the CLI batch {diff['run_beyond_cli_s']:+.2f} s"
        )
        if name == "in_process":
            met = "met" if summary.get("in_process_within_0_2_s") else "NOT met"
            line += f" (target <= 0.2 s: {met})"
        elif "under_3_s" in diff:
            met = "met" if diff["under_3_s"] else "NOT met"
            line += f", Dagster's launch apart (target < 3 s: {met})"
        out.append(line)
    for name, part in raw["contenders"].items():
        if not name.startswith("daemon_") or not ok(part) or not part["runs"]:
            continue
        out += ["", f"Every run, {_contender_label(name)}"]
        rows = []
        for i, run in enumerate(part["runs"], start=1):
            flat = {**run["timeline"], **run["timeline"]["steps"], **run["ledger"]}
            rows.append([str(i), f"{run['records']:,}", *(_f(flat.get(f)) for f in FIGURES)])
        out += _table(["run", "records", *(LABELS.get(f, f) for f in FIGURES)], rows)
    return out


def failures(raw: dict[str, Any] | None) -> list[str]:
    if not raw:
        return []
    return [
        f"daemon/{name}: {part['failed']}"
        for name, part in raw.get("contenders", {}).items()
        if isinstance(part, dict) and "failed" in part
    ]


# -- the measurements ----------------------------------------------------------------------


def shared_state(root: Path) -> Path:
    """The bench's own state folder for shared Spark servers: never the operator's."""
    return root / "shared-spark-state"


def stop_shared_spark_server(root: Path) -> None:
    """Stop the shared Spark Connect server the `shared` mode's runs started (it outlives
    runs by design); called once at the end of the section whenever that mode ran."""
    from resources.spark.shared_server import STATE_ENV, stop_servers

    stop_servers({STATE_ENV: str(shared_state(root))})


def spark_section(master: str, mode: str) -> dict[str, Any]:
    """The config's `spark` section for a Spark session mode; `local` (the default) is left
    unsaid, so the config stays valid where `spark.server` does not exist yet."""
    section: dict[str, Any] = {"master": master}
    if mode != "local":
        section["server"] = mode
    return section


def _events(instance: Any, run_id: str) -> list[Event]:
    found = []
    for entry in instance.all_logs(run_id):
        event = entry.dagster_event
        if event is not None:
            found.append(Event(entry.timestamp, event.event_type.name, event.step_key))
    return found


def _ledger_figures(config: Any, batch_id: int | None) -> tuple[int, dict[str, Any]]:
    """(records read, phase seconds and the stage's outside part) of a batch, from its
    ledger record (the ops record their seconds as `phase_s`)."""
    from ledger.store.ledger_store import LedgerStore

    if batch_id is None:
        return 0, {}
    store = LedgerStore(config.ledger.url)
    found = [b for b in store.batches(pipeline=config.pipeline) if b.batch_id == batch_id]
    if not found:
        return 0, {}
    metrics = found[0].metrics
    phases = dict(metrics.get("phase_s", {}))
    detail = dict(metrics.get("stage_detail_s", {}))
    return int(metrics.get("records_read", 0)), {
        "phase_s": phases,
        "stage_detail_s": detail,
        "stage_outside_job": stage_outside_job(phases, detail),
    }


def _produce(bootstrap: str, topic: str, settings: DaemonSettings, first: int) -> None:
    from bench.data import produce
    from resources.kafka.client import KafkaClient

    with KafkaClient(bootstrap, timeout=60) as client:
        produce(
            client,
            topic,
            records=settings.batch_records,
            partitions=settings.partitions,
            record_bytes=settings.record_bytes,
            first=first,
        )


def _per_partition(settings: DaemonSettings) -> int:
    return -(-settings.batch_records // settings.partitions)


def _check_records(what: str, records: int, expected: int) -> None:
    if records != expected:
        raise product.BenchError(f"{what}: the batch read {records} records, not {expected}")


def daemon_runs(
    root: Path, bootstrap: str, settings: DaemonSettings, mode: str, log: Callable[[str], None]
) -> dict[str, Any]:
    """One warm-up run (discarded: the first run of a fresh instance), then `settings.runs`
    runs of `<pipeline>_next_batch`, each submitted through the webserver's GraphQL API after
    `batch_records` new records, launched by the daemon in a new process."""
    import dagster as dg
    from dagster_graphql import DagsterGraphQLClient

    from orchestration.dagster_dev import DagsterDev
    from orchestration.tags import BATCH_TAG

    name = f"bench_daemon_{mode}"
    topic = f"bench-daemon-{mode}"
    folder = root / name / "pipelines"
    folder.mkdir(parents=True)
    # written and read back: a config that rejects `spark.server` fails this mode here
    product.pipeline_config(
        root / name / "data",
        name,
        bootstrap,
        topic,
        _per_partition(settings),
        spark=spark_section(settings.spark_master, mode),
    )
    shutil.move(product.config_file(root / name / "data"), folder / f"{name}.yaml")
    config_path = folder / f"{name}.yaml"
    home = root / name / "dagster_home"
    dev = DagsterDev(
        home,
        {
            "EXACTLY_PIPELINES_DIR": str(folder),
            "EXACTLY_SPARK_SERVER": mode,
            "EXACTLY_STATE_DIR": str(shared_state(root)),
        },
        root / name / "dagster-dev.log",
    )
    runs: list[dict[str, Any]] = []
    started = time.perf_counter()
    dev.start()
    log(f"[daemon {mode}] dagster dev serving in {time.perf_counter() - started:.1f} s")
    try:
        client = DagsterGraphQLClient("127.0.0.1", port_number=dev.port)
        with dg.DagsterInstance.from_config(str(home)) as instance:
            for index in range(settings.runs + 1):
                _produce(bootstrap, topic, settings, index * settings.batch_records)
                submitted = time.time()
                run_id = client.submit_job_execution(f"{name}_next_batch")
                run = _wait(instance, run_id, dev)
                label = run.tags.get(BATCH_TAG)
                batch_id = int(label) if label and label.isdigit() else None
                records, ledger = _ledger_figures(_reload(config_path), batch_id)
                _check_records(f"{name} run {run_id}", records, settings.batch_records)
                figures = {
                    "run_id": run_id,
                    "batch_id": batch_id,
                    "records": records,
                    "timeline": timeline(_events(instance, run_id), name, submitted),
                    "ledger": ledger,
                }
                t = figures["timeline"]
                what = "warm-up (discarded)" if index == 0 else f"run {index}/{settings.runs}"
                log(
                    f"[daemon {mode}] {what}: {records:,} records, submit->done "
                    f"{_f(t['total'])} s = Dagster launch {_f(t['dagster_launch'])} + run "
                    f"{_f(t['run'])} (stage {_f(t['steps'].get('stage'))}, outside its job "
                    f"{_f(ledger.get('stage_outside_job'))})"
                )
                if index:
                    runs.append(figures)
    finally:
        dev.close()
    return {"mode": mode, "runs": runs, "dagster_dev_log": str(dev.log_path)}


def _reload(path: Path) -> Any:
    from resources.config.loading import load_config

    return load_config(path)


def _wait(instance: Any, run_id: str, dev: Any) -> Any:
    """The run once it has ended; a run that did not succeed is an error with its log."""
    from dagster import DagsterRunStatus

    ended = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        run = instance.get_run_by_id(run_id)
        if run is not None and run.status in ended:
            if run.status is not DagsterRunStatus.SUCCESS:
                errors = [e.user_message for e in instance.all_logs(run_id) if e.level >= 40]
                raise product.BenchError(
                    f"run {run_id} ended {run.status.value}: {' | '.join(errors)[-600:]}"
                )
            return run
        time.sleep(0.1)
    raise product.BenchError(
        f"run {run_id} did not end within {RUN_TIMEOUT_S:.0f} s:\n{dev.log_tail(2000)}"
    )


def _figures(
    batch_id: int, records: int, tl: dict[str, Any], phases: dict[str, float], detail: dict
) -> dict[str, Any]:
    return {
        "batch_id": batch_id,
        "records": records,
        "timeline": tl,
        "ledger": {
            "phase_s": phases,
            "stage_detail_s": detail,
            "stage_outside_job": stage_outside_job(phases, detail),
        },
    }


class CliPath:
    """The CLI path on this process's warm session: `run_batch` of `batch_records` new
    records, as `exactly run` runs each batch."""

    label = "cli"

    def __init__(self, spark: Any, root: Path, bootstrap: str, settings: DaemonSettings) -> None:
        from jobs.wiring.pipeline import build

        self.name = "bench_daemon_cli"
        self.topic = "bench-daemon-cli"
        self.bootstrap = bootstrap
        self.settings = settings
        config = product.pipeline_config(
            root / self.name, self.name, bootstrap, self.topic, _per_partition(settings)
        )
        self.tpc = build(config, spark_factory=lambda: spark)

    def one(self, index: int) -> tuple[dict[str, Any], str]:
        _produce(self.bootstrap, self.topic, self.settings, index * self.settings.batch_records)
        t = time.perf_counter()
        report = self.tpc.run_batch()
        wall = time.perf_counter() - t
        if report is None:
            raise product.BenchError(f"{self.name}: nothing to read after producing")
        _check_records(self.name, report.output.records_read, self.settings.batch_records)
        phases = dict(report.seconds)
        steps = {s: phases.get(s, 0.0) for s in STEPS}
        steps["commit"] += phases.get("ack", 0.0)  # the Dagster commit op also acks
        run_s = sum(phases.values())
        tl = {"run": run_s, "total": wall, "steps": steps, "between_steps": 0.0}
        figures = _figures(
            report.batch.batch_id,
            report.output.records_read,
            tl,
            phases,
            dict(report.output.seconds),
        )
        return figures, f"{report.output.records_read:,} records in {run_s:.2f} s"

    def close(self) -> None:
        pass


class InProcess:
    """The same next-batch job executed in this process (`execute_in_process`), whose
    Pipeline opens this process's running Spark session."""

    label = "in_process"

    def __init__(self, root: Path, bootstrap: str, settings: DaemonSettings) -> None:
        import dagster as dg

        from orchestration.pipeline_definitions import pipeline_definitions

        self.name = "bench_daemon_inproc"
        self.topic = "bench-daemon-inproc"
        self.bootstrap = bootstrap
        self.settings = settings
        product.pipeline_config(
            root / self.name,
            self.name,
            bootstrap,
            self.topic,
            _per_partition(settings),
            spark={"master": settings.spark_master},
        )
        self.jobs = pipeline_definitions(product.config_file(root / self.name))
        self.stack = contextlib.ExitStack()
        self.instance = self.stack.enter_context(dg.DagsterInstance.ephemeral())
        # the Pipeline is closed before the section's files are removed
        self.stack.enter_context(contextlib.closing(self.jobs.resource))

    def one(self, index: int) -> tuple[dict[str, Any], str]:
        _produce(self.bootstrap, self.topic, self.settings, index * self.settings.batch_records)
        t = time.perf_counter()
        result = self.jobs.next_batch.execute_in_process(
            run_config=product.QUIET_RUN_CONFIG, instance=self.instance, raise_on_error=True
        )
        wall = time.perf_counter() - t
        batch = result.output_for_node(f"{self.name}_commit")
        records = int(batch.metrics.get("records_read", 0))
        _check_records(self.name, records, self.settings.batch_records)
        tl = timeline(_events(self.instance, result.run_id), self.name)
        tl["total"] = wall
        figures = _figures(
            batch.batch_id,
            records,
            tl,
            dict(batch.metrics.get("phase_s", {})),
            dict(batch.metrics.get("stage_detail_s", {})),
        )
        figures["run_id"] = result.run_id
        return (
            figures,
            f"{records:,} records, run {_f(tl['run'])} s (execute_in_process {wall:.2f} s)",
        )

    def close(self) -> None:
        self.stack.close()


def side_by_side(contenders: Sequence[Any], runs: int, log: Callable[[str], None]) -> dict:
    """One warm-up batch each (discarded), then `runs` batches each, interleaved and in
    turns of alternating order, so neither is the one that always runs on a JVM the other
    has just warmed (or on the load of the moment). A contender that fails is recorded as
    failed and left out of the remaining turns."""
    out: dict[str, Any] = {c.label: {"runs": []} for c in contenders}
    for index in range(runs + 1):
        turn = contenders if index % 2 == 0 else list(reversed(contenders))
        for contender in turn:
            if "failed" in out[contender.label]:
                continue
            what = "warm-up (discarded)" if index == 0 else f"run {index}/{runs}"
            try:
                figures, line = contender.one(index)
            except Exception as exc:
                out[contender.label] = {"failed": _reason(exc)}
                log(f"[daemon {contender.label}] {what}: FAILED: {_reason(exc)}")
                continue
            log(f"[daemon {contender.label}] {what}: {line}")
            if index:
                out[contender.label]["runs"].append(figures)
    return out


#: A new process's Spark session, as a run process starts it: build_session, then a first
#: query; printed as JSON.
SESSION_PROBE = """
import json, time
t0 = time.perf_counter()
from resources.spark.session import build_session
t1 = time.perf_counter()
spark = build_session({master!r}, {{}})
t2 = time.perf_counter()
spark.range(1).count()
t3 = time.perf_counter()
spark.stop()
print(json.dumps({{"import_s": t1 - t0, "start_s": t2 - t1, "first_query_s": t3 - t2}}))
"""


def session_start(master: str) -> dict[str, Any]:
    """A Spark session started in a new Python process, alone (the run processes' JVM start,
    without Dagster around it)."""
    import subprocess

    t = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", SESSION_PROBE.format(master=master)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    figures["process_s"] = time.perf_counter() - t
    return figures


def _reason(exc: BaseException) -> str:
    first = next((line for line in str(exc).splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {first[:300]}"


def _attempt(what: str, action: Callable[[], dict[str, Any]], log: Callable[[str], None]) -> Any:
    """A contender's figures, or its failure recorded (the section goes on)."""
    try:
        return action()
    except Exception as exc:
        log(f"[daemon] {what}: FAILED: {_reason(exc)}")
        return {"failed": _reason(exc)}


def run(settings: DaemonSettings, root: Path, bootstrap: str, log: Callable[[str], None]) -> dict:
    """Every contender of the section: the daemon's runs per Spark mode first (no JVM in this
    process yet), then the in-process run and the CLI path, interleaved, on one session."""
    from resources.spark.session import build_session

    out: dict[str, Any] = {"settings": asdict(settings), "contenders": {}}
    try:
        for mode in settings.spark_modes:
            out["contenders"][f"daemon_{mode}"] = _attempt(
                f"daemon-launched runs (spark {mode})",
                lambda mode=mode: daemon_runs(root, bootstrap, settings, mode, log),
                log,
            )
    finally:
        if any(m != "local" for m in settings.spark_modes):
            _attempt("stopping the shared Spark server", lambda: _stopped(root), log)
    out["session_start"] = _attempt(
        "a new process's Spark session", lambda: session_start(settings.spark_master), log
    )
    if "failed" not in out["session_start"]:
        log(
            f"[daemon] a new process's Spark session: start {out['session_start']['start_s']:.2f}"
            f" s, first query {out['session_start']['first_query_s']:.2f} s"
        )
    t = time.perf_counter()
    spark = build_session(settings.spark_master, {})
    out["spark_session_start_s"] = time.perf_counter() - t
    contenders: list[Any] = []
    try:
        for label, make in (
            ("in_process", lambda: InProcess(root, bootstrap, settings)),
            ("cli", lambda: CliPath(spark, root, bootstrap, settings)),
        ):
            try:
                contenders.append(make())
            except Exception as exc:
                out["contenders"][label] = {"failed": _reason(exc)}
                log(f"[daemon] {label}: FAILED: {_reason(exc)}")
        found = side_by_side(contenders, settings.runs, log)
        for contender in contenders:
            out["contenders"][contender.label] = found[contender.label]
    finally:
        for contender in contenders:
            with contextlib.suppress(Exception):
                contender.close()
        with contextlib.suppress(Exception):
            spark.stop()
    return out


def _stopped(root: Path) -> dict[str, Any]:
    stop_shared_spark_server(root)
    return {}


def run_daemon_only(
    settings: DaemonSettings,
    work_dir: Path | None = None,
    keep: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The daemon section alone, on a broker of its own."""
    from bench.harness import BROKER_START_TIMEOUT, _load, describe_machine
    from resources.jvm.process import free_port
    from resources.kafka.embedded_broker import EmbeddedBroker

    started = time.perf_counter()
    result: dict[str, Any] = {
        "machine": describe_machine(),
        "load_before": _load(),
        "command": " ".join(sys.argv),
    }
    root = Path(tempfile.mkdtemp(prefix="exactly-bench-", dir=work_dir))
    log(f"bench: working in {root}")
    broker = EmbeddedBroker(root / "kafka", port=free_port())
    try:
        bootstrap = broker.start(timeout=BROKER_START_TIMEOUT)
        result["daemon"] = run(settings, root, bootstrap, log)
    finally:
        broker.stop()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    result["load_after"] = _load()
    result["total_seconds"] = time.perf_counter() - started
    result["failures"] = failures(result["daemon"])
    result["daemon_summary"] = summarize(result["daemon"])
    return result


def spark_modes(text: str) -> tuple[str, ...]:
    """'local,shared' -> ('local', 'shared'); every mode must be known."""
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    unknown = [m for m in modes if m not in SPARK_MODES]
    if not modes or unknown:
        raise ValueError(f"{text!r}: Spark modes are {', '.join(SPARK_MODES)}")
    return tuple(dict.fromkeys(modes))
