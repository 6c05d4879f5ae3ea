"""Locations as URIs. Every local-path assumption of the product lives in this module.

A location is either an absolute local path (a config's relative path is made absolute
once, at load time) or an object-store URI (`s3://bucket/key`). Callers join, list and
translate locations only through these functions.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

_REMOTE_SCHEMES = {"s3", "s3a", "gs", "az", "abfs", "abfss"}


def is_remote(uri: str) -> bool:
    return urlparse(uri).scheme in _REMOTE_SCHEMES


def resolve(uri: str, base: Path) -> str:
    """A config value to a canonical location: remote URIs unchanged, paths absolute."""
    if is_remote(uri):
        return uri.rstrip("/")
    if uri.startswith("file://"):
        uri = urlparse(uri).path
    return str((base / os.path.expanduser(uri)).resolve())


def overlaps(a: str, b: str) -> bool:
    """Whether one location is the other or lies inside it."""
    a, b = a.rstrip("/") + "/", b.rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)


def join(uri: str, *parts: str) -> str:
    if is_remote(uri):
        return "/".join([uri.rstrip("/"), *(p.strip("/") for p in parts)])
    return str(Path(uri, *parts))


def relative(uri: str, root: str) -> str:
    """The path of `uri` below `root`, '/'-separated, as Delta add actions want it."""
    if is_remote(uri):
        prefix = root.rstrip("/") + "/"
        if not uri.startswith(prefix):
            raise ValueError(f"{uri} is not inside {root}")
        return uri[len(prefix) :]
    return Path(uri).relative_to(root).as_posix()


def spark_uri(uri: str) -> str:
    """What Spark's Hadoop file systems accept for the same location."""
    if uri.startswith("s3://"):
        return "s3a://" + uri[len("s3://") :]
    if is_remote(uri):
        return uri
    return Path(uri).as_uri()


@dataclass(frozen=True)
class FileInfo:
    uri: str
    size: int
    modification_time_ms: int


def list_data_files(folder: str, suffix: str = ".parquet") -> list[FileInfo]:
    """Data files directly written into one attempt's own staging folder.

    Only ever called on a folder unique to one (batch, attempt): the table's folder is
    never listed to decide what to commit (invariant 4). Spark's markers (`_SUCCESS`,
    hidden `.crc` files) are not data.
    """
    if is_remote(folder):
        raise NotImplementedError("object storage listing arrives with the object-store issue")
    root = Path(folder)
    if not root.is_dir():
        return []
    found = []
    for path in sorted(root.rglob(f"*{suffix}")):
        if any(part.startswith(("_", ".")) for part in path.relative_to(root).parts):
            continue
        stat = path.stat()
        found.append(FileInfo(str(path), stat.st_size, int(stat.st_mtime * 1000)))
    return found


def file_info(uri: str) -> FileInfo:
    if is_remote(uri):
        raise NotImplementedError("object storage arrives with the object-store issue")
    stat = Path(uri).stat()
    return FileInfo(uri, stat.st_size, int(stat.st_mtime * 1000))


def file_size(uri: str) -> int | None:
    """The size of the file at `uri` now, or None when there is none: how the commit checks
    that a voted file is still there as voted (invariant 11)."""
    if is_remote(uri):
        raise NotImplementedError("object storage arrives with the object-store issue")
    try:
        return Path(uri).stat().st_size
    except FileNotFoundError:
        return None


def ensure_parent(uri: str) -> None:
    """Local folders must exist before a file is written into them; object stores have none."""
    if not is_remote(uri):
        Path(uri).parent.mkdir(parents=True, exist_ok=True)


def exists(uri: str) -> bool:
    if is_remote(uri):
        raise NotImplementedError("object storage arrives with the object-store issue")
    return Path(uri).exists()


def list_files(folder: str) -> list[FileInfo]:
    """Every file below `folder`, at any depth, hidden ones and Spark's markers included,
    sorted by location; [] when the folder does not exist. Symbolic links to folders are
    not followed, so nothing outside `folder` is ever listed.

    For the cleaner (jobs/cleaner.py), which must see everything an attempt left behind;
    what to commit is never decided by listing (invariant 4).
    """
    if is_remote(folder):
        raise NotImplementedError("object storage listing arrives with the object-store issue")
    found = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath, name)
            try:
                stat = path.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # deleted between listing and looking: nothing to clean
            found.append(FileInfo(str(path), stat.st_size, int(stat.st_mtime * 1000)))
    return sorted(found, key=lambda f: f.uri)


def delete_file(uri: str) -> bool:
    """Delete one file; False if it was already gone (another cleaner, or a VACUUM)."""
    if is_remote(uri):
        raise NotImplementedError("object storage arrives with the object-store issue")
    try:
        Path(uri).unlink()
    except FileNotFoundError:
        return False
    return True


def remove_empty_folders(folder: str, stop_at: str) -> None:
    """Remove every empty folder inside `folder` (deepest first), then `folder` and each of
    its parents up to, not including, `stop_at`, while they are empty.

    Object stores have no folders: nothing to do there. A folder that a writer fills again
    meanwhile stays (rmdir refuses a folder that is not empty).
    """
    if is_remote(folder):
        return
    for dirpath, _dirs, _files in os.walk(folder, topdown=False, followlinks=False):
        if dirpath != folder:
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)
    current, stop = Path(folder), Path(stop_at)
    while current != stop and stop in current.parents:
        try:
            current.rmdir()
        except OSError:
            return
        current = current.parent
