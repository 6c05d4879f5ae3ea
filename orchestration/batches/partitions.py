"""Adding a batch's Dagster partition from more than one process.

A live batch's partition is added by whichever process sees the batch first: the plan op or
the continuous run that planned it, the schedule that is about to request it, the re-drive
sensor that finishes it, the history sensor that records it from the ledger. They run in
different processes at the same moment. Dagster's `add_dynamic_partitions` reads which of the
keys exist and inserts the others, in two statements, so an insert by another process between
the two fails the second with a unique-constraint error. That error must not fail a plan op
whose batch is already in the ledger (tests/test_batch_partitions.py): the partition it wanted
is there, added by the other process.
"""

from __future__ import annotations

import dagster as dg
from sqlalchemy.exc import IntegrityError


def add_batch_partition(instance: dg.DagsterInstance, partitions: str, key: str) -> bool:
    """Make sure partition `key` of `partitions` exists; True if this call added it.

    Failure cases:
    - the partition exists already: nothing is written, False;
    - another process inserts it between Dagster's read and its insert: the insert's integrity
      error is forgiven once the partition is seen to exist, False;
    - the insert fails and the partition is still missing: the storage's error is raised, as
      it names what is wrong with the instance's storage.
    """
    if instance.has_dynamic_partition(partitions, key):
        return False
    try:
        instance.add_dynamic_partitions(partitions, [key])
    except IntegrityError:
        if not instance.has_dynamic_partition(partitions, key):
            raise
        return False
    return True
