"""Publishing a batch to a derived PostgreSQL output, and reading back which batch it holds.

Its idempotence is not a Delta app transaction but a compare-and-set on the batch id in one
SQL transaction (resources/postgres/apply.py); the previous batch that compare-and-set
needs is the data table's app-transaction version, read here. The publisher
(jobs/publish/delta_publisher.py) calls these in its config order with the Delta outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from jobs.derived.rebuild import behind_sentence
from ledger.core.batch import Batch
from ledger.core.errors import CONFIG_PLACEHOLDER, InconsistencyError
from resources.delta.table import DeltaTarget
from resources.postgres.apply import PostgresOutcome, apply_partial
from resources.postgres.state import held_state
from resources.postgres.tables import STATE_TABLE
from resources.postgres.target import PostgresTarget


def held_state_of(pg: PostgresTarget, app_id: str) -> tuple[int | None, dict[str, Any] | None]:
    """The batch PostgreSQL output `pg` holds of the pipeline's `app_id`, and its commit
    info (resources/postgres/state.py `held_state`)."""
    return held_state(pg.engine, pg.spec, pg.spec.app_id(app_id))


def rebuild_command(pg: PostgresTarget) -> str:
    """The command that builds `pg` from the raw table (jobs/derived/postgres_rebuild.py)."""
    return f"`exactly derived rebuild -c {CONFIG_PLACEHOLDER} {pg.spec.name}`"


def postgres_behind(pg: PostgresTarget, app_id: str, raw_holds: int | None) -> str | None:
    """Why PostgreSQL output `pg` is behind the raw table on the pipeline's `app_id`
    (jobs/derived/rebuild.py `behind_sentence`), or None. Asked before the vote, so such a
    batch is refused before anything is held, where its compare-and-set would refuse it
    only at the commit ("out of order"), the batch held voted."""
    return behind_sentence(
        f"postgres output {pg.spec.name} ({pg.spec.table})",
        app_id,
        pg.held_batch(pg.spec.app_id(app_id)),
        raw_holds,
        f"build it from the raw table first: {rebuild_command(pg)}",
        f"empty its table, delete its rows of {STATE_TABLE} (output = '{pg.spec.table}') "
        f"and build it from the raw table: {rebuild_command(pg)}",
    )


def postgres_outcome(outcome: PostgresOutcome) -> dict[str, Any]:
    """What a PostgreSQL output's transaction did, as `merge_outcome` says a MERGE's: the
    state's batch id stands for the version."""
    return {
        "applied": outcome.applied,
        "held_batch_id": outcome.held_batch_id,
        "seconds": round(outcome.seconds, 4),
        "tries": outcome.tries,
        "rows_upserted": int(outcome.metrics.get("rows_upserted", 0) or 0),
    }


def add_postgres_batches(
    postgres: Mapping[str, PostgresTarget],
    app_id: str,
    table_version: int | None,
    merged: dict[int, dict[str, Any]],
) -> None:
    """Add to `merged` the batch a PostgreSQL output holds past the data table.

    Its state row keeps only the last batch applied, with that batch's commit info; that
    is enough: an output is applied before the data table, batch after batch in order,
    so it is at most one batch past it, and a batch at or below the table's version is
    complete whatever the other logs say. A batch the output holds past the table is
    entered incomplete (invariant 12: re-staged and finished, never forgotten).
    """
    for target, pg in postgres.items():
        held, meta = held_state_of(pg, app_id)
        if held is None or (table_version is not None and held <= table_version):
            continue
        if meta is None or "ranges" not in meta:
            raise InconsistencyError(
                f"{pg.where} holds batch {app_id}/{held}, past the data table, but its "
                "state row has no commit info to rebuild the batch from (invariant 7)"
            )
        entry = {**meta, "app_id": app_id, "batch_id": held}
        found = merged.setdefault(held, {**entry, "outputs": []})
        found["outputs"].append(target)
        found.setdefault("table_version", None)


def apply_postgres(
    batch: Batch,
    pg: PostgresTarget,
    table: DeltaTarget,
    read_partial: Callable[[], pa.Table],
    metadata: Mapping[str, Any],
) -> PostgresOutcome:
    """Apply the batch's voted partial (`read_partial`, read only when it applies) to
    PostgreSQL output `pg`, by the compare-and-set on the batch id
    (resources/postgres/apply.py), which needs the previous committed batch of the app
    id. It is read from the data `table`, not passed in (the Publisher protocol
    stays as it is): the data table is published last, batch after batch, so while it
    does not hold this batch its app-transaction version IS the last batch of the app
    id committed whole (invariant 5: one batch in flight per app id, in order).

    - first batch of the app id: the table has no version (None); the output's state
      has none either, and the batch applies;
    - ABORTED ids leave gaps (batch 7 after 4): the table says 4, the state holds 4;
    - a re-drive after the data table already holds the batch (a crash after the table
      commit; a racing committer that finished first): every output before the table
      holds it, so nothing is applied; the output must hold it, or it was reset behind
      the pipeline's back (a restored backup, a dropped state row) and that is refused
      loudly rather than applied against the wrong previous id;
    - a lost ledger: nothing here reads the ledger; a rebuilt batch the output holds
      past the table (`add_postgres_batches`) is re-driven and skipped by the state's id;
    - a backfill (fill) batch: its app id (`<pipeline>.backfill`) has its own version
      in the data table and its own state row (resources/config/derived_spec.py `app_id`), so
      live and backfill ids never meet; a replace is refused before it is planned;
    - a racing committer that read the table's version before the other finished: the
      row lock serialises them and the state's id (at or past the batch) skips it.

    An output whose state does not hold the table's previous batch (a state row
    deleted, a PostgreSQL output added to a pipeline with history) is refused by the
    compare-and-set (InconsistencyError): the batch stays PREPARED, the pipeline stops
    and alerts; it is never skipped.
    """
    app_id = pg.spec.app_id(batch.app_id)
    previous = table.transaction_version(batch.app_id)
    if previous is not None and previous >= batch.batch_id:
        held = pg.held_batch(app_id)
        if held is None or held < batch.batch_id:
            raise InconsistencyError(
                f"{pg.where}: the data table holds batch {batch.label} but the output "
                f"holds {'none' if held is None else held} of {app_id}: it was reset "
                "behind the pipeline (invariant 12): restore its table and its "
                f"{STATE_TABLE} rows from a copy that holds this batch, or empty both and "
                f"build it from the raw table, which holds it: {rebuild_command(pg)}"
            )
        return PostgresOutcome(applied=False, held_batch_id=held, tries=0, seconds=0.0)
    partial = read_partial()
    return apply_partial(pg.engine, pg.spec, app_id, batch.batch_id, previous, partial, metadata)
