"""A table another pipeline writes from the same topics: the one way a config change, with
no crash at all, would commit every record twice.

A pipeline's history is its application id's: the ledger's batches, and the Delta log's app
transactions under its name (invariant 7 rebuilds one from the other). Renamed (`pipeline:`
is also the application id), or copied into a second config that keeps the first one's
table, a pipeline has no history there and starts at `starting_offsets` again, reading what
the other name already committed. Both are refused before the new name's first batch, with
the other pipeline named and the two ways out. Two pipelines of different topics may share
a table; the same topic twice, never.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ledger.core.errors import ConfigError


def shared_topics_refusal(
    pipeline: str, table: str, reads: Iterable[str], others: Mapping[str, Mapping[str, Any]]
) -> ConfigError | None:
    """The refusal for pipeline `pipeline`, which reads topics `reads` and holds no batch in
    `table`, when another application id's batches there (`others`, as the publisher's
    `other_writers` gives them) read one of those topics; None when none does."""
    wanted = set(reads)
    for app_id, seen in sorted(others.items()):
        shared = sorted(wanted & set(seen.get("topics") or ()))
        if not shared:
            continue
        other = seen.get("pipeline") or app_id
        return ConfigError(
            f"pipeline {pipeline} holds no batch in {table}, but pipeline {other} "
            f"(application id {app_id}) committed batches up to {seen.get('batch_id')} there "
            f"from topic(s) {', '.join(shared)}, which {pipeline} reads too: starting anew it "
            f"would commit those records a second time. A renamed pipeline keeps its name "
            f"(`pipeline: {other}`, its ledger and table carry on); a second pipeline needs "
            "tables of its own"
        )
    return None
