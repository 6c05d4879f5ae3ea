"""Locations as URIs. Every local-path assumption of the product lives in this module.

A location is either an absolute local path (a config's relative path is made absolute
once, at load time) or an object-store URI (`s3://bucket/key`). Callers join, list, read
and translate locations only through these functions: local ones through the file system,
S3 ones through boto3 (listing, sizes, deletes) and pyarrow's S3 file system (Parquet), both
with the one `S3Access` the process's AWS variables describe (resources/object_storage/s3.py).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

import pyarrow.parquet as pq

from ledger.core.errors import ConfigError, UnreachableError
from resources.object_storage.s3 import STARTUP_ATTEMPTS, S3Access

if TYPE_CHECKING:
    import pyarrow as pa
    from pyarrow.fs import S3FileSystem

_REMOTE_SCHEMES = {"s3", "s3a", "gs", "az", "abfs", "abfss"}
_S3_SCHEMES = {"s3", "s3a"}
#: The variables S3Access reads: a change to any of them (a test pointing at another
#: server) yields a new access, clients included.
_AWS_VARIABLES = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ALLOW_HTTP",
    "AWS_PROFILE",
)


def is_remote(uri: str) -> bool:
    return urlparse(uri).scheme in _REMOTE_SCHEMES


def resolve(uri: str, base: Path) -> str:
    """A config value to a canonical location: remote URIs unchanged, paths absolute."""
    if is_remote(uri):
        return uri.rstrip("/")
    if uri.startswith("file:"):
        uri = _local_path(uri)
    return str((base / os.path.expanduser(uri)).resolve())


def _local_path(uri: str) -> str:
    """A local file's path, from a plain path or a `file:` URI in either spelling
    (`file:///x`, or `file:/x` as delta-rs and log.entry_uri write it). A URI's path is
    percent-encoded (`data%20lake`): decoded here, or a folder with a space, a `%` or an
    accent in its name would be taken for another one."""
    return unquote(urlparse(uri).path) if urlparse(uri).scheme == "file" else uri


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
    """What Spark's Hadoop file systems accept for the same location.

    A local one is `file:` and the path as it is, not a URI: Hadoop parses a location
    string as a path, so the `%C3%A9` of a percent-encoded URI would be three characters
    of a folder name, not `é`, and the stage would write beside the table, in a folder of
    that literal name (`data%20lake`), where neither the vote nor the cleaner looks. The
    scheme stays, so a cluster whose default file system is another one still writes here.
    """
    if uri.startswith("s3://"):
        return "s3a://" + uri[len("s3://") :]
    if is_remote(uri):
        return uri
    return "file:" + Path(_local_path(uri)).absolute().as_posix()


# -- object storage ----------------------------------------------------------------------------


def s3_access() -> S3Access:
    """The process's object-store access, resolved once per distinct AWS environment."""
    return _access_for(tuple((name, os.environ.get(name)) for name in _AWS_VARIABLES))


@functools.cache
def _access_for(variables: tuple[tuple[str, str | None], ...]) -> S3Access:
    return S3Access.from_env({name: value for name, value in variables if value is not None})


@functools.cache
def _client(access: S3Access) -> Any:
    return access.boto3_client()


@functools.cache
def _filesystem(access: S3Access) -> S3FileSystem:
    return access.arrow_filesystem()


def split_s3(uri: str) -> tuple[str, str]:
    """`s3://bucket/a/b` -> (`bucket`, `a/b`); other object stores are not supported."""
    parsed = urlparse(uri)
    if parsed.scheme not in _S3_SCHEMES:
        raise ConfigError(f"{uri}: only s3:// object storage is supported")
    if not parsed.netloc:
        raise ConfigError(f"{uri}: no bucket name")
    return parsed.netloc, parsed.path.lstrip("/")


def _s3_uri(bucket: str, key: str) -> str:
    return f"s3://{bucket}/{key}"


def _is_missing(exc: Exception) -> bool:
    from botocore.exceptions import ClientError

    return isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") in (
        "404",
        "NoSuchKey",
        "NotFound",
    )


def _head(uri: str) -> dict[str, Any] | None:
    """The object's HEAD response, None if there is no such object."""
    bucket, key = split_s3(uri)
    try:
        return dict(_client(s3_access()).head_object(Bucket=bucket, Key=key))
    except Exception as exc:
        if _is_missing(exc):
            return None
        raise _unreachable(uri, exc) from exc


