"""The base every validated config model shares, in a module of its own so that
resources/config/derived_spec.py (whose output specs are part of the pipeline config) and
resources/config/pipeline_config.py
can both build on it without importing each other; with it the `{env: NAME}` option value
both use for secrets."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, field_validator

#: A pipeline's or an output's name: it becomes part of application ids and asset keys.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


class _Strict(BaseModel):
    """Unknown keys are errors and values are frozen: a typo must not fall back silently."""

    model_config = ConfigDict(extra="forbid", frozen=True)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class EnvValue(_Strict):
    """An option whose value is read from an environment variable when it is used
    (`sasl.password: {env: KAFKA_PASSWORD}`): the config then holds only the variable's
    name, so neither the file, the Dagster UI and run config, the logs nor the ledger (all
    of which show the config) ever hold the secret."""

    env: str

    @field_validator("env")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _ENV_NAME.fullmatch(value):
            raise ValueError("must be the NAME of an environment variable, not its value")
        return value


#: A client option: its value, or the environment variable that holds it.
OptionValue = str | EnvValue
