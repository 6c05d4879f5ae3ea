"""Named crash points for failure testing: `EXACTLY_CRASH_AT=after_prepare` makes the
process die with os._exit at that point, as a kill -9 would, with no cleanup and no
exception handlers. Unset (always, in production) it costs one dictionary lookup.

The same points can hold the process instead, so a test can fail a service under it at a
known moment (restart the broker while a batch stages, the ledger database between the Delta
commit and COMMITTED): `EXACTLY_PAUSE_AT=after_delta_commit` with `EXACTLY_PAUSE_DIR=<folder>`
writes `<folder>/after_delta_commit.reached` and waits until `<folder>/after_delta_commit.resume`
exists. Reaching the point again (the next batch) finds the resume file and goes on.

A point reached more than once per batch (`between_derived_commits`, before each derived
output) can be named with the reach to die at: `between_derived_commits#2` dies the second
time it is reached. A point reached per output can be named with the output instead:
`after_derived_commit@views_per_app` dies once that output's MERGE committed. The derived
Delta outputs are merged at once, each on its own thread (jobs/publish/delta_publisher.py),
so which of the others have committed by then is up to the threads; a test that needs one
state pauses the others before their MERGE (`EXACTLY_PAUSE_AT=between_derived_commits@
views_per_minute,...`), and the kill then finds exactly the outputs it let through.

The points follow docs/protocol.md's list of crash points to inject.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

POINTS = (
    "after_plan",
    "before_stage",
    "during_stage",
    "after_stage",
    "after_prepare",
    "between_derived_commits",
    # after one derived Delta output's MERGE committed, on that output's thread
    "after_derived_commit",
    # resources/postgres/apply.py: a PostgreSQL output's transaction, before and after its COMMIT
    "postgres_before_commit",
    "postgres_after_commit",
    "between_table_commits",
    "after_delta_commit",
    "after_committed",
    "recovery_after_delta_commit",
)

#: exit status of a process killed at a crash point (as 128 + SIGKILL)
CRASH_EXIT_CODE = 137
#: how often a paused process looks for its resume file
PAUSE_POLL_SECONDS = 0.1
#: how often this process reached each point, for `point#n`
_reached: dict[str, int] = {}
#: points are reached from several threads at once (the derived outputs' MERGEs)
_counting = threading.Lock()


def _matching(name: str, at: str | None, reach: int, wanted: str) -> str | None:
    """The item of `wanted` (EXACTLY_CRASH_AT's or EXACTLY_PAUSE_AT's) that `name`, reached
    now for the `reach`-th time and for output `at`, matches: `name`, `name#<reach>` or
    `name@<at>`; None for none."""
    for item in wanted.split(","):
        point, _sep, count = item.partition("#")
        point, _sep, output = point.partition("@")
        if point != name or (count and int(count) != reach) or (output and output != at):
            continue
        return item
    return None


def crashpoint(name: str, at: str | None = None) -> None:
    """Die or pause at point `name` if the environment asks; `at` names the output a
    point reached once per output is reached for."""
    if name not in POINTS:
        raise ValueError(f"unknown crash point {name!r}")
    with _counting:
        _reached[name] = reach = _reached.get(name, 0) + 1
    wanted = os.environ.get("EXACTLY_CRASH_AT")
    if wanted and _matching(name, at, reach, wanted):
        sys.stdout.flush()
        sys.stderr.write(f"exactly: crash point {name} reached; dying\n")
        sys.stderr.flush()
        os._exit(CRASH_EXIT_CODE)
    paused = os.environ.get("EXACTLY_PAUSE_AT")
    item = _matching(name, at, reach, paused) if paused else None
    if item is not None and "#" not in item:
        _pause(item)


def _pause(name: str) -> None:
    folder = os.environ.get("EXACTLY_PAUSE_DIR")
    if not folder:
        raise RuntimeError("EXACTLY_PAUSE_AT is set without EXACTLY_PAUSE_DIR")
    resume = Path(folder) / f"{name}.resume"
    if resume.exists():
        return
    sys.stderr.write(f"exactly: pause point {name} reached; waiting for {resume}\n")
    sys.stderr.flush()
    (Path(folder) / f"{name}.reached").write_text(str(os.getpid()))
    while not resume.exists():
        time.sleep(PAUSE_POLL_SECONDS)
