"""One Kafka cluster's connection: its settings, the waits on its answers, and the
translation of every failure into one line.

Everything the product asks of Kafka (resources/kafka/topic_admin.py, group_offsets.py,
producing.py, assembled as `KafkaClient` in client.py) goes through this class, so three
promises hold for all of it:

* it never waits forever: every broker round trip carries a timeout, and producing is bounded
  by `message.timeout.ms`;
* a failure surfaces as one `ExactlyError` line that names the bootstrap servers and the
  operation (`UnreachableError` when the broker did not answer), never as a librdkafka log line
  on stderr or a raw `KafkaException`;
* credentials a broker refused fail at once, not at the end of the operation's timeout.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from types import TracebackType
from typing import Any, Self

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata

from ledger.core.errors import AuthenticationError, ExactlyError, UnreachableError
from resources.failures.causes import ADVICE, KAFKA_AUTHORIZATION

# librdkafka logs through this logger instead of writing to stderr; the NullHandler keeps
# Python's last-resort handler from printing them when the application configured no logging,
# so a failing command prints exactly one line (the ExactlyError), not a burst of FAIL logs.
_LOG = logging.getLogger("exactly.kafka")
_LOG.addHandler(logging.NullHandler())

# Error codes that mean "the broker did not answer", as opposed to "the broker said no".
#: What the broker answers a principal its ACLs do not allow (the credentials were fine).
_NOT_AUTHORIZED_CODES = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)
#: What an operator does about it, the same from librdkafka and from Spark's Java client.
NOT_AUTHORIZED_ADVICE = ADVICE[KAFKA_AUTHORIZATION]
_UNREACHABLE_CODES = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError._TIMED_OUT_QUEUE,
        KafkaError._MSG_TIMED_OUT,
        KafkaError._RESOLVE,
        KafkaError._WAIT_COORD,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
    }
)

# Defaults every confluent client gets; `options` may override them.
_CLIENT_DEFAULTS: dict[str, Any] = {
    # librdkafka backs off up to 10 s between reconnects by default; a broker that is just
    # coming up (tests, `exactly kafka start`) would then be noticed seconds late.
    "reconnect.backoff.max.ms": 1000,
}


def _kafka_error(exc: BaseException) -> KafkaError | None:
    arg = exc.args[0] if exc.args else None
    return arg if isinstance(arg, KafkaError) else None


class KafkaConnection:
    """The settings, waits and error translation of one cluster's clients.

    `options` (security settings, for example) are passed to every confluent client this
    object creates, so an authenticated cluster needs to be described only once. `timeout`
    bounds each single broker operation in seconds.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        options: Mapping[str, str] | None = None,
        *,
        timeout: float = 30.0,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.options: dict[str, str] = dict(options or {})
        self.timeout = timeout
        self._admin: AdminClient | None = None
        self._last_error: str | None = None
        self._refused: str | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Drop the underlying admin client (producers live for one `produce` call)."""
        self._admin = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- configuration and error translation -------------------------------------------------

    def _config(self, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Client config: defaults < user options < what the operation itself requires.

        The bootstrap servers, logger and error callback always win: they are what makes every
        error name the right cluster and keeps librdkafka off stderr.
        """
        config: dict[str, Any] = {**_CLIENT_DEFAULTS, **self.options, **(overrides or {})}
        config["bootstrap.servers"] = self.bootstrap_servers
        config["logger"] = _LOG
        config["error_cb"] = self._on_error
        return config

    def _on_error(self, error: KafkaError) -> None:
        # Remembered so that a timeout can say *why* (e.g. "Connection refused"); the summary
        # "N/M brokers are down" says less than the connect error before it, so it never wins.
        if error.code() != KafkaError._ALL_BROKERS_DOWN or self._last_error is None:
            self._last_error = error.str()
        if error.code() == KafkaError._AUTHENTICATION:
            self._refused = error.str()

    def _raise_if_refused(self, operation: str) -> None:
        """A broker that refused our credentials will not change its mind while we wait:
        say so at once (librdkafka would retry until the operation's timeout)."""
        if self._admin is not None:
            self._admin.poll(0)  # serves error_cb
        if self._refused is not None:
            raise AuthenticationError(
                f"Kafka at {self.bootstrap_servers} refused our credentials while {operation}: "
                f"{self._refused}; check kafka.security (user, password variable, mechanism)"
            )

    def _reason(self, error: KafkaError | str) -> str:
        text = error if isinstance(error, str) else error.str()
        if self._admin is not None:
            self._admin.poll(0)  # serves error_cb, which fills _last_error
        last = self._last_error
        if last and last not in text:
            return f"{text} (last error: {last})"
        return text

    def _error(self, operation: str, error: KafkaError | str) -> ExactlyError:
        """One line naming the cluster and the operation; unreachable if nothing answered;
        an authorization the broker refused, with the ACLs it takes."""
        if isinstance(error, KafkaError) and error.code() in _NOT_AUTHORIZED_CODES:
            return AuthenticationError(
                f"Kafka at {self.bootstrap_servers} did not authorize exactly's user while "
                f"{operation}: {self._reason(error)}; {NOT_AUTHORIZED_ADVICE}"
            )
        unreachable = isinstance(error, KafkaError) and error.code() in _UNREACHABLE_CODES
        if unreachable:
            return UnreachableError(
                f"Kafka at {self.bootstrap_servers} did not answer within {self.timeout:g}s "
                f"while {operation}: {self._reason(error)}"
            )
        return ExactlyError(
            f"Kafka at {self.bootstrap_servers}: {operation} failed: {self._reason(error)}"
        )

    def _from_exception(self, operation: str, exc: KafkaException) -> ExactlyError:
        error = _kafka_error(exc)
        return self._error(operation, error if error is not None else str(exc))

    def _wait(
        self,
        future: Future[Any],
        operation: str,
        tolerate: frozenset[int] = frozenset(),
    ) -> Any:
        """The future's result, or the KafkaError if its code is in `tolerate`.

        The extra seconds over `self.timeout` let librdkafka report its own request timeout
        (which carries a reason) before we give up on the future.
        """
        deadline = time.monotonic() + self.timeout + 5
        try:
            while True:
                try:
                    return future.result(timeout=min(0.25, max(deadline - time.monotonic(), 0)))
                except FutureTimeoutError:
                    self._raise_if_refused(operation)
                    if time.monotonic() >= deadline:
                        raise
        except FutureTimeoutError:
            raise UnreachableError(
                f"Kafka at {self.bootstrap_servers} did not answer within "
                f"{self.timeout + 5:g}s while {operation}"
                + (f" (last error: {self._last_error})" if self._last_error else "")
            ) from None
        except KafkaException as exc:
            error = _kafka_error(exc)
            if error is not None and error.code() in tolerate:
                return error
            raise self._from_exception(operation, exc) from exc

    # -- clients -----------------------------------------------------------------------------

    def _admin_client(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(self._config())
        return self._admin

    # -- cluster -----------------------------------------------------------------------------

    def check_reachable(self, timeout: float = 10) -> ClusterMetadata:
        """Fail early, with the reason, when no broker answers a metadata request (at once
        when the broker refused our credentials)."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    slice_s = min(1.0, max(deadline - time.monotonic(), 0.01))
                    metadata = self._admin_client().list_topics(timeout=slice_s)
                    break
                except KafkaException:
                    self._raise_if_refused("reading the cluster metadata")
                    if time.monotonic() >= deadline:
                        raise
        except KafkaException as exc:
            error = _kafka_error(exc)
            raise UnreachableError(
                f"Kafka at {self.bootstrap_servers} did not answer within {timeout:g}s: "
                f"{self._reason(error if error is not None else str(exc))}"
            ) from exc
        if not metadata.brokers:
            raise UnreachableError(
                f"Kafka at {self.bootstrap_servers} did not answer within {timeout:g}s: "
                "no broker is registered in the cluster metadata yet"
            )
        return metadata
