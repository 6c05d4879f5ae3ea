"""Which pipelines the code location serves: every YAML file in one folder.

EXACTLY_PIPELINES_DIR names the folder; the demo pipeline's folder (`pipelines/`) is the
default, so `dagster dev -w workspace.yaml` shows something useful out of the box.
"""

from __future__ import annotations

import os
from pathlib import Path

from ledger.errors import ConfigError
from resources.config import PipelineConfig, load_config

DEFAULT_DIR = Path(__file__).resolve().parent.parent / "pipelines"


def pipelines_dir() -> Path:
    return Path(os.environ.get("EXACTLY_PIPELINES_DIR", DEFAULT_DIR))


def load_pipelines(folder: Path | None = None) -> list[PipelineConfig]:
    folder = folder or pipelines_dir()
    if not folder.is_dir():
        raise ConfigError(f"EXACTLY_PIPELINES_DIR {folder} is not a folder of pipeline configs")
    configs = [load_config(p) for p in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")])]
    names = [c.pipeline for c in configs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"pipelines in {folder} share names {dupes}: names must be unique")
    return configs
