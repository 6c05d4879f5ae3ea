"""Building a PostgreSQL output from the raw table: `exactly derived rebuild` for an output
of kind `postgres`, as jobs/derived/rebuild.py is for a Delta one (its docstring says why an
output behind the raw table must be built before anything merges into it).

One snapshot of the raw table (its rows and the batch it holds of each application id) is
recomputed with the check's own function (jobs/derived/invariants.py `recompute_aggregate`),
typed as the stage's partials are (Spark's analysis of the partial over the raw table's
schema: a sum of decimal(p, s) is decimal(p + 10, s), a count a bigint), and written with
the state rows at the snapshot's batch ids in one SQL transaction
(resources/postgres/rebuilt.py). From then on the output is where the raw table was: the
next batch of each application id applies on top by the compare-and-set, and its partial
fits the columns the rebuild created.

The failure cases it handles, beyond resources/postgres/rebuilt.py's:
- A pipeline running beside the rebuild with the output in its config: its batches are
  refused before the vote while the output holds no batch (jobs/publish/delta_publisher.py
  `check_not_behind`), so none is applied to a table the rebuild then writes.
- A process still running an older config without the output, committing batches past
  the snapshot: the rebuilt output then holds fewer batches than the raw table, and the
  next batch with the output is refused ("holds batches up to"), never applied short.
- No raw table yet: refused; the output fills from the first batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import pyarrow as pa

from jobs.derived.invariants import aggregate_columns, recompute_aggregate
from jobs.derived.rebuild import Rebuilt, raw_snapshot
from resources.delta.table import DeltaTarget
from resources.postgres.rebuilt import write_rebuilt
from resources.postgres.target import PostgresTarget


def rebuild_postgres(
    pg: PostgresTarget,
    raw: DeltaTarget,
    app_ids: Sequence[str],
    partial_schema: Callable[[pa.Schema], pa.Schema],
    *,
    empty: bool = False,
    decided: Mapping[str, str] | None = None,
) -> Rebuilt:
    """Write PostgreSQL output `pg` from one snapshot of the raw table (module docstring);
    with `empty`, no row but the same batch ids. `partial_schema` gives the partial's
    Arrow schema over the raw table's (jobs/stage/staged_partials.py
    `aggregate_arrow_schema`). `decided` (who, why) is kept on the state rows."""
    spec = pg.spec
    snapshot, holds = raw_snapshot(spec.name, raw, app_ids)
    raw_version = snapshot.version()
    dataset = snapshot.to_pyarrow_dataset()
    kind = partial_schema(dataset.schema)
    # only the columns the aggregate reads: a raw row's payload is most of its bytes
    read = [c for c in dataset.schema.names if c in aggregate_columns(spec)]
    rows = dataset.schema.empty_table() if empty else dataset.to_table(columns=read)
    table = recompute_aggregate(rows, spec).select(kind.names).cast(kind)  # type: ignore[arg-type]
    info = {"rebuild": spec.name, "raw_version": raw_version, **(decided or {})}
    write_rebuilt(
        pg.engine,
        spec,
        table,
        [spec.app_id(a) for a in app_ids],
        {spec.app_id(a): v for a, v in holds.items()},
        info,
    )
    return Rebuilt(spec.name, None, raw_version, holds, table.num_rows)
