"""The product's Spark defaults that decide what a batch costs outside Spark's own work.

A stage builds its query through py4j: every DataFrame and column call is a round trip to
the JVM. pyspark's DataFrame debugging adds four more to each (the active session, the
origin class, a setting, the call site), which was 0.07 s of every batch's stage
(resources/spark/session.py DEFAULT_CONF says what it buys and how to turn it back on).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from py4j.clientserver import ClientServerConnection

DEBUGGING = "spark.python.sql.dataFrameDebugging.enabled"


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every py4j command this process sends to the JVM while the test runs."""
    sent: list[str] = []
    send = ClientServerConnection.send_command

    def counted(self: ClientServerConnection, command: str) -> Any:
        sent.append(command)
        return send(self, command)

    monkeypatch.setattr(ClientServerConnection, "send_command", counted)
    yield sent


def test_a_session_leaves_pyspark_dataframe_debugging_off(spark: Any) -> None:
    assert spark.conf.get(DEBUGGING) == "false"


def test_a_column_call_makes_only_py4j_own_round_trips(
    spark: Any, round_trips: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyspark.errors.utils as pyspark_errors
    from pyspark.sql import functions as F

    # pyspark reads the setting once per process, from the active session: read it again,
    # as a new process (a CLI run, a Dagster run) does on its first call
    monkeypatch.setattr(pyspark_errors, "_enable_debugging_cache", None)
    F.col("warm")  # the first call reads the setting
    round_trips.clear()
    F.col("value")
    # py4j's own: the functions class, its method, the call (13 with debugging on)
    assert len(round_trips) <= 3, round_trips
