"""The derived outputs' lanes (jobs/publish/lanes.py) and the crash points reached on them
(ledger/coordinator/crash.py): plain threads and environment variables, no JVM."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from jobs.publish.lanes import Lanes
from ledger.coordinator import crash

pytestmark = pytest.mark.unit


def test_the_lanes_run_at_once_each_output_on_the_same_thread_batch_after_batch() -> None:
    lanes = Lanes()
    both = threading.Barrier(2)

    def task() -> str:
        both.wait(timeout=5)  # a lane run after the other would break the barrier
        return threading.current_thread().name

    first = lanes.run([("derived:a", task), ("derived:b", task)])
    again = lanes.run([("derived:a", task), ("derived:b", task)])
    assert first == again  # one thread per output: its kept Delta table stays that thread's
    assert first[0] != first[1]
    assert threading.current_thread().name not in first


def test_a_failed_lane_is_raised_in_config_order_once_every_lane_ended() -> None:
    lanes = Lanes()
    ended: list[str] = []

    def slow() -> None:
        time.sleep(0.3)
        ended.append("slow")

    def fails(message: str) -> None:
        raise RuntimeError(message)

    with pytest.raises(RuntimeError, match="first"):
        lanes.run(
            [("derived:a", slow), ("derived:b", lambda: fails("first")),
             ("derived:c", lambda: fails("second"))]
        )  # fmt: skip
    assert ended == ["slow"]  # no MERGE is left running behind the error


def test_a_point_named_with_an_output_pauses_only_that_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXACTLY_PAUSE_AT", "between_derived_commits@views_per_minute")
    monkeypatch.setenv("EXACTLY_PAUSE_DIR", str(tmp_path))
    monkeypatch.setattr(crash, "PAUSE_POLL_SECONDS", 0.01)
    crash.crashpoint("between_derived_commits", "views_per_app")  # goes on
    held = threading.Thread(
        target=crash.crashpoint, args=("between_derived_commits", "views_per_minute")
    )
    held.start()
    reached = tmp_path / "between_derived_commits@views_per_minute.reached"
    for _ in range(500):
        if reached.exists():
            break
        time.sleep(0.01)
    assert reached.exists() and held.is_alive()
    (tmp_path / "between_derived_commits@views_per_minute.resume").touch()
    held.join(timeout=5)
    assert not held.is_alive()


@pytest.mark.parametrize(
    ("wanted", "at", "matches"),
    [
        ("after_derived_commit", "views_per_app", True),
        ("after_derived_commit@views_per_app", "views_per_app", True),
        ("after_derived_commit@views_per_app", "latest_per_user", False),
        ("between_table_commits,after_derived_commit@latest_per_user", "latest_per_user", True),
        ("after_derived_commit#2", "views_per_app", False),  # reached once so far
    ],
)
def test_a_crash_point_names_its_reach_or_its_output(wanted: str, at: str, matches: bool) -> None:
    assert (crash._matching("after_derived_commit", at, 1, wanted) is not None) is matches


def _run_in_child(lanes: Lanes, results: Any) -> None:
    results.put(lanes.run([("derived:a", lambda: "done in the child")]))


def test_lanes_used_before_a_fork_still_run_in_the_child() -> None:
    """A process that forks after a publish (an embedding app's pre-fork server, a forking
    task runner) inherits the lanes' executors but not their threads: a task queued there
    would wait for ever, and the batch stay PREPARED under a live owner."""
    import multiprocessing

    lanes = Lanes()
    assert lanes.run([("derived:a", lambda: 1)]) == [1]  # the lane's thread exists now
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_run_in_child, args=(lanes, results))
    child.start()
    child.join(timeout=20)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail("the forked child's lane never ran its task")
    assert child.exitcode == 0
    assert results.get(timeout=5) == ["done in the child"]
