"""Two processes adding the same batch partition at once: neither fails.

The plan op adds the partition of the batch it planned, and the history sensor, in the daemon,
adds the partition of every live batch the ledger lists. Dagster's `add_dynamic_partitions`
reads which keys exist and then inserts the others, so when the sensor's insert lands between
the op's read and its insert, the op failed with `UNIQUE constraint failed` and the batch it
had planned was left to the re-drive (a CI run of tests/test_ui.py saw exactly that). The race
is made certain here: a hook on the real SQLite instance storage inserts the row from another
connection just before the insert it races, as the sensor's process would.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from orchestration.batches.partitions import add_batch_partition

PARTITIONS = "pipe_batches"


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:
        yield inst


@pytest.fixture
def a_racing_sensor() -> Iterator[list[str]]:
    """Before each insert into `dynamic_partitions`, the same rows are inserted and committed
    from a connection of their own: another process won the race. Lists what it inserted."""
    raced: list[str] = []

    def race(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if not statement.lstrip().upper().startswith("INSERT INTO DYNAMIC_PARTITIONS"):
            return
        rows = params if isinstance(params, list) else [params]
        other = sqlite3.connect(conn.engine.url.database)
        with other:
            for row in rows:
                other.execute(
                    "INSERT INTO dynamic_partitions (partitions_def_name, partition) VALUES (?, ?)",
                    tuple(row)[:2],
                )
                raced.append(tuple(row)[1])
        other.close()

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", race)
    try:
        yield raced
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", race)


def test_dagster_alone_fails_when_another_process_adds_the_partition_first(
    instance: dg.DagsterInstance, a_racing_sensor: list[str]
) -> None:
    """The cause, shown on the real storage: if Dagster ever makes the add idempotent, this
    fails and the helper below can go."""
    with pytest.raises(IntegrityError, match="UNIQUE"):
        instance.add_dynamic_partitions(PARTITIONS, ["7"])
    assert a_racing_sensor == ["7"]


def test_a_partition_another_process_added_first_is_added_without_error(
    instance: dg.DagsterInstance, a_racing_sensor: list[str]
) -> None:
    assert add_batch_partition(instance, PARTITIONS, "7") is False
    assert a_racing_sensor == ["7"]
    assert instance.get_dynamic_partitions(PARTITIONS) == ["7"]


def test_a_new_partition_is_added_and_an_existing_one_is_left_alone(
    instance: dg.DagsterInstance,
) -> None:
    assert add_batch_partition(instance, PARTITIONS, "1") is True
    assert add_batch_partition(instance, PARTITIONS, "1") is False
    assert add_batch_partition(instance, PARTITIONS, "2") is True
    assert instance.get_dynamic_partitions(PARTITIONS) == ["1", "2"]


def test_an_integrity_error_that_is_not_the_race_is_not_swallowed(
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the race is forgiven: if the insert fails and the partition is still missing, the
    error is the storage's and reaches the run."""

    def broken(name: str, keys: list[str]) -> None:
        raise IntegrityError("INSERT", {}, Exception("NOT NULL constraint failed"))

    monkeypatch.setattr(instance, "add_dynamic_partitions", broken)
    with pytest.raises(IntegrityError, match="NOT NULL"):
        add_batch_partition(instance, PARTITIONS, "3")
