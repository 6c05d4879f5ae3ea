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


SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"


def test_a_delta_spark_read_rebuilds_a_table_s_state_in_the_default_s_tasks(
    spark: Any, tmp_path: Any
) -> None:
    """delta-spark replays a table's log in `snapshotPartitions` tasks, 50 unless set: on
    two cores that was most of `exactly demo`'s read-back. The product's default must be a
    setting delta-spark honours: the state's stage runs that many tasks, not 50."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from resources.spark.session import DEFAULT_CONF

    uri = str(tmp_path / "table")
    for n in range(3):  # a log of a few commits, as a pipeline's table has
        write_deltalake(uri, pa.table({"n": [n]}), mode="append")
    session = spark.newSession()  # the fixture's own tiny-tables setting replaced
    session.conf.set(SNAPSHOT_PARTITIONS, DEFAULT_CONF[SNAPSHOT_PARTITIONS])
    context = spark.sparkContext
    context.setJobGroup("state", "a table's state rebuilt")
    try:
        assert session.read.format("delta").load(uri).count() == 3
    finally:
        context.setJobGroup("", "")
    tracker = context.statusTracker()
    stages = [
        tracker.getStageInfo(stage)
        for job in tracker.getJobIdsForGroup("state")
        for stage in (tracker.getJobInfo(job).stageIds if tracker.getJobInfo(job) else [])
    ]
    tasks = sorted({s.numTasks for s in stages if s is not None})
    assert int(DEFAULT_CONF[SNAPSHOT_PARTITIONS]) in tasks, tasks
    assert max(tasks) < 50, tasks
