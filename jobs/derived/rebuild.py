"""Building a derived output's Delta table from the raw table: `exactly derived rebuild`.

A derived output is kept by merging each batch's partial (resources/delta/merge.py), so it holds
the batches it saw and nothing before them. An output added to a pipeline that already has
history, or whose table was deleted, would start from the next batch and stay short of its
recomputation for ever: every count low, every key written before it missing. The
publisher therefore refuses to merge into an output that holds no batch of an application
id the raw table holds batches of (jobs/publish/delta_publisher.py `check_not_behind`), before the
vote and again at the commit, and this module is the way out of that refusal.

`rebuild_output` reads ONE snapshot of the raw table (its rows and its application
transactions: the live application id's last batch and its backfill's), recomputes the
output over those rows with the check's own pure functions (jobs/derived/invariants.py: what is
written is what the check compares against), and writes the table in ONE commit that
carries the output's application transactions at the raw snapshot's batch ids. From then on
the output is exactly where the raw table was: the next batch of each application id
merges on top, a batch the snapshot already held is skipped by the output's version check.

The failure cases it handles:
- A pipeline running beside the rebuild: its batches are refused at the output until the
  rebuild commits (the output holds no batch), so nothing is merged into a table the
  rebuild then overwrites; a batch refused at the commit stays PREPARED (it must finish,
  invariant 5) and the recovery publishes it once the rebuild landed, on top of the
  rebuilt table (its id is past the snapshot's, since the raw table is published last).
- A crash during the rebuild: the table is written in one commit, so it either exists with
  its application transactions or the output is as it was; running the rebuild again is
  safe.
- Two rebuilds at once: both commit to the table's next version; one wins, the other
  fails its commit and reports it. Its rerun finds the output holding batches and refuses.
- An output that already holds batches is never rebuilt over: the MERGEs it holds would be
  overwritten by a snapshot older than them only if the raw table lagged, and a rebuild
  that silently rewound an output is the one error this module must not make. Delete the
  table (the pipeline stopped) to rebuild it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from jobs.derived.invariants import latest_records, raw_table_rows, recompute_aggregate
from jobs.publish.restore_check import restore_refusal
from ledger.core.errors import CONFIG_PLACEHOLDER, InconsistencyError, RefusedBatchError
from resources.config.derived_spec import DELETED, AggregateOutput, UpsertOutput
from resources.delta.log import METADATA_KEY
from resources.delta.table import DeltaTarget
from resources.delta.window_dates import with_window_dates
from resources.delta.writer_stats import sound_writer_properties


@dataclass(frozen=True)
class Rebuilt:
    """What a rebuild wrote: the output's table version (None for a PostgreSQL output, which
    has none), the raw table's version it was computed from, the batch id it holds per
    application id, and its row count."""

    name: str
    version: int | None
    raw_version: int
    holds: dict[str, int]
    rows: int


def rebuilt_text(done: Rebuilt) -> str:
    """What a rebuild wrote, in one line for the operator."""
    holds = ", ".join(f"{a} up to batch {v}" for a, v in done.holds.items()) or "no batch"
    where = "" if done.version is None else f" at version {done.version}"
    return (
        f"rebuilt derived output {done.name}: {done.rows} rows{where}, "
        f"from raw table version {done.raw_version} ({holds})"
    )


def behind_reason(
    spec: AggregateOutput | UpsertOutput,
    output: DeltaTarget,
    raw_holds: int | None,
    app_id: str,
) -> str | None:
    """Why merging a batch of `app_id` into the output would leave it short for ever, or
    None: the raw table holds batches of `app_id` (up to `raw_holds`, its application
    transaction version; None for none) and the output none (its table is new or was
    deleted) or fewer (it was out of the config while batches committed)."""
    held = output.transaction_version(spec.app_id(app_id))
    rebuild = f"`exactly derived rebuild -c {CONFIG_PLACEHOLDER} {spec.name}`"
    return behind_sentence(
        f"derived output {spec.name} ({output.uri})",
        app_id,
        held,
        raw_holds,
        f"build it from the raw table first: {rebuild}",
        f"delete its table and build it from the raw table: {rebuild}",
    )


def behind_sentence(
    output: str,
    app_id: str,
    held: int | None,
    raw_holds: int | None,
    build: str,
    rebuild: str,
) -> str | None:
    """Pure: why `output`, holding batch `held` of `app_id` (None: none), is behind the
    raw table holding `raw_holds` (None: none), or None when it is not.

    Every output is published before the raw table (invariant 12), so an output that was
    in the config for every batch holds at least the raw table's last one. One that holds
    none is new or lost its table (`build` says the way out); one that holds fewer was out
    of the config while batches committed, or was restored from an older copy, and is
    missing their rows (`rebuild`). Either, merged on, would stay short for ever while its
    own version or compare-and-set reads as in order."""
    if raw_holds is None or (held is not None and held >= raw_holds):
        return None
    if held is None:
        return (
            f"{output} holds no batch of {app_id}, but the raw table holds batches up to "
            f"{raw_holds}: the output is new on a pipeline with history, or its table was "
            f"deleted, and merging from here would leave it short for ever; {build} "
            "(batches wait until then, nothing is lost)"
        )
    return (
        f"{output} holds batches of {app_id} up to {held}, but the raw table holds batches "
        f"up to {raw_holds}: the output was out of the config while those committed (or was "
        f"restored from an older copy), and merging from here would leave it short of them "
        f"for ever; {rebuild} (batches wait until then, nothing is lost)"
    )


def rebuild_output(
    spec: AggregateOutput | UpsertOutput,
    output: DeltaTarget,
    raw: DeltaTarget,
    app_ids: Sequence[str],
    *,
    topic_id_now: Callable[[str], str | None] | None = None,
    empty: bool = False,
    decided: Mapping[str, str] | None = None,
) -> Rebuilt:
    """Write the output's table from one snapshot of the raw table (module docstring); with
    `empty`, with no row but the same application transactions: the output then holds only
    what the pipeline publishes from now on, the way an upsert output starts again after its
    topic was re-created (docs/derived-tables.md "Topic re-created").

    An upsert is refused a full rebuild over a raw table that holds records of another
    incarnation of a topic than `topic_id_now` says Kafka has now (the commits' topic ids,
    invariant 10): the re-created topic's offsets restart at 0, so ordering every raw row by
    (partition, offset) would let the old topic's records win over the new one's.

    `decided`: who asked for the rebuild and why (`decided_by`, `reason`), kept in the
    commit's metadata, so the output's own log says who rebuilt it."""
    held = {a: v for a in app_ids if (v := output.transaction_version(spec.app_id(a))) is not None}
    if held:
        holds = ", ".join(f"{a} up to batch {v}" for a, v in held.items())
        raise InconsistencyError(
            f"derived output {spec.name} ({output.uri}) already holds batches ({holds}); a "
            "rebuild only builds an output that holds none. To rebuild it anyway, stop the "
            "pipeline and delete the table first"
        )
    snapshot, holds = raw_snapshot(spec.name, raw, app_ids)
    raw_version = snapshot.version()
    if empty:
        rows = snapshot.to_pyarrow_dataset().schema.empty_table()
    else:
        if isinstance(spec, UpsertOutput):
            _check_one_incarnation(spec, raw, app_ids, topic_id_now or (lambda _topic: None))
        rows = snapshot.to_pyarrow_table()
    table = _recomputed(rows, spec)
    # an aggregate partitioned by its window's date is written so, as its MERGEs write it
    partitions = spec.partition_by if isinstance(spec, AggregateOutput) else []
    table = with_window_dates(table, partitions)
    properties = CommitProperties(
        app_transactions=[Transaction(spec.app_id(a), v) for a, v in holds.items()],
        custom_metadata={
            METADATA_KEY: {
                "rebuild": spec.name,
                "raw_version": raw_version,
                "holds": holds,
                **(decided or {}),
            }
        },
        max_commit_retries=0,
    )
    existing = output.load()
    write_deltalake(
        output.uri,
        table,
        mode="overwrite" if existing is not None else "error",
        schema_mode="overwrite" if existing is not None else None,
        partition_by=[c.name for c in partitions] or None,
        storage_options=output.storage_options or None,
        writer_properties=sound_writer_properties(table.schema),
        commit_properties=properties,
    )
    after = output.load()
    assert after is not None
    return Rebuilt(spec.name, after.version(), raw_version, holds, table.num_rows)


def raw_snapshot(
    name: str, raw: DeltaTarget, app_ids: Sequence[str]
) -> tuple[DeltaTable, dict[str, int]]:
    """The raw table's snapshot a rebuild of output `name` reads, and the batch it holds of
    each of `app_ids` (those it holds any of); refused while there is no raw table, and
    while it is restored behind the pipeline (jobs/publish/restore_check.py): its
    transaction versions then claim batches whose rows it lacks, and the output would be
    written short of them, holding them by its own versions for good."""
    snapshot = raw.load()
    if snapshot is None:
        raise RefusedBatchError(
            f"derived output {name}: the raw table {raw.uri} does not exist yet, so "
            "there is nothing to build from; the output fills from the first batch"
        )
    if (restored := restore_refusal(raw, app_ids)) is not None:
        raise RefusedBatchError(f"derived output {name} cannot be built: {restored}")
    holds = {a: v for a in app_ids if (v := snapshot.transaction_version(a)) is not None}
    return snapshot, holds


def _check_one_incarnation(
    spec: UpsertOutput,
    raw: DeltaTarget,
    app_ids: Sequence[str],
    topic_id_now: Callable[[str], str | None],
) -> None:
    """Every topic's rows in the raw table come from one incarnation of it, the one Kafka
    has now (`topic_id_now(topic)`; None when it is gone). The commits record one
    `topic_id` (a batch on one topic) or `topic_ids` (on several)."""
    seen: dict[str, set[str]] = {}
    for app_id in app_ids:
        for entry in raw.committed_batches(app_id):
            ids = dict(entry.get("topic_ids") or {})
            if not ids and entry.get("topic_id"):
                ids = {str(r["topic"]): entry["topic_id"] for r in entry.get("ranges") or ()}
            for topic, topic_id in ids.items():
                if topic_id:
                    seen.setdefault(topic, set()).add(str(topic_id))
    for topic in sorted(seen):
        now = topic_id_now(topic)
        others = seen[topic] - {now} if now is not None else set()
        if len(seen[topic]) > 1 or others:
            raise InconsistencyError(
                f"derived output {spec.name}: the raw table holds records of incarnation(s) "
                f"{', '.join(sorted(others or seen[topic]))} of topic {topic}, now "
                f"{now or 'gone'} (it was re-created), and the offsets of each start at 0; "
                "an upsert rebuilt over all of them would let the old topic's records win. "
                "Start it empty instead (`exactly derived rebuild --empty`): it then holds "
                "the new topic's records from the next batch on"
            )


def _recomputed(rows: pa.Table, spec: AggregateOutput | UpsertOutput) -> pa.Table:
    """The output's rows over the raw rows, in the schema the stage's partials have (every
    column nullable, as Spark reads Parquet back; an upsert's `_deleted` never null, as the
    publisher's schema check expects), so the next batch's MERGE finds the table it would
    have made itself."""
    if isinstance(spec, AggregateOutput):
        table = recompute_aggregate(rows, spec)
    else:
        table = latest_records(raw_table_rows(rows), spec)
    upsert = isinstance(spec, UpsertOutput)
    fields = [f.with_nullable(not (upsert and f.name == DELETED)) for f in table.schema]
    return table.cast(pa.schema(fields))
