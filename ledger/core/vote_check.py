"""Invariant 11, the check before publishing: does every file the vote names still exist,
with the size it had when it was voted?

The vote is the exact list of files (invariant 3), so what a commit publishes must be on
storage as it was voted. A file removed since (a storage lifecycle rule, a VACUUM, an
operator) or changed in size would be added to a table that can then no longer be read.
Outputs that already hold the batch (their application-transaction version is at or past
the batch id: a commit published them before a crash) are not checked: their files are
the table's now, and a cleanup may have moved on.

Pure: the two questions that need I/O come in as callables.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from ledger.core.batch import StagedFile


@dataclass(frozen=True)
class VoteCheck:
    """What the check found, as the counts the ledger keeps per batch.

    Only files that hold records count: an empty file is never published, so whether it is
    still there does not matter.
    """

    #: voted files with records, in every output
    staged: tuple[StagedFile, ...]
    #: of those, the ones in outputs that already hold the batch
    already_committed: tuple[StagedFile, ...]
    #: of the rest, the ones absent or of another size than voted
    missing: tuple[StagedFile, ...]

    @property
    def to_publish(self) -> tuple[StagedFile, ...]:
        """The voted files a commit still adds (outputs that do not hold the batch yet)."""
        held = set(self.already_committed)
        return tuple(f for f in self.staged if f not in held)


def check_vote(
    files: Sequence[StagedFile],
    holding: Collection[str],
    size_of: Callable[[str, str], int | None],
) -> VoteCheck:
    """Check the voted `files` against storage before publishing (invariant 11).

    `holding` are the outputs that already hold the batch; `size_of(target, path)` is the
    size of a staged file on storage now, None when it is absent.
    """
    staged = tuple(f for f in files if f.records > 0)
    already = tuple(f for f in staged if f.target in holding)
    missing = tuple(
        f for f in staged if f.target not in holding and size_of(f.target, f.path) != f.size
    )
    return VoteCheck(staged, already, missing)


def describe(files: Sequence[StagedFile], limit: int = 10) -> list[str]:
    """`target/path` of each file, at most `limit` of them: what an alert or error names."""
    return [f"{f.target}/{f.path}" for f in files[:limit]]
