"""Protobuf schemas for `format: protobuf` (resources/config/formats.py): a `.proto` file compiled
into a descriptor set with protoc (grpcio-tools ships it, pinned in pyproject.toml), or a
descriptor set file already compiled (`protoc --include_imports --descriptor_set_out`).

Checked when the config loads, so a file that does not compile is one line quoting
protoc's first error, never a failure inside a batch.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

from google.protobuf import descriptor_pb2
from google.protobuf.message import DecodeError

from resources.config.schema_file import versioned


def read_descriptor_set(path: str) -> bytes:
    """The serialized FileDescriptorSet of `path` (a .proto, compiled now, or a descriptor
    set); ValueError naming what is wrong."""
    return _read(*versioned(path))


@lru_cache(maxsize=64)
def _read(path: str, mtime_ns: int) -> bytes:
    """Cached by modification time: the stager reads the same file again."""
    data = _compile(path) if path.endswith(".proto") else Path(path).read_bytes()
    try:
        files = descriptor_pb2.FileDescriptorSet.FromString(data)
    except DecodeError:
        files = None
    if files is None or not files.file:
        raise ValueError(
            f"{path} is neither a .proto file nor a descriptor set "
            "(protoc --include_imports --descriptor_set_out=FILE)"
        )
    return data


def _compile(path: str) -> bytes:
    """protoc over `path`, with its folder and protobuf's well-known types on the include
    path; the descriptor set holds every file it imports."""
    import grpc_tools

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    source = Path(path)
    with tempfile.TemporaryDirectory(prefix="exactly-protoc-") as folder:
        out = Path(folder) / "set.desc"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{source.parent}",
                f"-I{well_known}",
                "--include_imports",
                f"--descriptor_set_out={out}",
                source.name,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0 or not out.exists():
            lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
            first = lines[0] if lines else f"protoc exited with {done.returncode}"
            raise ValueError(f"{path} does not compile: {first}")
        return out.read_bytes()


def message_names(descriptor_set: bytes) -> list[str]:
    """Every message type's full name (`package.Outer.Inner`) in a descriptor set."""
    names: list[str] = []

    def walk(prefix: str, messages: list[descriptor_pb2.DescriptorProto]) -> None:
        for message in messages:
            name = f"{prefix}{message.name}"
            names.append(name)
            walk(f"{name}.", list(message.nested_type))

    for file in descriptor_pb2.FileDescriptorSet.FromString(descriptor_set).file:
        walk(f"{file.package}." if file.package else "", list(file.message_type))
    return names
