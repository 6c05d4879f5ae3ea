"""The base every validated config model shares, in a module of its own so that the
pipeline config's sections (resources/config/pipeline_config.py and the modules of its
sections) and the derived output specs (resources/config/derived_spec.py) can all build on it
without importing each other."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

#: A pipeline's or an output's name: it becomes part of application ids and asset keys.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


class _Strict(BaseModel):
    """Unknown keys are errors and values are frozen: a typo must not fall back silently."""

    model_config = ConfigDict(extra="forbid", frozen=True)
