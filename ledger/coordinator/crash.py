"""Named crash points for failure testing: `EXACTLY_CRASH_AT=after_prepare` makes the
process die with os._exit at that point, as a kill -9 would, with no cleanup and no
exception handlers. Unset (always, in production) it costs one dictionary lookup.

The same points can hold the process instead, so a test can fail a service under it at a
known moment (restart the broker while a batch stages, the ledger database between the Delta
commit and COMMITTED): `EXACTLY_PAUSE_AT=after_delta_commit` with `EXACTLY_PAUSE_DIR=<folder>`
writes `<folder>/after_delta_commit.reached` and waits until `<folder>/after_delta_commit.resume`
exists. Reaching the point again (the next batch) finds the resume file and goes on.

A point reached more than once per batch (`between_derived_commits`, before each derived
output) can be named with the reach to die at: `between_derived_commits#2` dies before the
second output's commit, the first one committed.

The points follow docs/protocol.md's list of crash points to inject.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

POINTS = (
    "after_plan",
    "before_stage",
    "during_stage",
    "after_stage",
    "after_prepare",
    "between_derived_commits",
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


def _wanted(name: str, wanted: str) -> bool:
    """Whether `name`, reached now, is one of the points in EXACTLY_CRASH_AT's `wanted`."""
    for item in wanted.split(","):
        point, _sep, reach = item.partition("#")
        if point == name and (not reach or int(reach) == _reached[name]):
            return True
    return False


def crashpoint(name: str) -> None:
    if name not in POINTS:
        raise ValueError(f"unknown crash point {name!r}")
    _reached[name] = _reached.get(name, 0) + 1
    wanted = os.environ.get("EXACTLY_CRASH_AT")
    if wanted and _wanted(name, wanted):
        sys.stdout.flush()
        sys.stderr.write(f"exactly: crash point {name} reached; dying\n")
        sys.stderr.flush()
        os._exit(CRASH_EXIT_CODE)
    paused = os.environ.get("EXACTLY_PAUSE_AT")
    if paused and name in paused.split(","):
        _pause(name)


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
