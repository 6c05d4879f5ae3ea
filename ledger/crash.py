"""Named crash points for failure testing: `EXACTLY_CRASH_AT=after_prepare` makes the
process die with os._exit at that point, as a kill -9 would, with no cleanup and no
exception handlers. Unset (always, in production) it costs one dictionary lookup.

The points follow docs/protocol.md's list of crash points to inject.
"""

from __future__ import annotations

import os
import sys

POINTS = (
    "after_plan",
    "during_stage",
    "after_stage",
    "after_prepare",
    "between_table_commits",
    "after_delta_commit",
    "after_committed",
    "recovery_after_delta_commit",
)

#: exit status of a process killed at a crash point (as 128 + SIGKILL)
CRASH_EXIT_CODE = 137


def crashpoint(name: str) -> None:
    if name not in POINTS:
        raise ValueError(f"unknown crash point {name!r}")
    wanted = os.environ.get("EXACTLY_CRASH_AT")
    if wanted and name in wanted.split(","):
        sys.stdout.flush()
        sys.stderr.write(f"exactly: crash point {name} reached; dying\n")
        sys.stderr.flush()
        os._exit(CRASH_EXIT_CODE)
