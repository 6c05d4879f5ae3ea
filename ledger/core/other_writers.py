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

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from ledger.core.errors import ConfigError, InconsistencyError
from ledger.core.protocol import OffsetRange


def _shared(
    reads: Iterable[str], others: Mapping[str, Mapping[str, Any]]
) -> tuple[str, str, Any, list[str]] | None:
    """The first other application id (by name) whose batches read one of `reads`: its id,
    its pipeline, its newest batch id and the topics shared; None when none does."""
    wanted = set(reads)
    for app_id, seen in sorted(others.items()):
        shared = sorted(wanted & set(seen.get("topics") or ()))
        if shared:
            return app_id, seen.get("pipeline") or app_id, seen.get("batch_id"), shared
    return None


def shared_topics_refusal(
    pipeline: str, table: str, reads: Iterable[str], others: Mapping[str, Mapping[str, Any]]
) -> ConfigError | None:
    """The refusal for pipeline `pipeline`, which reads topics `reads` and holds no batch in
    `table`, when another application id's batches there (`others`, as the publisher's
    `other_writers` gives them) read one of those topics; None when none does."""
    found = _shared(reads, others)
    if found is not None:
        app_id, other, upto, shared = found
        return ConfigError(
            f"pipeline {pipeline} holds no batch in {table}, but pipeline {other} "
            f"(application id {app_id}) committed batches up to {upto} there "
            f"from topic(s) {', '.join(shared)}, which {pipeline} reads too: starting anew it "
            f"would commit those records a second time. A renamed pipeline keeps its name "
            f"(`pipeline: {other}`, its ledger and table carry on); a second pipeline needs "
            "tables of its own"
        )
    return None


def new_topics_refusal(
    pipeline: str, table: str, new: Iterable[str], others: Mapping[str, Mapping[str, Any]]
) -> ConfigError | None:
    """The refusal for pipeline `pipeline`, which holds batches in `table` and now reads
    topics `new` it never read (added to `kafka.topics`, or newly matched by its pattern),
    when another pipeline's batches there read one of them. Pipelines of different topics
    may share a table; a topic added to one that the other fills it from would be read
    from its first records (ledger/core/topic_plan.py: a started pipeline reads a topic
    new to it from `earliest`) and committed a second time. None when no other reads them."""
    found = _shared(new, others)
    if found is None:
        return None
    app_id, other, upto, shared = found
    return ConfigError(
        f"pipeline {pipeline} now reads topic(s) {', '.join(shared)}, which it never read "
        f"into {table}, but pipeline {other} (application id {app_id}) committed batches "
        f"up to {upto} there from them: reading them from their first "
        f"records, {pipeline} would commit those records a second time. Leave them to "
        f"{other}, or give {pipeline} tables of its own"
    )


def unattributed_rows_refusal(
    pipeline: str, held: Mapping[str, Collection[str]]
) -> ConfigError | None:
    """The refusal for pipeline `pipeline`, which holds no batch in any of its tables, when
    their rows hold records of topics it reads (`held`: the topics found, by table) although
    no commit left in their logs says who wrote them: log retention drops a commit's info
    (its pipeline and topics) after 30 days, the app transactions and rows stay. Stopped for
    longer than that, then renamed, a pipeline would read those topics again from
    `starting_offsets`. None when no table holds such rows."""
    if not held:
        return None
    where = "; ".join(f"{table}: {', '.join(sorted(t))}" for table, t in sorted(held.items()))
    return ConfigError(
        f"pipeline {pipeline} holds no batch in its tables, but they hold rows of topic(s) "
        f"it reads ({where}) that another pipeline or writer committed (its commits are past "
        f"the log's retention): starting anew, {pipeline} would commit those records a "
        "second time. A renamed pipeline keeps its name (`pipeline:` as before; its ledger "
        "is rebuilt from the tables); a second pipeline needs tables of its own"
    )


def first_commit_refusal(
    metadata: Mapping[str, Any], table: str, others: Mapping[str, Mapping[str, Any]]
) -> ConfigError | None:
    """The refusal of a batch's commit (`metadata`: its commit info, ledger/core/batch.py
    `commit_metadata`) into `table`, which holds no batch of its application id yet, when
    the snapshot the commit would go onto holds another pipeline's batches (`others`) of a
    topic the batch read. The start's check (`shared_topics_refusal`) sees the tables as
    they were when the process started: a copy of a config started while the first
    pipeline's first batch was still staging found them empty and passed. Asked again of
    the very snapshot each commit goes onto, with no retry over a newer one
    (resources/delta/commit.py), it leaves no window: of two such first commits, the one
    that lands second has read the other's."""
    pipeline = str(metadata.get("pipeline") or metadata.get("app_id"))
    reads = [str(r["topic"]) for r in metadata.get("ranges") or () if "topic" in r]
    refusal = shared_topics_refusal(pipeline, table, reads, others)
    if refusal is None:
        return None
    return ConfigError(
        f"{refusal} (found at the commit of batch {metadata.get('app_id')}/"
        f"{metadata.get('batch_id')}, voted before the other pipeline's first commit "
        "landed; it is not committed there)"
    )


def another_ledger_refusal(
    label: str, table: str, ours: Sequence[OffsetRange], theirs: Sequence[OffsetRange] | None
) -> InconsistencyError | None:
    """The refusal to commit batch `label` (ranges `ours`) when the data table at `table`
    holds its application id and batch id already, committed with other ranges (`theirs`,
    None when the table's log has no such commit); None when the ranges are the same.

    The same id with the same ranges is this batch committed before a crash (or by another
    attempt): the commit is idempotent and the ledger records it. With other ranges it is
    another ledger's batch: a second ledger.url for the same pipeline and table (a SQLite
    ledger at a relative path on two hosts, a laptop's run beside the scheduled one). Each
    ledger plans its own ranges under the same batch ids, and the Delta transaction
    version, which says which ids the table holds, cannot tell them apart: recorded as
    committed, this batch's records would be skipped and the next ones read twice. Empty
    ranges are left out of the comparison: they hold no record.
    """

    def spans(ranges: Iterable[OffsetRange]) -> list[tuple[str, int, int, int]]:
        return sorted((r.topic, r.partition, r.start, r.end) for r in ranges if r.span)

    if theirs is None or spans(ours) == spans(theirs):
        return None

    def text(ranges: Iterable[OffsetRange]) -> str:
        return " ".join(f"{t}-{p}[{s},{e})" for t, p, s, e in spans(ranges)) or "none"

    return InconsistencyError(
        f"batch {label}: the data table at {table} holds this batch id already, committed "
        f"with other ranges ({text(theirs)} there, {text(ours)} here): another ledger runs "
        "this pipeline into the same table (a second ledger.url, or a SQLite ledger on "
        "another host), and going on would skip or repeat records; run the pipeline from one "
        "ledger only; this batch waits voted, its records not added to the data table"
    )