def _unreachable(uri: str, exc: Exception) -> Exception:
    """An S3 failure as one line naming the object; our own errors pass through."""
    from botocore.exceptions import BotoCoreError, ClientError

    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return UnreachableError(f"{uri}: S3 said {error.get('Code')}: {error.get('Message')}")
    if isinstance(exc, BotoCoreError):
        return UnreachableError(f"{uri}: {exc}")
    return exc


def _s3_objects(folder: str) -> Iterator[FileInfo]:
    """Every object below `folder`/, sorted by key (S3 lists in key order)."""
    bucket, prefix = split_s3(folder)
    prefix = prefix.rstrip("/") + "/" if prefix else ""
    pages = _client(s3_access()).get_paginator("list_objects_v2")
    try:
        for page in pages.paginate(Bucket=bucket, Prefix=prefix):
            for entry in page.get("Contents", ()):
                modified_ms = int(entry["LastModified"].timestamp() * 1000)
                yield FileInfo(_s3_uri(bucket, entry["Key"]), int(entry["Size"]), modified_ms)
    except Exception as exc:
        raise _unreachable(folder, exc) from exc


def check_buckets(uris: Sequence[str]) -> None:
    """Before anything runs: every bucket `uris` name exists and our credentials may use
    it, else one line naming the bucket and the problem (a missing bucket, access denied,
    an endpoint that does not answer). Local locations need no check."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    buckets = sorted({split_s3(uri)[0] for uri in uris if is_remote(uri)})
    if not buckets:
        return  # resolving AWS credentials (a profile, an instance role) costs a local run
    access = s3_access()
    where = access.endpoint_url or f"AWS S3 ({access.region})"
    who = access.access_key_id or f"of profile {access.profile}"
    client = access.boto3_client(max_attempts=STARTUP_ATTEMPTS)
    for bucket in buckets:
        try:
            client.head_bucket(Bucket=bucket)
        except NoCredentialsError as exc:
            raise ConfigError(
                f"bucket {bucket}: no AWS credentials (set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)"
            ) from exc
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code"))
            if code in ("404", "NoSuchBucket", "NotFound"):
                raise ConfigError(f"bucket {bucket} does not exist at {where}") from exc
            if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                raise ConfigError(
                    f"bucket {bucket}: access denied at {where} for key {who} "
                    "(wrong credentials, or no permission on the bucket)"
                ) from exc
            raise UnreachableError(f"bucket {bucket}: {where} answered {code}") from exc
        except BotoCoreError as exc:
            raise UnreachableError(f"bucket {bucket}: {where} does not answer: {exc}") from exc


def _arrow_path(uri: str) -> tuple[str, S3FileSystem | None]:
    """What pyarrow opens for `uri`: `bucket/key` on the S3 file system, or the local path."""
    if not is_remote(uri):
        return uri, None
    bucket, key = split_s3(uri)
    return f"{bucket}/{key}", _filesystem(s3_access())


def read_parquet_metadata(uri: str) -> pq.FileMetaData:
    """One Parquet file's footer, reading only its tail."""
    path, filesystem = _arrow_path(uri)
    if filesystem is None:
        return pq.read_metadata(path)
    try:
        with filesystem.open_input_file(path) as source:
            return pq.read_metadata(source)
    except FileNotFoundError:
        raise
    except OSError as exc:  # pyarrow's S3 errors, after its own retries
        raise UnreachableError(f"{uri}: the object store failed: {exc}") from exc


def read_parquet(uri: str, columns: Sequence[str] | None = None) -> pa.Table:
    path, filesystem = _arrow_path(uri)
    return pq.read_table(
        path, columns=list(columns) if columns is not None else None, filesystem=filesystem
    )


def write_parquet(table: pa.Table, uri: str) -> None:
    """Write `table` as one Parquet file at `uri` (local folders are created first)."""
    path, filesystem = _arrow_path(uri)
    if filesystem is None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, filesystem=filesystem)


