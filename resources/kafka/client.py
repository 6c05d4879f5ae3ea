"""A thin client over confluent-kafka for everything the product asks of Kafka.

Three promises hold for every method here:

* it never waits forever: every broker round trip carries a timeout, and producing is bounded
  by `message.timeout.ms`;
* a failure surfaces as one `ExactlyError` line that names the bootstrap servers and the
  operation (`UnreachableError` when the broker did not answer), never as a librdkafka log line
  on stderr or a raw `KafkaException`;
* offsets are read at `READ_COMMITTED`, so the end of a partition is its last stable offset
  (LSO): a batch planned up to it can never include records of a transaction that might still
  abort.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from types import TracebackType
from typing import Any

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ClusterMetadata, NewTopic, OffsetSpec

from ledger.core.errors import AuthenticationError, ExactlyError, UnreachableError
from ledger.core.protocol import Available

# librdkafka logs through this logger instead of writing to stderr; the NullHandler keeps
# Python's last-resort handler from printing them when the application configured no logging,
# so a failing command prints exactly one line (the ExactlyError), not a burst of FAIL logs.
_LOG = logging.getLogger("exactly.kafka")
_LOG.addHandler(logging.NullHandler())

# Error codes that mean "the broker did not answer", as opposed to "the broker said no".
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

# Group coordinator answers that only mean "not ready yet, ask again".
#: Leadership moves (a new topic, a restarted broker): the next metadata refresh fixes it.
#: The leader-epoch and high-watermark answers come while a new leader takes over (seen on a
#: loaded machine right after a topic was created); Kafka's Java client retries them too.
_RETRIABLE_LEADER_CODES = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.REPLICA_NOT_AVAILABLE,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.OFFSET_NOT_AVAILABLE,
    }
)

_RETRIABLE_GROUP_CODES = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.UNSTABLE_OFFSET_COMMIT,
        KafkaError._WAIT_COORD,
    }
)

_TOPIC_NAME_UNSAFE = re.compile(r"[^a-zA-Z0-9._-]+")


def _kafka_error(exc: BaseException) -> KafkaError | None:
    arg = exc.args[0] if exc.args else None
    return arg if isinstance(arg, KafkaError) else None


def _to_bytes(value: bytes | str | None) -> bytes | None:
    return value.encode("utf-8") if isinstance(value, str) else value


def safe_topic_name(text: str, max_length: int = 200) -> str:
    """`text` with every character Kafka forbids in a topic name replaced by `-`."""
    return _TOPIC_NAME_UNSAFE.sub("-", text).strip("-.")[:max_length] or "topic"


class Deliveries:
    """Delivery reports of one idempotent producer, checked as they arrive.

    Reports of one idempotent producer come in order per partition, so offsets must rise
    strictly: an acknowledgement at or below the partition's previous offset is a record the
    broker took for a retry of one it already had, and did not write. Kept to a few numbers
    per partition so that millions of records cost no memory.
    """

    def __init__(self) -> None:
        self.failures: list[KafkaError] = []
        self.overlaps: list[tuple[int, int, int]] = []  # (partition, previous, offset)
        self._last: dict[int, int] = {}

    def report(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.failures.append(error)
            return
        partition, offset = message.partition(), message.offset()
        previous = self._last.get(partition, -1)
        if offset <= previous:
            self.overlaps.append((partition, previous, offset))
        self._last[partition] = max(previous, offset)


class KafkaClient:
    """Kafka operations for one cluster, with clear errors and bounded waits.

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

    def __enter__(self) -> KafkaClient:
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
        """One line naming the cluster and the operation; unreachable if nothing answered."""
        unreachable = isinstance(error, KafkaError) and error.code() in _UNREACHABLE_CODES
        if unreachable:
            return UnreachableError(
                f"Kafka at {self.bootstrap_servers} did not answer while {operation}: "
                f"{self._reason(error)}"
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

    def _produce_timeout(self) -> float:
        return self.timeout + 10

    def _new_producer(self) -> Producer:
        """An idempotent producer for one `produce` call: retries can neither duplicate nor
        reorder records.

        Not shared across calls: an idempotent producer's per-partition sequence numbers are
        client state, and a long-lived one that forgets a partition (metadata flapping while
        topics come and go) restarts its sequence at 0, which the broker may then take for a
        retry and acknowledge without writing. A fresh producer has a fresh producer id.
        """
        return Producer(
            self._config(
                {
                    "acks": "all",
                    "enable.idempotence": True,
                    "linger.ms": 5,
                    "message.timeout.ms": int(self.timeout * 1000),
                }
            )
        )

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

    # -- topics ------------------------------------------------------------------------------

    def topic_names(self) -> list[str]:
        """Every topic the cluster lists now (a pattern is resolved against it, at each plan:
        resources/kafka/topic_selection.py); internal ones included, the selection leaves them."""
        return sorted(self.check_reachable(timeout=self.timeout).topics)

    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int = 1,
        config: Mapping[str, str] | None = None,
    ) -> bool:
        """Create `name`; True if created, False if it already existed with `partitions`.

        An existing topic with another partition count is an error, never silently accepted:
        the pipeline maps offsets per partition, and a different count means a different topic
        than the caller planned for. Returns only once every partition has a leader, so that
        producing or listing offsets right after cannot hit a not-yet-propagated topic.
        """
        if partitions < 1:
            raise ExactlyError(f"topic {name!r} needs at least 1 partition, not {partitions}")
        new_topic = NewTopic(
            name,
            num_partitions=partitions,
            replication_factor=replication_factor,
            config=dict(config or {}),
        )
        futures = self._admin_client().create_topics(
            [new_topic], request_timeout=self.timeout, operation_timeout=self.timeout
        )
        outcome = self._wait(
            futures[name],
            f"creating topic {name!r}",
            tolerate=frozenset({KafkaError.TOPIC_ALREADY_EXISTS}),
        )
        if isinstance(outcome, KafkaError):
            self._require_partition_count(name, partitions)
            return False
        self._await_leaders(name, partitions)
        return True

    def _require_partition_count(self, name: str, partitions: int) -> None:
        existing = len(self.partitions(name))
        if existing != partitions:
            raise ExactlyError(
                f"topic {name!r} on Kafka at {self.bootstrap_servers} already exists with "
                f"{existing} partitions, not {partitions}"
            )

    def _await_leaders(self, name: str, partitions: int) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            description = self._describe(name)
            if description is not None:
                leaders = [p for p in description.partitions if p.leader is not None]
                if len(leaders) == partitions:
                    return
            time.sleep(0.1)
        raise UnreachableError(
            f"Kafka at {self.bootstrap_servers}: topic {name!r} was created but its "
            f"{partitions} partitions had no leader within {self.timeout:g}s"
        )

    def _describe(self, topic: str) -> Any | None:
        """The topic's description, or None if the cluster does not know it."""
        futures = self._admin_client().describe_topics(
            TopicCollection([topic]), request_timeout=self.timeout
        )
        outcome = self._wait(
            futures[topic],
            f"describing topic {topic!r}",
            tolerate=frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART}),
        )
        return None if isinstance(outcome, KafkaError) else outcome

    def partitions(self, topic: str) -> list[int]:
        """The topic's partition ids; a missing topic is an error, never an empty list.

        Uses DescribeTopics rather than a metadata request so that asking can never
        auto-create the topic on a broker that allows it.
        """
        description = self._describe(topic)
        if description is None:
            raise ExactlyError(
                f"topic {topic!r} does not exist on Kafka at {self.bootstrap_servers}"
            )
        return sorted(p.id for p in description.partitions)

    def topic_id(self, topic: str) -> str:
        """Kafka's id of the topic's current incarnation (KIP-516), as its tools print it.

        A topic deleted and re-created under the same name gets a new id, so the id tells
        offsets of one incarnation from the other's. A cluster that reports no id (brokers
        older than Kafka 2.8) is an error: without it a re-created topic cannot be told.
        """
        description = self._describe(topic)
        if description is None:
            raise ExactlyError(
                f"topic {topic!r} does not exist on Kafka at {self.bootstrap_servers}"
            )
        uuid = description.topic_id
        if uuid is None or (
            uuid.get_most_significant_bits() == 0 and uuid.get_least_significant_bits() == 0
        ):
            raise ExactlyError(
                f"Kafka at {self.bootstrap_servers} reports no topic id for topic {topic!r} "
                "(brokers before Kafka 2.8 have none); exactly needs it to tell a re-created "
                "topic from the one it read"
            )
        return str(uuid)

    # -- offsets -----------------------------------------------------------------------------

    def offsets(self, topic: str, partitions: Iterable[int] | None = None) -> dict[int, Available]:
        """Earliest offset and last stable offset of each partition (all if `partitions` is None).

        Both are asked at READ_COMMITTED: the end is the LSO, not the high watermark, so records
        of open transactions are never inside the range. The LSO is the first offset a
        read_committed reader may not see yet, not a record count: aborted records and
        transaction markers occupy offsets too, so `last_stable - earliest` may exceed the
        number of committed records.
        """
        wanted = sorted(set(self.partitions(topic) if partitions is None else partitions))
        if not wanted:
            return {}
        earliest = self._list_offsets(topic, wanted, OffsetSpec.earliest(), "earliest")
        latest = self._list_offsets(topic, wanted, OffsetSpec.latest(), "last stable")
        return {p: Available(earliest[p], latest[p]) for p in wanted}

    def _list_offsets(
        self, topic: str, partitions: list[int], spec: OffsetSpec, label: str
    ) -> dict[int, int]:
        operation = f"listing {label} offsets of topic {topic!r} partitions {partitions}"
        found: dict[int, int] = {}
        deadline = time.monotonic() + self.timeout
        while True:
            request = {TopicPartition(topic, p): spec for p in partitions if p not in found}
            try:
                futures = self._admin_client().list_offsets(
                    request,
                    isolation_level=IsolationLevel.READ_COMMITTED,
                    request_timeout=self.timeout,
                )
            except KafkaException as exc:
                raise self._from_exception(operation, exc) from exc
            last: KafkaError | None = None
            for tp, future in futures.items():
                result = self._wait(future, operation, tolerate=_RETRIABLE_LEADER_CODES)
                if isinstance(result, KafkaError):
                    last = result
                else:
                    found[tp.partition] = result.offset
            if last is None:
                return found
            if time.monotonic() >= deadline:
                raise self._error(operation, last)
            time.sleep(0.2)

    # -- consumer group offsets --------------------------------------------------------------

    def commit_group_offsets(self, group_id: str, topic: str, offsets: Mapping[int, int]) -> None:
        """Commit `offsets` (partition -> next offset to read) for `group_id`, synchronously.

        Goes through the admin API, so nothing joins the group: committing never triggers a
        rebalance of real consumers, and it fails loudly if the group has active members.
        """
        if not offsets:
            return
        negative = {p: o for p, o in offsets.items() if o < 0}
        if negative:
            raise ExactlyError(f"cannot commit negative offsets {negative} for group {group_id!r}")
        partitions = [TopicPartition(topic, p, o) for p, o in sorted(offsets.items())]
        operation = f"committing offsets of group {group_id!r} on topic {topic!r}"

        def attempt() -> Any:
            futures = self._admin_client().alter_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group_id, partitions)],
                request_timeout=self.timeout,
            )
            result = self._wait(futures[group_id], operation, tolerate=_RETRIABLE_GROUP_CODES)
            if isinstance(result, KafkaError):
                return result
            failed = [tp.error for tp in result.topic_partitions if tp.error is not None]
            return failed[0] if failed else result

        self._group_call(operation, attempt)

    def group_offsets(self, group_id: str, topic: str) -> dict[int, int]:
        """The group's committed offsets on `topic`; partitions never committed are absent.

        Read by a consumer of the group that never subscribes, so nothing joins the group.
        Not through the admin API: librdkafka's ListConsumerGroupOffsets kills the process
        (SIGSEGV) when the coordinator answers NOT_COORDINATOR, as it does while a cluster
        loads its group metadata (librdkafka issue 5040); a consumer's fetch fails with that
        error instead, and it is retried like every group call's. The read_committed
        isolation level makes the broker wait for pending transactional offset commits
        (require_stable, KIP-447), so the answer never reflects a transaction that might
        still abort.
        """
        operation = f"reading offsets of group {group_id!r} on topic {topic!r}"
        wanted = [TopicPartition(topic, p) for p in self.partitions(topic)]
        consumer = Consumer(
            self._config(
                {
                    "group.id": group_id,
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                }
            )
        )

        def attempt() -> Any:
            try:
                committed = consumer.committed(wanted, timeout=self.timeout)
            except KafkaException as exc:
                return exc.args[0]  # _group_call retries what is retriable, raises the rest
            failed = [tp.error for tp in committed if tp.error is not None]
            return failed[0] if failed else committed

        try:
            committed = self._group_call(operation, attempt)
        finally:
            consumer.close()
        return {tp.partition: tp.offset for tp in committed if tp.offset >= 0}

    def _group_call(self, operation: str, attempt: Callable[[], Any]) -> Any:
        """Run `attempt` until it returns something other than a retriable KafkaError.

        The first group operation on a fresh cluster creates `__consumer_offsets`; until its
        partitions are loaded the coordinator answers NOT_COORDINATOR or LOAD_IN_PROGRESS,
        which are a matter of seconds, not failures. Bounded by `self.timeout`.
        """
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                outcome = attempt()
            except KafkaException as exc:
                raise self._from_exception(operation, exc) from exc
            if not isinstance(outcome, KafkaError):
                return outcome
            if outcome.code() not in _RETRIABLE_GROUP_CODES or time.monotonic() > deadline:
                raise self._error(operation, outcome)
            time.sleep(0.2)

    # -- producing ---------------------------------------------------------------------------

    def produce(
        self,
        topic: str,
        values: Iterable[bytes | str],
        partition: int | None = None,
        key: bytes | str | None = None,
    ) -> int:
        """Produce `values` in order and wait until every one is acknowledged; return the count.

        Returning means all records are durable (acks=all); any failed delivery raises.
        """
        return self._produce_all(topic, ((partition, key, v) for v in values))

    def produce_to_partitions(
        self, topic: str, by_partition: Mapping[int, Iterable[bytes | str]]
    ) -> int:
        """Produce each partition's values, in order, to that partition; return the count."""
        items = ((p, None, v) for p, values in by_partition.items() for v in values)
        return self._produce_all(topic, items)

    def produce_records(
        self,
        topic: str,
        records: Iterable[tuple[int | None, bytes | str | None, bytes | str | None]],
    ) -> int:
        """Produce (partition, key, value) records in order; a None value is a tombstone
        (how a compacted topic deletes a key). Returns the count, all acknowledged."""
        return self._produce_all(topic, records)

    def _produce_all(
        self,
        topic: str,
        items: Iterable[tuple[int | None, bytes | str | None, bytes | str | None]],
    ) -> int:
        producer = self._new_producer()
        deliveries = Deliveries()
        count = 0
        try:
            for partition, key, value in items:
                self._enqueue(producer, topic, partition, key, value, deliveries.report)
                count += 1
            self._flush(producer, topic)
        except BaseException:
            producer.purge()  # so that close() does not wait for records nobody will see
            raise
        finally:
            producer.close()
        if deliveries.failures:
            raise self._error(
                f"producing {count} records to topic {topic!r} "
                f"({len(deliveries.failures)} not delivered)",
                deliveries.failures[0],
            )
        if deliveries.overlaps:
            partition, previous, offset = deliveries.overlaps[0]
            raise ExactlyError(
                f"Kafka at {self.bootstrap_servers} acknowledged {len(deliveries.overlaps)} of "
                f"{count} records for topic {topic!r} at offsets already taken (first: "
                f"partition {partition} offset {offset} after {previous}); they were not written"
            )
        return count

    def _enqueue(
        self,
        producer: Producer,
        topic: str,
        partition: int | None,
        key: bytes | str | None,
        value: bytes | str | None,
        on_delivery: Any,
    ) -> None:
        """Queue one record, waiting (bounded) for room when the local queue is full."""
        kwargs: dict[str, Any] = {"value": _to_bytes(value), "on_delivery": on_delivery}
        if partition is not None:
            kwargs["partition"] = partition
        if key is not None:
            kwargs["key"] = _to_bytes(key)
        deadline = time.monotonic() + self._produce_timeout()
        while True:
            try:
                producer.produce(topic, **kwargs)
                return
            except BufferError:
                if time.monotonic() > deadline:
                    raise UnreachableError(
                        f"Kafka at {self.bootstrap_servers} accepted no records for topic "
                        f"{topic!r} within {self._produce_timeout():g}s (local queue full)"
                    ) from None
                producer.poll(0.1)
            except KafkaException as exc:
                raise self._from_exception(f"producing to topic {topic!r}", exc) from exc

    def _flush(self, producer: Producer, topic: str) -> None:
        # message.timeout.ms bounds every record's delivery, so this flush always returns.
        remaining = producer.flush(self._produce_timeout())
        if remaining:
            raise UnreachableError(
                f"Kafka at {self.bootstrap_servers} did not acknowledge {remaining} records "
                f"for topic {topic!r} within {self._produce_timeout():g}s"
            )
