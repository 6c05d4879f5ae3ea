"""Errors that end a command with one clear line and exit code 2.

Every error names the thing that is wrong (a config field, a partition and its offsets, a
batch and the state it was found in) so that an operator can act on the message alone.
"""

from __future__ import annotations

import shlex

#: Stands for the pipeline's config file in a command an error tells the operator to run;
#: `with_config` puts the real path in its place wherever the text reaches a person (the
#: CLI's error line, Dagster's run failures, asset checks and alerts).
CONFIG_PLACEHOLDER = "<config>"


def with_config(text: str, config_path: str) -> str:
    """`text` with the commands it names spelled for `config_path`, ready to copy."""
    return text.replace(CONFIG_PLACEHOLDER, shlex.quote(config_path))


class ExactlyError(Exception):
    """A problem the user or operator must fix; printed as one line, exit code 2."""

    exit_code = 2


class ConfigError(ExactlyError):
    """The pipeline configuration or a command-line argument is invalid."""


class UnreachableError(ExactlyError):
    """A service (Kafka broker, ledger database, Spark) did not answer."""


class AuthenticationError(ExactlyError):
    """A service answered and refused our credentials: waiting will not help."""


class FencedError(ExactlyError):
    """A ledger compare-and-set failed: another attempt owns the batch now.

    The holder of a stale attempt token learns here that it must stop; it never moves the
    batch and never publishes its files.
    """


class BusyError(ExactlyError):
    """Another live attempt holds an in-flight batch of this application id."""


class DataLossError(ExactlyError):
    """Offsets that a batch must read are no longer in Kafka (retention or truncation)."""


class InconsistencyError(ExactlyError):
    """The ledger, the Delta log and Kafka disagree in a way the protocol forbids."""


class RefusedBatchError(InconsistencyError):
    """A batch's staged output breaks an invariant the vote protects (protocol.md 13: every
    coordinate read exactly once; 14: a schema the tables can take).

    The same transform over the same range would fail the same way, so the coordinator
    abandons the batch (ABORTED, with this message) before it votes instead of leaving it to
    be re-staged forever; nothing of it is ever published.
    """


class TopicChangedError(InconsistencyError):
    """Kafka's topic is not the incarnation the stored positions were read from: it was
    deleted and re-created, or the config now names another topic (invariant 10)."""


class DecisionError(ExactlyError):
    """An operator's skip decision was refused (it would lose records still in Kafka, or
    duplicate committed ones); nothing was recorded."""
