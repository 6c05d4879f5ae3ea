"""Delete the staged files nobody needs: `exactly clean` and the `<pipeline>_clean` job.

Attempts that were fenced or abandoned leave their folders under
`<table>/staged/<app_id>/` (invariant 3), and nothing else removes them safely: a Delta
VACUUM with a short retention would also take the files of a PREPARED batch (README,
"Cleaning and VACUUM"). The rule for what may go is `ledger/core/cleaning.py` (invariant 18);
this module gathers its inputs and deletes, through resources/object_storage/storage.py only.

Only the staged folders of the pipeline's own two application ids (live and backfill), in
both tables, are ever listed; every other path under a table is Delta's or someone else's.

The order of the reads is what makes a concurrent pipeline safe:

1. refuse unless the ledger knows the last batch each table holds (a lost ledger, or a
   ledger.url that is not this pipeline's, knows no vote and must not be read as "nothing
   is needed");
2. list the staged folders;
3. read the ledger: the batches that may still write, then every voted path;
4. read both Delta logs.

A listed file existed at step 2. If a vote names it, the vote happened before step 3 (it is
in the paths read) or will come from an attempt in flight at step 3 (rule 3 keeps its
files); staging only ever writes new files, into a new folder. A file the log names was
voted (step 3 has it) or is a replace's rewrite, written while its batch was PREPARED: in
flight at step 3, or committed before and so in the log read at step 4. Each folder is
still checked against the ledger once more right before it is deleted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import groupby
from typing import Any

from jobs.publish.delta_publisher import DeltaPublisher
from ledger.core.backfill import backfill_app_id
from ledger.core.batch import Batch, utcnow
from ledger.core.cleaning import MAY_STILL_WRITE, StagedEntry, Verdict, classify
from ledger.core.errors import ExactlyError, InconsistencyError
from ledger.core.layout import QUARANTINE, TABLE, attempt_folder_of, staged_path
from ledger.core.protocol import MUST_FINISH, BatchState
from ledger.store.ledger_store import LedgerStore
from resources.config.pipeline_config import PipelineConfig
from resources.delta.table import DeltaTarget
from resources.object_storage import storage

#: A batch a table holds is one of these in a ledger that knows the table.
_PUBLISHED_OR_PUBLISHING = MUST_FINISH | {BatchState.ACKED}


def _quiet(_line: str) -> None:
    pass


def staged_root(table_root: str, app_id: str) -> str:
    """Where every attempt of `app_id` writes its folder in the table at `table_root`."""
    return storage.join(table_root, staged_path(app_id))


@dataclass
class CleanReport:
    """What one clean did (or, with `dry_run`, would do), file by file."""

    dry_run: bool
    grace: timedelta
    verdicts: list[Verdict] = field(default_factory=list)
    #: one per folder deleted (or that would be), then the summary
    lines: list[str] = field(default_factory=list)

    @property
    def deleted(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.orphan]

    @property
    def kept(self) -> list[Verdict]:
        return [v for v in self.verdicts if not v.orphan]

    @property
    def files_deleted(self) -> int:
        return len(self.deleted)

    @property
    def bytes_deleted(self) -> int:
        return sum(v.entry.size for v in self.deleted)

    @property
    def files_kept(self) -> int:
        return len(self.kept)

    @property
    def bytes_kept(self) -> int:
        return sum(v.entry.size for v in self.kept)

    @property
    def folders_deleted(self) -> int:
        return len({v.entry.folder for v in self.deleted})

    def kept_by_reason(self) -> dict[str, int]:
        return dict(sorted(Counter(str(v.keep) for v in self.kept).items()))

    def summary(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        reasons = ", ".join(f"{n} {reason}" for reason, n in self.kept_by_reason().items())
        return (
            f"{verb} {self.files_deleted} files ({self.bytes_deleted} bytes) in "
            f"{self.folders_deleted} folders; kept {self.files_kept} files "
            f"({self.bytes_kept} bytes){': ' + reasons if reasons else ''}; "
            f"grace {_duration(self.grace)}"
        )

    def metadata(self) -> dict[str, Any]:
        """What the Dagster run shows."""
        return {
            "dry_run": self.dry_run,
            "older_than": _duration(self.grace),
            "files_deleted": self.files_deleted,
            "bytes_deleted": self.bytes_deleted,
            "folders_deleted": self.folders_deleted,
            "files_kept": self.files_kept,
            "bytes_kept": self.bytes_kept,
            "kept_by_reason": self.kept_by_reason(),
        }


def clean(
    config: PipelineConfig,
    *,
    older_than: timedelta,
    dry_run: bool = False,
    store: LedgerStore | None = None,
    publisher: DeltaPublisher | None = None,
    log: Callable[[str], None] = _quiet,
) -> CleanReport:
    """Delete the orphans among the pipeline's staged files older than `older_than`; with
    `dry_run` only say what would go. Opens the ledger and the tables from `config` unless
    given (the Dagster job passes its process's). `log` gets one line per folder, then the
    summary."""
    own_store = store is None
    store = store if store is not None else LedgerStore(config.ledger.url)
    publisher = publisher or DeltaPublisher.for_config(config)
    try:
        return _Cleaner(config, store, publisher, log).run(older_than, dry_run)
    finally:
        if own_store:
            store.dispose()


class _Cleaner:
    def __init__(
        self,
        config: PipelineConfig,
        store: LedgerStore,
        publisher: DeltaPublisher,
        log: Callable[[str], None],
    ) -> None:
        self.config = config
        self.store = store
        self.targets: Mapping[str, DeltaTarget] = {
            TABLE: publisher.table,
            QUARANTINE: publisher.quarantine,
        }
        self.apps = (config.app_id, backfill_app_id(config.pipeline))
        self.log = log

    def run(self, grace: timedelta, dry_run: bool) -> CleanReport:
        now = utcnow()
        report = CleanReport(dry_run=dry_run, grace=grace)
        self._check_ledger_knows_tables()
        entries = self._list()
        self._check_ledger_wrote(entries)
        in_flight = self._in_flight()
        voted = self.store.voted_paths(self.apps)
        logged = {(t, p) for t, delta in self.targets.items() for p in delta.named_files()}
        verdicts = classify(
            entries, logged=logged, voted=voted, in_flight=in_flight, now=now, grace=grace
        )
        for folder, group in groupby(verdicts, key=lambda v: v.entry.folder):
            found = list(group)
            if all(v.orphan for v in found) and not dry_run:
                found = self._recheck(found, logged, voted, in_flight, now, grace)
            if all(v.orphan for v in found):
                self._delete(folder, found, dry_run, report)
            report.verdicts.extend(found)
        report.lines.append(report.summary())
        self.log(report.lines[-1])
        return report

    # -- the checks that refuse ---------------------------------------------------------

    def _check_ledger_knows_tables(self) -> None:
        """Every table's last batch of each application id must be in the ledger, voted.

        Otherwise the ledger was lost (and not yet rebuilt), restored from an older backup,
        or is not this pipeline's (a relative sqlite path resolved from another directory):
        its votes are not the votes, and a PREPARED batch's files would look like orphans
        (invariant 18).
        """
        for delta in self.targets.values():
            for app_id in self.apps:
                version = delta.transaction_version(app_id)
                if version is None:
                    continue
                batch = self.store.get(app_id, version)
                if batch is not None and batch.state in _PUBLISHED_OR_PUBLISHING:
                    continue
                found = "has no record of it" if batch is None else f"has it {batch.state}"
                raise InconsistencyError(
                    f"{delta.uri} holds batch {app_id}/{version} but the ledger at "
                    f"{self.store.safe_url} {found}: the ledger was lost or is not this "
                    "pipeline's (check ledger.url), so its votes cannot say which staged "
                    "files are needed; rebuild it from the Delta log first (`exactly recover "
                    "-c FILE`; backfill batches: the backfill job with no ranges); nothing "
                    "was deleted"
                )

    def _check_ledger_wrote(self, entries: Iterable[StagedEntry]) -> None:
        """Staged files of an application id the ledger has no batch of were written by a
        pipeline with another ledger: before any commit no table can tell, so refuse rather
        than take an empty ledger's silence for "nothing was voted" (invariant 18)."""
        for app_id in sorted({e.app_id for e in entries}):
            if not self.store.batches(app_id=app_id, limit=1):
                raise InconsistencyError(
                    f"staged files of {app_id} exist but the ledger at {self.store.safe_url} "
                    f"holds no batch of {app_id}: it is not the ledger of the pipeline that "
                    "wrote them (check ledger.url) or it was lost; nothing was deleted"
                )

    # -- reads ----------------------------------------------------------------------------

    def _list(self) -> list[StagedEntry]:
        """Every file under the application ids' staged folders of both tables, with the
        attempt folder each belongs to, in folder order."""
        entries = []
        for target, delta in self.targets.items():
            for app_id in self.apps:
                base = staged_root(delta.uri, app_id)
                for info in storage.list_files(base):
                    path = storage.relative(info.uri, delta.uri)
                    folder = attempt_folder_of(path, app_id)
                    if folder is None:
                        continue  # the staged folder itself, never a file of an attempt
                    entries.append(
                        StagedEntry(
                            target=target,
                            app_id=app_id,
                            path=path,
                            uri=info.uri,
                            size=info.size,
                            modified=datetime.fromtimestamp(info.modification_time_ms / 1000, UTC),
                            folder=storage.join(delta.uri, folder),
                        )
                    )
        return sorted(entries, key=lambda e: (e.folder, e.uri))

    def _in_flight(self) -> list[Batch]:
        return [
            batch
            for app_id in self.apps
            for batch in self.store.batches(app_id=app_id, states=MAY_STILL_WRITE)
        ]

    def _recheck(
        self,
        found: list[Verdict],
        logged: set[tuple[str, str]],
        voted: set[tuple[str, str]],
        in_flight: list[Batch],
        now: datetime,
        grace: timedelta,
    ) -> list[Verdict]:
        """Decide one folder again on the ledger as it is now, right before deleting it."""
        entries = [v.entry for v in found]
        voted_now = self.store.voted_paths(self.apps, among=[e.path for e in entries])
        again = classify(
            entries,
            logged=logged,
            voted=voted | voted_now,
            in_flight=[*in_flight, *self._in_flight()],
            now=now,
            grace=grace,
        )
        if not all(v.orphan for v in again):
            kept = next(v for v in again if not v.orphan)
            self.log(f"kept {found[0].entry.folder}: {kept.keep} since the clean began")
        return again

    # -- the only write ---------------------------------------------------------------------

    def _delete(
        self, folder: str, found: list[Verdict], dry_run: bool, report: CleanReport
    ) -> None:
        size = sum(v.entry.size for v in found)
        verb = "would delete" if dry_run else "deleted"
        if not dry_run:
            for v in found:
                try:
                    storage.delete_file(v.entry.uri)
                except OSError as exc:
                    raise ExactlyError(
                        f"cannot delete {v.entry.uri}: {exc.strerror or exc}; the clean "
                        "stopped there (the folders reported before it are deleted); run it "
                        "again once that is fixed"
                    ) from exc
            app_root = staged_root(self.targets[found[0].entry.target].uri, found[0].entry.app_id)
            storage.remove_empty_folders(folder, app_root)
        report.lines.append(f"{verb} {folder} ({len(found)} files, {size} bytes)")
        self.log(report.lines[-1])


def _duration(value: timedelta) -> str:
    seconds = int(value.total_seconds())
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % span == 0:
            return f"{seconds // span}{unit}"
    return f"{seconds}s"
