"""A schema file named in a config, as the readers cache it: its resolved path and the time
it last changed, so a file edited between two batches is read again and one left alone is
not (resources/config/formats.py for Avro, resources/config/proto_schema.py for Protobuf)."""

from __future__ import annotations

from pathlib import Path


def versioned(path: str) -> tuple[str, int]:
    """`path` resolved, and its modification time in ns; ValueError naming what is wrong."""
    file = Path(path)
    try:
        mtime = file.stat().st_mtime_ns
    except FileNotFoundError:
        raise ValueError(f"no such file: {path}") from None
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    return str(file.resolve()), mtime
