"""Loading a pipeline config: reading the YAML file, validating it, and making its locations
absolute.

Validation errors become one `ConfigError` line naming every bad field (`kafka.topic: ...`),
because a typo that silently falls back to a default is how records get lost; two tables
whose locations overlap are refused, since the vacuum of one would delete the other's files,
and so is a SQLite ledger inside a table, which a vacuum would delete with its votes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ledger.core.errors import ConfigError
from resources.config.derived_spec import PostgresOutput
from resources.config.pipeline_config import PipelineConfig
from resources.config.transforms import absolute_spec
from resources.object_storage import storage
from resources.object_storage.locations import overlaps


def _describe(error: ValidationError, source: str) -> str:
    problems = []
    for item in error.errors():
        loc = list(item["loc"])
        if loc[:1] == ["derived"]:
            # the discriminator's tag ("aggregate"/"upsert") is noise in a location
            loc = [p for p in loc if p not in ("aggregate", "upsert")]
        where = ".".join(str(p) for p in loc) or "(top level)"
        kind = item["type"]
        if kind == "extra_forbidden":
            problems.append(f"{where}: unknown key")
        elif kind == "missing":
            problems.append(f"{where}: required key is missing")
        else:
            problems.append(f"{where}: {item['msg']}")
    return f"invalid pipeline config {source}: " + "; ".join(problems)


#: A `%` and two hex digits in a location: a percent-encoded character to delta-rs, which
#: decodes a table's path once more than it was encoded, and three characters to Spark's
#: Hadoop paths (resources/object_storage/storage.py `spark_uri`).
_PERCENT_ENCODED = re.compile(r"%[0-9A-Fa-f]{2}")


def parse_config(
    data: Any,
    source: str = "<config>",
    base_dir: Path | None = None,
    code_dir: Path | None = None,
) -> PipelineConfig:
    """Validate a loaded YAML document; local paths become absolute against `base_dir`, and
    the transform's file and `python_path` against `code_dir` (the config file's folder,
    where its user keeps the code beside it), both by default the current directory."""
    if not isinstance(data, dict):
        raise ConfigError(f"invalid pipeline config {source}: expected a mapping at the top")
    try:
        config = PipelineConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source)) from None
    base = base_dir or Path.cwd()
    delta = config.delta.model_copy(
        update={
            "table_uri": storage.resolve(config.delta.table_uri, base),
            "quarantine_uri": storage.resolve(config.delta.quarantine_uri, base),
        }
    )
    derived = [
        d
        if isinstance(d, PostgresOutput)  # a database table: no location on storage
        else d.model_copy(update={"table_uri": storage.resolve(d.table_uri, base)})
        for d in config.derived
    ]
    locations = {
        "delta.table_uri": delta.table_uri,
        "delta.quarantine_uri": delta.quarantine_uri,
        **{
            f"derived.{d.name}.table_uri": d.table_uri
            for d in derived
            if not isinstance(d, PostgresOutput)
        },
    }
    for name, location in locations.items():
        if (encoded := _PERCENT_ENCODED.search(location)) is not None:
            raise ConfigError(
                f"invalid pipeline config {source}: {name} {location!r} holds "
                f"{encoded.group()!r}, which delta-rs reads as the character it encodes and "
                "Spark as those three characters, so the two would use different folders; "
                "rename it without a '%' before two hex digits (spaces, other '%' and "
                "letters of any alphabet are fine)"
            )
    names = list(locations)
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            if overlaps(locations[first], locations[second]):
                raise ConfigError(
                    f"invalid pipeline config {source}: {second} and {first} must be separate "
                    "locations, neither inside the other (vacuum of one would delete the "
                    "other's files)"
                )
    ledger = config.ledger.model_copy(update={"url": _resolve_sqlite(config.ledger.url, base)})
    ledger_file = _sqlite_file(ledger.url)
    for name, location in locations.items() if ledger_file else ():
        if overlaps(ledger_file, location):
            raise ConfigError(
                f"invalid pipeline config {source}: ledger.url's file {ledger_file} is inside "
                f"{name} {location}: a VACUUM of that table (delta-spark's, any Delta tool's) "
                "deletes every file its log does not name, the ledger and its votes with them; "
                "keep the ledger outside every table"
            )
    code = _code_location(config, code_dir or base, source)
    fmt = config.format.resolved(base) if config.format else None
    return config.model_copy(
        update={"delta": delta, "ledger": ledger, "derived": derived, "format": fmt, **code}
    )


def _code_location(config: PipelineConfig, code_dir: Path, source: str) -> dict[str, Any]:
    """The transform's file and `python_path` as absolute paths (resources/config/transforms.py)."""
    folders = []
    for entry in config.python_path:
        folder = (code_dir / entry).resolve()
        if not folder.is_dir():
            raise ConfigError(
                f"invalid pipeline config {source}: python_path: {folder} is not a folder"
            )
        folders.append(str(folder))
    return {"python_path": folders, "transform": absolute_spec(config.transform, code_dir)}


def _sqlite_file(url: str) -> str | None:
    """The file of a SQLite ledger URL made absolute by `_resolve_sqlite`; None for any
    other database (or an in-memory one)."""
    prefix = "sqlite:////"
    return "/" + url[len(prefix) :].split("?", 1)[0] if url.startswith(prefix) else None


def _resolve_sqlite(url: str, base: Path) -> str:
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url.startswith(prefix + "/"):
        rel = url[len(prefix) :]
        if rel and rel != ":memory:":
            return prefix + str((base / rel).resolve())
    return url


def load_config(path: str | os.PathLike[str]) -> PipelineConfig:
    """Read and validate a pipeline config file. Relative paths resolve against the
    current directory, as for any command-line tool."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read pipeline config {file}: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"pipeline config {file} is not valid YAML: {exc}") from exc
    return parse_config(data, str(file), code_dir=file.parent)
