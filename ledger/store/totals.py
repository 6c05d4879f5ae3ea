"""What a pipeline's ledger adds up to, for the metrics endpoint (jobs/metrics): batches by
state, the rows and bytes its published batches wrote to each output, the records they
read, and the batches published after a given one.

Aggregates in SQL rather than over loaded batches: a scrape every 15 s must not read a
ledger of millions of batches into memory. Published means COMMITTED or ACKED: a batch
abandoned, or voted and not yet committed, wrote nothing any reader sees.
"""

from __future__ import annotations

import sqlalchemy as sa

from ledger.core.batch import Batch
from ledger.core.protocol import PUBLISHED
from ledger.store import reads
from ledger.store.connection import LedgerConnection
from ledger.store.schema import batches_table, files_table, ranges_table

_PUBLISHED = [str(s) for s in PUBLISHED]


def _of_batch(table: sa.Table) -> sa.Join:
    """`table`'s rows joined to the batch they belong to."""
    b = batches_table.c
    return table.join(
        batches_table, (table.c.app_id == b.app_id) & (table.c.batch_id == b.batch_id)
    )


class Totals(LedgerConnection):
    """Sums and counts over one pipeline's batches."""

    def state_counts(self, pipeline: str) -> dict[str, int]:
        """How many of the pipeline's batches are in each state, live and backfill."""
        b = batches_table.c
        query = sa.select(b.state, sa.func.count()).where(b.pipeline == pipeline).group_by(b.state)
        with self._read() as conn:
            return {str(state): int(n) for state, n in conn.execute(query).all()}

    def output_totals(self, pipeline: str) -> dict[str, tuple[int, int]]:
        """Per output (`table`, `quarantine`, `derived:<name>`): (rows, bytes) in the files
        the pipeline's published batches wrote. A replace writes its rows again, so rows
        here are rows written, not rows held."""
        f, b = files_table.c, batches_table.c
        query = (
            sa.select(f.target, sa.func.sum(f.records), sa.func.sum(f.size))
            .select_from(_of_batch(files_table))
            .where(b.pipeline == pipeline, b.state.in_(_PUBLISHED))
            .group_by(f.target)
        )
        with self._read() as conn:
            found = conn.execute(query).all()
        return {str(t): (int(rows or 0), int(size or 0)) for t, rows, size in found}

    def records_read_total(self, pipeline: str) -> int:
        """Kafka records the pipeline's published batches read (their ranges' spans)."""
        r, b = ranges_table.c, batches_table.c
        query = (
            sa.select(sa.func.sum(r.end_offset - r.start_offset))
            .select_from(_of_batch(ranges_table))
            .where(b.pipeline == pipeline, b.state.in_(_PUBLISHED))
        )
        with self._read() as conn:
            return int(conn.execute(query).scalar() or 0)

    def published_after(self, app_id: str, batch_id: int, limit: int = 1000) -> list[Batch]:
        """The app's published batches with an id over `batch_id`, oldest first."""
        b = batches_table.c
        query = (
            sa.select(batches_table)
            .where(b.app_id == app_id, b.batch_id > batch_id, b.state.in_(_PUBLISHED))
            .order_by(b.batch_id)
            .limit(limit)
        )
        with self._read() as conn:
            return reads.to_batches(conn, conn.execute(query).all())
