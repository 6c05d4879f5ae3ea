"""Liveness of an attempt's owner: whether the attempt that owns a batch may still be
running, and the heartbeat that keeps this process's lease fresh while it stages or
publishes (ledger/core/protocol.py `owner_may_be_alive` is the rule).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ledger.core.batch import Batch
from ledger.core.errors import FencedError
from ledger.core.protocol import owner_may_be_alive
from ledger.host.process import running, this_owner

if TYPE_CHECKING:
    from ledger.coordinator.two_phase import TwoPhaseCommit


def may_be_alive(tpc: TwoPhaseCommit, batch: Batch) -> bool:
    """Whether the attempt that owns `batch` may still be running somewhere.

    The heartbeat's age is the database's now minus the heartbeat the database stamped
    (invariant 17): the owner's clock and ours are never compared.
    """
    me = this_owner()
    if batch.owner.same_process(me):
        return False
    age = (tpc.store.now() - batch.heartbeat_at).total_seconds()
    return owner_may_be_alive(
        batch.owner,
        age,
        tpc.lease_seconds,
        socket.gethostname(),
        batch.owner.host == me.host and running(batch.owner),
    )


@contextmanager
def heartbeat(tpc: TwoPhaseCommit, batch: Batch) -> Iterator[None]:
    """Keep the attempt's lease fresh while it stages or publishes (either can take
    minutes), so recovery elsewhere neither abandons it nor takes its vote over.

    A beat every quarter lease. A beat that fails for a passing reason (the database
    unreachable a moment) is logged and the next one tries again; a beat that finds the
    attempt fenced (another attempt took the batch over) stops beating, and FencedError is
    raised when the work inside ends.
    """
    stop = threading.Event()
    fenced: list[FencedError] = []

    def beat() -> None:
        while not stop.wait(tpc.lease_seconds / 4):
            try:
                tpc.store.heartbeat(batch)
            except FencedError as exc:
                fenced.append(exc)
                return
            except Exception as exc:
                tpc.log(f"heartbeat for {batch.label} failed: {exc}")

    thread = threading.Thread(target=beat, name=f"heartbeat-{batch.batch_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    if fenced:
        raise fenced[0]
