"""Operator actions that move no position: a recovery asked for, a derived output rebuilt.

Why a record of their own: issue 30 asks every operator decision taken from the UI or the
shell to be kept in the ledger with who and why. Skips move positions and are decisions
(ledger/core/decisions.py), carried into the Delta log because a rebuilt ledger needs them;
an abandon is written on the batch it released (ledger/coordinator/release.py). A recovery
asked for by an operator, and a derived output rebuilt, change no position and no batch:
they are kept here as a journal, so the table asset can show who asked for what, when, why,
and what came of it. Recoveries every start runs by itself are not operator actions and are
not journaled.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from ledger.core.batch import Batch


class ActionKind(enum.StrEnum):
    """What the operator asked for. Stored in ledgers: never renamed."""

    RECOVER = "recover"
    REBUILD = "rebuild"


@dataclass(frozen=True)
class OperatorAction:
    """One journaled action: who asked, why, when (the ledger database's clock), and what
    came of it in one sentence."""

    id: str
    pipeline: str
    kind: ActionKind
    #: what it acted on: the derived output rebuilt, or "" for the whole pipeline
    subject: str
    decided_by: str
    reason: str
    decided_at: datetime
    outcome: str

    def text(self) -> str:
        """One line for the UI and the CLI."""
        what = f"{self.kind} {self.subject}".strip()
        why = self.reason or "no reason given"
        return f"{what} by {self.decided_by} ({why}): {self.outcome}"


def new_action_id() -> str:
    return uuid.uuid4().hex


def recovered_text(batches: Sequence[Batch]) -> str:
    """What a recovery did, in one sentence: each batch it finished or abandoned."""
    if not batches:
        return "nothing to recover"
    done = ", ".join(f"{b.app_id}/{b.batch_id} {b.state}" for b in batches)
    return f"recovered {len(batches)} batch(es): {done}"
