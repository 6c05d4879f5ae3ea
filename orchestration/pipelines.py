"""Which pipelines the code location serves: every YAML file in one folder.

EXACTLY_PIPELINES_DIR names the folder; the demo pipeline's folder (`pipelines/`) is the
default, so `dagster dev -w workspace.yaml` shows something useful out of the box.
"""

from __future__ import annotations

import os
from pathlib import Path

from ledger.core.errors import ConfigError
from orchestration.names import dagster_name
from resources.config.loading import load_config

DEFAULT_DIR = Path(__file__).resolve().parent.parent / "pipelines"


def pipelines_dir() -> Path:
    return Path(os.environ.get("EXACTLY_PIPELINES_DIR", DEFAULT_DIR))


def config_files(folder: Path | None = None) -> list[Path]:
    """The folder's pipeline config files, each one valid, no two naming the same pipeline
    (their jobs, sensors and resources would collide)."""
    folder = folder or pipelines_dir()
    if not folder.is_dir():
        raise ConfigError(f"EXACTLY_PIPELINES_DIR {folder} is not a folder of pipeline configs")
    files = sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")])
    names = [load_config(p).pipeline for p in files]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"pipelines in {folder} share names {dupes}: names must be unique")
    spelled = [dagster_name(n) for n in names]
    alike = sorted({n for n, d in zip(names, spelled, strict=True) if spelled.count(d) > 1})
    if alike:
        raise ConfigError(
            f"pipelines {alike} in {folder} have one Dagster name ({dagster_name(alike[0])}: "
            "Dagster spells '.' and '-' as '_'); rename one of them"
        )
    return files