# -- files ---------------------------------------------------------------------------------------


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
        return [
            info
            for info in _s3_objects(folder)
            if info.uri.endswith(suffix)
            and not any(
                part.startswith(("_", ".")) for part in relative(info.uri, folder).split("/")
            )
        ]
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
        head = _head(uri)
        if head is None:
            raise FileNotFoundError(uri)
        modified_ms = int(head["LastModified"].timestamp() * 1000)
        return FileInfo(uri, int(head["ContentLength"]), modified_ms)
    stat = Path(uri).stat()
    return FileInfo(uri, stat.st_size, int(stat.st_mtime * 1000))


def file_size(uri: str) -> int | None:
    """The size of the file at `uri` now, or None when there is none: how the commit checks
    that a voted file is still there as voted (invariant 11)."""
    if is_remote(uri):
        head = _head(uri)
        return None if head is None else int(head["ContentLength"])
    try:
        return Path(uri).stat().st_size
    except FileNotFoundError:
        return None


def fingerprint(uri: str) -> tuple[Any, ...] | None:
    """What tells this very file from any other that is ever written at `uri`, or None when
    there is no file there now.

    For a table kept open between batches (resources/delta/table.py): the log entry of the
    version it read must still be the same file, or the table was deleted and created
    again underneath it. Names alone cannot tell: a new table reuses `_delta_log/N.json`.
    - On S3, HEAD's ContentLength, ETag (the MD5 of the content for a plain PUT, which is
      how delta-rs writes log entries) and LastModified: a new object at the same key has
      another ETag as soon as one byte differs, and another LastModified unless it came
      within the same second.
    - Locally, size, st_mtime_ns and st_ino are not enough on their own: ext4 hands the
      inode of a deleted file to the next file created (measured here: every time), and a
      kernel with coarse timestamps stamps files written within one tick (4 ms at
      HZ=250) alike, so a table re-created that fast could look the same. A digest of the
      content (a log entry is a few KiB: microseconds) closes that: a new table's version
      0 carries a new random table id, and any later entry a new commit timestamp.
    Raises UnreachableError when the store does not answer (S3).
    """
    if is_remote(uri):
        head = _head(uri)
        if head is None:
            return None
        return (int(head["ContentLength"]), head.get("ETag"), head.get("LastModified"))
    path = _local_path(uri)
    try:
        with open(path, "rb") as entry:
            stat = os.fstat(entry.fileno())
            digest = hashlib.blake2b(entry.read(), digest_size=16).digest()
    except FileNotFoundError:
        return None
    return (stat.st_size, stat.st_mtime_ns, stat.st_ino, digest)


def read_bytes(uri: str) -> bytes | None:
    """The whole file at `uri` (a Delta log entry: a few KiB), or None when there is none.
    Through boto3 rather than delta-rs, whose log reads hold the GIL while they wait for the
    store: a slow store would stall the process's other threads (its heartbeat among them).
    Raises UnreachableError when the store does not answer (S3)."""
    if is_remote(uri):
        bucket, key = split_s3(uri)
        try:
            return bytes(_client(s3_access()).get_object(Bucket=bucket, Key=key)["Body"].read())
        except Exception as exc:
            if _is_missing(exc):
                return None
            raise _unreachable(uri, exc) from exc
    path = _local_path(uri)
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        return None


def exists(uri: str) -> bool:
    """Whether a file (or, locally, a folder) is at `uri`."""
    if is_remote(uri):
        return _head(uri) is not None
    return Path(_local_path(uri)).exists()


def list_files(folder: str) -> list[FileInfo]:
    """Every file below `folder`, at any depth, hidden ones and Spark's markers included,
    sorted by location; [] when the folder does not exist. Symbolic links to folders are
    not followed, so nothing outside `folder` is ever listed.

    For the cleaner (jobs/maintenance/cleaner.py), which must see everything an attempt left behind;
    what to commit is never decided by listing (invariant 4).
    """
    if is_remote(folder):
        return list(_s3_objects(folder))
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
    """Delete one file; False if it was already gone (another cleaner, or a VACUUM).

    S3's DELETE succeeds whether or not the object exists, so a HEAD first tells which; an
    object deleted by someone else between the two is reported deleted, which is harmless.
    """
    if is_remote(uri):
        if _head(uri) is None:
            return False
        bucket, key = split_s3(uri)
        try:
            _client(s3_access()).delete_object(Bucket=bucket, Key=key)
        except Exception as exc:
            raise _unreachable(uri, exc) from exc
        return True
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
