"""The daemon section's pure parts (bench/daemon.py): a run's event log split into Dagster's
launch, the run and its ops; the medians and the targets. No server, no JVM: unit tests."""

from __future__ import annotations

import argparse

import pytest

from bench.daemon import (
    Event,
    render,
    side_by_side,
    spark_modes,
    spark_section,
    stage_outside_job,
    summarize,
    timeline,
)
from exactly_cli.bench_cmd import _spark_modes

PIPELINE = "bench_daemon_local"


def fabricated_run(t0: float = 1_000.0) -> list[Event]:
    """A daemon-launched run as the event log holds it (shuffled, as entries of one second
    may come back in any order): enqueued at t0, dequeued 4 s later, launched, its process
    up after 6 s more, then four ops with gaps between them."""
    steps = [
        ("plan", 11.0, 11.5),
        ("stage", 11.7, 27.7),
        ("prepare", 27.9, 28.0),
        ("commit", 28.1, 28.6),
    ]
    events = [
        Event(t0 + 0.0, "RUN_ENQUEUED"),
        Event(t0 + 4.0, "RUN_DEQUEUED"),
        Event(t0 + 4.5, "RUN_STARTING"),
        Event(t0 + 10.5, "RUN_START"),
        Event(t0 + 29.0, "RUN_SUCCESS"),
    ]
    for name, start, end in steps:
        key = f"{PIPELINE}_{name}"
        events += [
            Event(t0 + start, "STEP_START", key),
            Event(t0 + (start + end) / 2, "STEP_OUTPUT", key),
            Event(t0 + end, "STEP_SUCCESS", key),
        ]
    return list(reversed(events))


def test_a_daemon_runs_timeline_splits_launch_run_and_ops() -> None:
    t = timeline(fabricated_run(), PIPELINE, submitted=999.8)
    assert t["submit"] == pytest.approx(0.2)
    assert t["queue"] == pytest.approx(4.5)  # to RUN_STARTING: the daemon dequeued and launched
    assert t["process_start"] == pytest.approx(6.0)
    assert t["dagster_launch"] == pytest.approx(10.5)
    assert t["run"] == pytest.approx(18.5)
    assert t["steps"] == pytest.approx({"plan": 0.5, "stage": 16.0, "prepare": 0.1, "commit": 0.5})
    assert t["between_steps"] == pytest.approx(18.5 - 17.1)
    assert t["total"] == pytest.approx(29.2)


def test_an_in_process_run_has_no_launch() -> None:
    events = [e for e in fabricated_run() if e.kind not in ("RUN_ENQUEUED", "RUN_DEQUEUED")]
    events = [e for e in events if e.kind != "RUN_STARTING"]
    t = timeline(events, PIPELINE)
    assert t["submit"] is t["queue"] is t["process_start"] is None
    assert t["dagster_launch"] is None and t["total"] is None
    assert t["run"] == pytest.approx(18.5)


def test_a_failed_step_has_no_seconds() -> None:
    events = [e for e in fabricated_run() if not (e.kind == "STEP_SUCCESS" and "stage" in e.step)]
    events = [e for e in events if e.kind != "RUN_SUCCESS"]
    t = timeline(events, PIPELINE)
    assert "stage" not in t["steps"] and t["run"] is None and t["between_steps"] is None


def test_the_stage_outside_its_job_is_the_session_start() -> None:
    assert stage_outside_job({"stage": 16.0}, {"describe": 0.5, "write": 2.5}) == 13.0
    assert stage_outside_job({}, {"write": 1.0}) is None


def _run(run: float, stage: float, records: int = 5000) -> dict:
    return {
        "records": records,
        "timeline": {"run": run, "total": run + 10, "steps": {"stage": stage}},
        "ledger": {"stage_outside_job": stage - 1.0},
    }


def test_summary_medians_and_targets() -> None:
    raw = {
        "settings": {"batch_records": 5000, "partitions": 8, "runs": 3},
        "contenders": {
            "daemon_local": {"runs": [_run(18.0, 15.0), _run(20.0, 16.0), _run(19.0, 15.5)]},
            "daemon_shared": {"failed": "ConfigError: spark.server is not a field"},
            "in_process": {"runs": [_run(2.1, 1.5), _run(2.2, 1.6), _run(2.0, 1.4)]},
            "cli": {"runs": [_run(2.0, 1.5), _run(1.9, 1.4), _run(2.1, 1.6)]},
        },
    }
    s = summarize(raw)
    assert s["medians"]["daemon_local"]["run"] == 19.0
    assert s["medians"]["daemon_local"]["stage"] == 15.5
    assert s["medians"]["daemon_local"]["stage_outside_job"] == 14.5
    assert s["medians"]["daemon_shared"] is None
    assert s["vs_cli"]["in_process"]["run_beyond_cli_s"] == pytest.approx(0.1)
    assert s["in_process_within_0_2_s"] is True
    assert s["vs_cli"]["daemon_local"]["run_beyond_cli_s"] == pytest.approx(17.0)
    assert s["vs_cli"]["daemon_local"]["under_3_s"] is False
    text = "\n".join(render(raw, s))
    assert "daemon-launched (spark shared)  FAILED" in text
    assert "daemon-launched (spark shared) FAILED: ConfigError: spark.server" in text
    assert "(target <= 0.2 s: met)" in text and "(target < 3 s: NOT met)" in text


def test_spark_modes_and_sections() -> None:
    assert spark_modes("local, shared,local") == ("local", "shared")
    with pytest.raises(ValueError):
        spark_modes("remote")
    with pytest.raises(argparse.ArgumentTypeError):
        _spark_modes("")
    # `local` is left unsaid: a config without the `server` key stays valid
    assert spark_section("local[2]", "local") == {"master": "local[2]"}
    assert spark_section("local[2]", "shared") == {"master": "local[2]", "server": "shared"}


class FakeContender:
    def __init__(self, label: str, calls: list[str], fail_at: int | None = None) -> None:
        self.label = label
        self.calls = calls
        self.fail_at = fail_at

    def one(self, index: int) -> tuple[dict, str]:
        self.calls.append(f"{self.label}{index}")
        if index == self.fail_at:
            raise RuntimeError("broker gone\nsecond line")
        return {"index": index}, "ok"


def test_side_by_side_interleaves_alternating_and_discards_the_warm_up() -> None:
    calls: list[str] = []
    lines: list[str] = []
    out = side_by_side(
        [FakeContender("a", calls), FakeContender("b", calls, fail_at=2)], 3, lines.append
    )
    assert calls == ["a0", "b0", "b1", "a1", "a2", "b2", "a3"]
    assert out["a"] == {"runs": [{"index": 1}, {"index": 2}, {"index": 3}]}
    assert out["b"] == {"failed": "RuntimeError: broker gone"}
    assert "[daemon b] run 2/3: FAILED: RuntimeError: broker gone" in lines
