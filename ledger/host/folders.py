"""What this host's file system says about a local folder that could not be written: the
one probe behind every storage cause the command line names (resources/failures/causes.py
for the tables' folders, ledger/store/write_failures.py for a SQLite ledger's).

Why a probe: the errors do not say it. Hadoop's `Mkdirs failed` covers a read-only file
system, a folder this user cannot write and a full one alike, and SQLite's "unable to open
database file" a missing folder too. `os.access` asks the kernel as this user would write,
so a read-only mount is seen even by root, whom permission bits do not stop.
"""

from __future__ import annotations

import os
from pathlib import Path

NO_SPACE = "no space left on device"
READ_ONLY = "read-only file system"
NOT_WRITABLE = "permission denied"


def folder_problem(folder: Path) -> str | None:
    """Why `folder` (which exists) cannot be written: read-only, not writable by this user,
    or full (no block or no inode left); None if none of these holds or it cannot be read."""
    try:
        stats = os.statvfs(folder)
    except OSError:
        return None
    if stats.f_flag & os.ST_RDONLY:
        return READ_ONLY
    if not os.access(folder, os.W_OK):
        return NOT_WRITABLE
    if stats.f_bavail == 0 or stats.f_favail == 0:
        return NO_SPACE
    return None
