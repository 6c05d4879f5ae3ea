"""The commit ledger: durable batch states in the database ledger/store/schema.py describes.

`LedgerStore` is the one object the coordinator, the jobs and the commands hold. It is the
union of the store's concerns, each a class of its own module on the shared connection
(ledger/store/connection.py): planning under the one in-flight guard (planning.py), the
fenced writes of an attempt (fencing.py), operator decisions (decisions.py), the journal of
operator actions that move no position (actions.py), the rebuild
from the Delta logs (rebuild.py) and the sums the metrics endpoint reads (totals.py). What
stays here are the public reads, each on a connection of its own (the queries themselves in
reads.py, shared with the writes, which read inside their transactions).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import sqlalchemy as sa

from ledger.core.batch import Batch, StagedFile
from ledger.core.decisions import Decision
from ledger.core.protocol import BatchState, Positions
from ledger.store import reads
from ledger.store.actions import ActionJournal
from ledger.store.decisions import DecisionRecording
from ledger.store.fencing import Fencing
from ledger.store.planning import Planning
from ledger.store.rebuild import Rebuilding
from ledger.store.schema import batches_table, files_table, meta_table, ranges_table
from ledger.store.totals import Totals


class LedgerStore(Planning, Fencing, DecisionRecording, ActionJournal, Rebuilding, Totals):
    """Durable batch records for one or many pipelines in one database."""

    def now(self) -> datetime:
        """The ledger database's current time: what every age is measured against, because
        every timestamp in the ledger is the database's too (invariant 17)."""
        with self._read() as conn:
            return reads.db_time(conn)

    def schema_version(self) -> int:
        with self._read() as conn:
            value = conn.execute(
                sa.select(meta_table.c.value).where(meta_table.c.key == "schema_version")
            ).scalar_one()
        return int(value)

    def get(self, app_id: str, batch_id: int) -> Batch | None:
        with self._read() as conn:
            return reads.get(conn, app_id, batch_id)

    def batches(
        self,
        *,
        app_id: str | None = None,
        pipeline: str | None = None,
        states: Iterable[BatchState] | None = None,
        limit: int | None = None,
    ) -> list[Batch]:
        """Batches, newest first."""
        query = sa.select(batches_table).order_by(
            batches_table.c.batch_id.desc(), batches_table.c.app_id
        )
        if app_id is not None:
            query = query.where(batches_table.c.app_id == app_id)
        if pipeline is not None:
            query = query.where(batches_table.c.pipeline == pipeline)
        if states is not None:
            query = query.where(batches_table.c.state.in_([str(s) for s in states]))
        if limit is not None:
            query = query.limit(limit)
        with self._read() as conn:
            return reads.to_batches(conn, conn.execute(query).all())

    def files(self, app_id: str, batch_id: int) -> list[StagedFile]:
        with self._read() as conn:
            rows = conn.execute(
                sa.select(files_table)
                .where(files_table.c.app_id == app_id, files_table.c.batch_id == batch_id)
                .order_by(files_table.c.target, files_table.c.path)
            ).all()
        return [
            StagedFile(r.target, r.path, r.size, r.records, r.modification_time, r.stats)
            for r in rows
        ]

    def newest_with_rows_in(self, app_id: str, target: str) -> int | None:
        """The newest COMMITTED or ACKED batch of `app_id` that voted a file with records
        for output `target`, or None: that output's table must exist and hold it. Read at a
        start (one scan of the application id's votes)."""
        done = [str(BatchState.COMMITTED), str(BatchState.ACKED)]
        query = (
            sa.select(files_table.c.batch_id)
            .join(
                batches_table,
                (batches_table.c.app_id == files_table.c.app_id)
                & (batches_table.c.batch_id == files_table.c.batch_id),
            )
            .where(
                files_table.c.app_id == app_id,
                files_table.c.target == target,
                files_table.c.records > 0,
                batches_table.c.state.in_(done),
            )
            # newest first, from the primary key's end: a quarantine that takes records
            # every few batches is found after a few rows, not a scan of every vote
            .order_by(files_table.c.batch_id.desc())
            .limit(1)
        )
        with self._read() as conn:
            newest = conn.execute(query).scalar()
        return None if newest is None else int(newest)

    def voted_paths(
        self, app_ids: Iterable[str], among: Iterable[str] | None = None
    ) -> set[tuple[str, str]]:
        """(target, path) of every file a vote of these application ids recorded, whatever
        the batch's state now; with `among`, only those paths. For the cleaner, which must
        never delete a voted file (invariant 18)."""
        query = sa.select(files_table.c.target, files_table.c.path).where(
            files_table.c.app_id.in_(list(app_ids))
        )
        if among is not None:
            wanted = sorted(set(among))
            if not wanted:
                return set()
            query = query.where(files_table.c.path.in_(wanted))
        with self._read() as conn:
            return {(r.target, r.path) for r in conn.execute(query)}

    def positions(self, app_id: str) -> Positions:
        """The next offset per partition: the ends of the newest batch that holds a range,
        moved by the operator decisions taken since (ledger/core/decisions.py), with the topic
        id they belong to."""
        with self._read() as conn:
            return reads.positions(conn, app_id)

    def positions_by_topic(self, app_id: str) -> dict[str, Positions]:
        """The next offset per partition of each topic, with each topic's id and the
        decisions that moved it: positions() for a pipeline on several topics."""
        with self._read() as conn:
            return reads.positions_by_topic(conn, app_id)

    def topic_ids_read(self, app_id: str) -> set[str]:
        """Every topic id a batch of `app_id` that was not abandoned was planned on."""
        with self._read() as conn:
            rows = conn.execute(
                sa.select(ranges_table.c.topic_id)
                .distinct()
                .join(
                    batches_table,
                    sa.and_(
                        batches_table.c.app_id == ranges_table.c.app_id,
                        batches_table.c.batch_id == ranges_table.c.batch_id,
                    ),
                )
                .where(
                    ranges_table.c.app_id == app_id,
                    ranges_table.c.topic_id.is_not(None),
                    batches_table.c.state != str(BatchState.ABORTED),
                )
            )
            return {r.topic_id for r in rows}

    def decisions(
        self, *, app_id: str | None = None, pipeline: str | None = None
    ) -> list[Decision]:
        """Recorded operator decisions, oldest first."""
        with self._read() as conn:
            return reads.decisions(conn, app_id=app_id, pipeline=pipeline)

    def last_batch_id(self, app_id: str) -> int | None:
        """The highest batch id in use for `app_id`; the next batch gets a higher one."""
        with self._read() as conn:
            return reads.last_batch_id(conn, app_id)
