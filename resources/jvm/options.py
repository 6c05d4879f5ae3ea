"""Options an operator adds to every JVM this project starts: `EXACTLY_JVM_OPTIONS`.

Spark's drivers (a run's own and a shared Connect server's), a standalone cluster's daemons
and executors, the embedded broker and the embedded S3 server all take them, after the
project's own options, so that they win where the two disagree (of two settings of one JVM
option, the last counts). What for: a truststore or a proxy, a heap size, a JIT setting.

The test suite uses it: every JVM there runs with `-XX:TieredStopAtLevel=1` (tests/conftest.py).
Its JVMs live seconds and run small jobs; C2, the optimizing compiler, spent half of such a
driver's CPU (9.2 s against 4.4 s for a session and three small jobs, measured side by side),
on two cores that the suite keeps saturated. A pipeline that runs for hours wants C2, which is
why this is not a default.

A value that is not a list of options (an unbalanced quote, a word without a leading `-`) is
refused in one line naming the variable, before any JVM starts: passed on, it would become
the JVM's main class or Spark's, and fail far from its cause.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping

from ledger.core.errors import ConfigError

JVM_OPTIONS_ENV = "EXACTLY_JVM_OPTIONS"


def operator_jvm_options(env: Mapping[str, str] = os.environ) -> list[str]:
    """The options `EXACTLY_JVM_OPTIONS` holds, split as a shell would split them."""
    text = env.get(JVM_OPTIONS_ENV, "")
    try:
        options = shlex.split(text)
    except ValueError as exc:
        raise ConfigError(
            f"{JVM_OPTIONS_ENV}={text!r} cannot be split into options: {exc}"
        ) from None
    for option in options:
        if not option.startswith("-"):
            raise ConfigError(
                f"{JVM_OPTIONS_ENV}: {option!r} is not a JVM option (each starts with '-')"
            )
    return options


def with_operator_options(own: str | None, env: Mapping[str, str] = os.environ) -> str | None:
    """A Spark `extraJavaOptions` value: the operator's options, then `own` (a config's), or
    None when both are empty. Spark splits the value as a shell would."""
    options = operator_jvm_options(env)
    words = [shlex.join(options)] if options else []
    if own:
        words.append(own)
    return " ".join(words) or None
