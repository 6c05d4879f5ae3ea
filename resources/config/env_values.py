"""Secrets in the config: the `{env: NAME}` option value (`EnvValue`) and its resolution
when a client is made (`resolve_options`), shared by every section with client options
(Kafka, Spark, object storage) and by the PostgreSQL outputs' URLs, so a secret is read the
same way, and refused the same way when its variable is unset, wherever it is used.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from pydantic import field_validator

from ledger.core.errors import ConfigError
from resources.config.strict import _Strict

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


def resolve_options(
    options: Mapping[str, OptionValue], where: str, env: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """The options with every `{env: NAME}` replaced by the variable's value, read now; an
    unset variable is a config error naming the option and the variable (never a value)."""
    resolved = {}
    for key, value in options.items():
        if isinstance(value, EnvValue):
            if value.env not in env:
                raise ConfigError(f"{where}.{key}: environment variable {value.env} is not set")
            resolved[key] = env[value.env]
        else:
            resolved[key] = value
    return resolved
