"""Whether two configured locations are one, or one inside the other: the config refuses
such tables (resources/config/loading.py), since a VACUUM of one deletes every file under it
that its own log does not name.

A location is compared as delta-rs and Spark would open it, not as written: `s3://` and
`s3a://` name the same bucket to both (Spark is given `s3a://`, delta-rs takes either), and
a URI's scheme is the same in any case (`S3://`).
"""

from __future__ import annotations

from urllib.parse import urlparse

from resources.object_storage.storage import is_remote


def _canonical(uri: str) -> str:
    """`uri` (made canonical by `storage.resolve`) with one spelling of its scheme and a
    trailing '/', for comparing only: never a location to open."""
    if is_remote(uri):
        scheme = urlparse(uri).scheme  # lower case, however it was written
        uri = ("s3" if scheme in ("s3", "s3a") else scheme) + ":" + uri.split(":", 1)[1]
    return uri.rstrip("/") + "/"


def overlaps(a: str, b: str) -> bool:
    """Whether one location is the other or lies inside it."""
    a, b = _canonical(a), _canonical(b)
    return a.startswith(b) or b.startswith(a)
