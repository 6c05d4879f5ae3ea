"""Which staged files are orphans that may be deleted (invariant 18): the rule alone, pure.

An attempt writes its files into a folder of its own under `<table>/staged/<app_id>/` and
nothing deletes them (invariant 4); a fenced or abandoned attempt leaves them behind
(invariant 3). `jobs/maintenance/cleaner.py` lists those folders, reads the ledger and both Delta
logs,
and asks `classify` which files may go. A file is kept when any of these holds:

1. the Delta log still names it: the table's current snapshot, or a file a later commit
   removed (a replace, a compaction) that time travel may still read; that one is Delta's
   own VACUUM's to delete, after the table's retention;
2. a vote names it: the ledger's files of a batch at or past PREPARED. A PREPARED batch is
   committed from exactly those files (invariant 5);
3. it may belong to a batch in flight (PLANNED, STAGED or PREPARED): its attempt may still
   vote for it, or (a replace) still publish a rewrite it wrote while committing. Only an
   abort fences an attempt that has not voted: a lease that ran out does not stop a paused
   process from voting when it wakes, so every unvoted batch counts until it is ABORTED.
   Files are not mapped to batches by folder name; a file counts as possibly the batch's when
   it was written after the batch was planned, less IN_FLIGHT_MARGIN for the clocks of the
   planner and the storage to disagree;
4. it is younger than the grace period.

Everything else is an orphan. Folders go whole or not at all: an attempt's folder that holds
one kept file keeps its every file (Spark's `_SUCCESS` and checksums beside a voted file are
not worth a half-emptied folder that an operator, or a check of the vote, would puzzle over).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from ledger.core.batch import Batch
from ledger.core.errors import ConfigError
from ledger.core.protocol import BatchState

#: How far the clock that stamps a file's modification time (the storage's) may be behind the
#: clock that stamped a batch's planning time (the planner's) before rule 3 stops covering the
#: batch's files. Generous: NTP keeps both within seconds, and cleaning is never urgent.
IN_FLIGHT_MARGIN = timedelta(hours=1)

#: The batches whose attempts may still write, vote or publish files not yet in the log.
MAY_STILL_WRITE = frozenset({BatchState.PLANNED, BatchState.STAGED, BatchState.PREPARED})

_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_duration(text: str, what: str = "duration") -> timedelta:
    """`30m`, `6h`, `7d`, `0s`: a whole number and one unit. Anything else is a ConfigError
    naming `what`, since a misread grace period deletes files too early."""
    found = _DURATION.match(text.strip()) if isinstance(text, str) else None
    if found is None:
        raise ConfigError(
            f"{what} {text!r} is not a duration: use a whole number and one unit, "
            "s, m, h or d (e.g. 90s, 30m, 6h, 7d)"
        )
    return timedelta(**{_UNITS[found.group(2)]: int(found.group(1))})


class KeepReason(enum.StrEnum):
    """Why a staged file stays: rules 1-4 above, in the order they are checked."""

    LOGGED = "named by the Delta log"
    VOTED = "voted"
    IN_FLIGHT = "batch in flight"
    YOUNG = "younger than the grace period"
    #: not needed itself, but its folder holds a file that is
    BESIDE = "in a folder with a kept file"


@dataclass(frozen=True)
class StagedEntry:
    """One file found under an application's staged folder of one table."""

    #: which table: ledger/core/layout.py TABLE or QUARANTINE
    target: str
    #: the application id whose staged folder holds it
    app_id: str
    #: relative to the table's root, '/'-separated, as the ledger and Delta record it
    path: str
    #: the full location, for deleting it
    uri: str
    size: int
    modified: datetime
    #: the attempt folder it belongs to (the folder directly under the application's staged
    #: folder): the unit that is deleted whole or kept whole
    folder: str


@dataclass(frozen=True)
class Verdict:
    entry: StagedEntry
    #: None when the file is an orphan and may be deleted
    keep: KeepReason | None
    detail: str

    @property
    def orphan(self) -> bool:
        return self.keep is None


def classify(
    entries: Iterable[StagedEntry],
    *,
    logged: set[tuple[str, str]],
    voted: set[tuple[str, str]],
    in_flight: Iterable[Batch],
    now: datetime,
    grace: timedelta,
) -> list[Verdict]:
    """Decide every entry by rules 1-4 (module docstring), folder by folder; the first rule
    that keeps a file names the reason. `logged` and `voted` hold (target, path) pairs;
    `in_flight` the batches of the listed applications that were PLANNED, STAGED or PREPARED
    when read.

    Protects invariant 18 (and through it 3 and 5): a file that may still be committed or
    read is never an orphan.
    """
    cutoffs = _in_flight_cutoffs(in_flight)
    youngest_allowed = now - grace
    verdicts = []
    for entry in entries:
        key = (entry.target, entry.path)
        cutoff = cutoffs.get(entry.app_id)
        if key in logged:
            verdict = Verdict(entry, KeepReason.LOGGED, "a version of the table reads it")
        elif key in voted:
            verdict = Verdict(entry, KeepReason.VOTED, "a batch's vote names it")
        elif cutoff is not None and entry.modified >= cutoff[0]:
            batch = cutoff[1]
            verdict = Verdict(
                entry,
                KeepReason.IN_FLIGHT,
                f"written after batch {batch.app_id}/{batch.batch_id} ({batch.state}) was "
                "planned: its attempt may still vote or publish it",
            )
        elif entry.modified > youngest_allowed:
            verdict = Verdict(entry, KeepReason.YOUNG, f"modified {entry.modified.isoformat()}")
        else:
            verdict = Verdict(entry, None, "no vote, no table version and no batch in flight")
        verdicts.append(verdict)
    return _whole_folders(verdicts)


def _whole_folders(verdicts: list[Verdict]) -> list[Verdict]:
    """Keep every file of a folder that holds a kept file (module docstring)."""
    keeping: dict[str, Verdict] = {}
    for v in verdicts:
        if not v.orphan:
            keeping.setdefault(v.entry.folder, v)
    return [
        Verdict(
            v.entry,
            KeepReason.BESIDE,
            f"its folder holds a kept file ({keeping[v.entry.folder].keep})",
        )
        if v.orphan and v.entry.folder in keeping
        else v
        for v in verdicts
    ]


def _in_flight_cutoffs(in_flight: Iterable[Batch]) -> Mapping[str, tuple[datetime, Batch]]:
    """Per application id: files modified at or after the cutoff may be the oldest in-flight
    batch's (rule 3). Batch ids grow with time, so every later batch's files are newer."""
    cutoffs: dict[str, tuple[datetime, Batch]] = {}
    for batch in in_flight:
        if batch.state not in MAY_STILL_WRITE:
            continue
        cutoff = batch.created_at - IN_FLIGHT_MARGIN
        if batch.app_id not in cutoffs or cutoff < cutoffs[batch.app_id][0]:
            cutoffs[batch.app_id] = (cutoff, batch)
    return cutoffs
