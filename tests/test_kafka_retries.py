"""Answers a partition's leader gives while leadership moves are retried, not failures
(pure logic of `KafkaClient._list_offsets`, with an admin client that answers from a
script; the real broker's behaviour is exercised by every integration test)."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from resources.kafka.client import KafkaClient


class ScriptedAdmin:
    """list_offsets answers each partition with the next item of its script."""

    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.calls = 0

    def poll(self, _timeout: float) -> int:
        return 0

    def list_offsets(self, request: dict[Any, Any], **_kw: Any) -> dict[Any, Future[Any]]:
        answer = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        futures = {}
        for tp in request:
            future: Future[Any] = Future()
            if isinstance(answer, int):
                future.set_exception(KafkaException(KafkaError(answer)))
            else:
                future.set_result(SimpleNamespace(offset=answer.offset))
            futures[tp] = future
        return futures


@pytest.mark.parametrize(
    "code",
    [
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError.LEADER_NOT_AVAILABLE,
    ],
)
def test_a_leadership_move_is_asked_again(code: int) -> None:
    client = KafkaClient("127.0.0.1:9", timeout=5)
    admin = ScriptedAdmin([code, SimpleNamespace(offset=42)])
    client._admin = admin  # type: ignore[assignment]
    assert client._list_offsets("t", [0, 1], None, "earliest") == {0: 42, 1: 42}  # type: ignore[arg-type]
    assert admin.calls == 2


def test_a_real_refusal_is_not_retried() -> None:
    client = KafkaClient("127.0.0.1:9", timeout=5)
    admin = ScriptedAdmin([KafkaError.TOPIC_AUTHORIZATION_FAILED])
    client._admin = admin  # type: ignore[assignment]
    with pytest.raises(Exception, match="listing earliest offsets"):
        client._list_offsets("t", [0], None, "earliest")  # type: ignore[arg-type]
    assert admin.calls == 1
