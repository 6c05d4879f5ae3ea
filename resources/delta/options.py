"""How delta-rs reaches a table's store: the storage options every table is opened with,
refusing any setting that would make a commit on S3 something other than one conditional
write, and a store failure told as one line.

Their own module because every delta-rs call of the Delta edge goes through these options
and these errors alike: the table's loads, the commit loop and the MERGE.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from ledger.core.errors import ConfigError, UnreachableError
from resources.object_storage import storage

# -- commits on S3 ----------------------------------------------------------------------------

#: How delta-rs 1.6 makes a commit on S3 atomic: it writes the log entry `N.json` with
#: `If-None-Match: *`, so of two writers of version N exactly one succeeds and the other
#: fails with CommitFailedError (then the commit loop, resources/delta/commit.py, re-reads
#: and decides again). Set explicitly, so a delta-rs default that changes can never
#: silently make commits unconditional.
CONDITIONAL_PUT = ("aws_conditional_put", "etag")
#: delta-rs settings that make a commit something other than one conditional write: an
#: unconditional rename (two writers both "win" a version and one batch is lost), a lock
#: service we neither run nor test, or copy-if-not-exists in place of conditional put.
_UNSAFE_S3_SETTINGS = {
    "aws_s3_allow_unsafe_rename": "makes two writers of one log entry both succeed",
    "aws_s3_locking_provider": "exactly commits by conditional put and runs no lock service",
    "aws_copy_if_not_exists": "exactly commits by conditional put, not copy-if-not-exists",
    "copy_if_not_exists": "exactly commits by conditional put, not copy-if-not-exists",
}
_CONDITIONAL_PUT_NAMES = {"aws_conditional_put", "conditional_put"}
_FALSE = {"", "0", "false", "no", "off"}


def _unsafe(name: str, value: str, where: str) -> str | None:
    """Why setting `name` to `value` would make commits unsafe, or None."""
    key = name.lower()
    if key == "aws_s3_allow_unsafe_rename" and value.strip().lower() in _FALSE:
        return None
    if key in _UNSAFE_S3_SETTINGS and value.strip():
        return f"{where}{name}={value} is refused: it {_UNSAFE_S3_SETTINGS[key]}"
    if key in _CONDITIONAL_PUT_NAMES and value.strip().lower() != CONDITIONAL_PUT[1]:
        return (
            f"{where}{name}={value} is refused: commits on S3 need conditional put "
            f"({CONDITIONAL_PUT[1]}, If-None-Match), the only way exactly commits there"
        )
    return None


def storage_options_for(
    uri: str, configured: Mapping[str, str], env: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """delta-rs's options for the table at `uri`: for S3, the process's access (endpoint,
    region, keys: the same as boto3's and pyarrow's) under the config's own options, and
    conditional-put commits; elsewhere the config's options as they are.

    Raises ConfigError, one line, for any setting (in the config or the environment, which
    delta-rs also reads) that would let two writers both commit one table version.
    """
    if not storage.is_remote(uri):
        return dict(configured)
    storage.split_s3(uri)
    problems = [
        p
        for name, value in env.items()
        if name.startswith("AWS_") and (p := _unsafe(name, value, "environment variable "))
    ]
    problems += [
        p
        for name, value in configured.items()
        if (p := _unsafe(name, value, "delta.storage_options."))
    ]
    if problems:
        raise ConfigError(f"{uri}: {problems[0]}")
    name, value = CONDITIONAL_PUT
    return {**storage.s3_access().delta_storage_options(), **configured, name: value}


def store_failure(uri: str, exc: Exception) -> UnreachableError:
    """A delta-rs error from the object store as one line naming the table: delta-rs writes
    its cause chain over several lines, coloured for a terminal.

    A local table's full or read-only disk says so (resources/failures/causes.py) rather than
    "the object store failed": the operator must free space, not wait for a server.
    """
    from resources.failures.causes import STORAGE_CAUSES, KnownCause, classify

    known = classify(exc)
    if known is not None and known.cause in STORAGE_CAUSES:
        # delta-rs names the file only for some errors; the table is always the news
        where = known.where if known.where.startswith("/") else uri
        return UnreachableError(KnownCause(known.cause, where).line())
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    parts = [line.strip().lstrip("↳").strip() for line in text.splitlines()]
    return UnreachableError(f"{uri}: the object store failed: {' '.join(p for p in parts if p)}")
