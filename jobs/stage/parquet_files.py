"""Describe staged Parquet files for the prepare vote: size, record count, Delta statistics.

Each footer is read once, here, and a file's float columns once if it has any (a footer's
min/max may leave NaN out: resources/delta/stats.py `_json_value`); the vote stores the result and
the commit reuses it, so publishing never touches the data files again.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import pyarrow as pa

from ledger.core.batch import StagedFile
from resources.delta.stats import delta_stats, float_columns, nan_columns, stats_json
from resources.object_storage import storage


def describe(
    folder: str, table_root: str, target: str, columns: Sequence[str] | None = None
) -> list[StagedFile]:
    """The Parquet files in one attempt's own staging folder, as the vote records them.

    With `columns`, the statistics cover those columns only: a file may hold columns its
    table does not have (jobs/stage/routing.py: `routed`), and Delta's statistics name the table's.
    """
    files = []
    for info in storage.list_data_files(folder):
        meta = storage.read_parquet_metadata(info.uri)
        floats = float_columns(meta, columns)
        nan = nan_columns(storage.read_parquet(info.uri, floats)) if floats else set()
        files.append(
            StagedFile(
                target=target,
                path=storage.relative(info.uri, table_root),
                size=info.size,
                records=meta.num_rows,
                modification_time=info.modification_time_ms,
                stats=stats_json(delta_stats(meta, columns, nan)),
            )
        )
    return files


#: The key of the Spark schema Spark stores in every Parquet footer it writes.
SPARK_SCHEMA_KEY = b"org.apache.spark.sql.parquet.row.metadata"


def write_as_spark(rows: pa.Table, folder: str, spark_schema_json: str, name: str = "") -> str:
    """Write `rows` as one Parquet file into `folder`, as a file Spark wrote: Spark's
    schema in the footer (so Spark reads its types back as they were, a timestamp as an
    instant) and a `part-` name no other writer of the folder takes. The file's URI."""
    name = name or f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    uri = storage.join(folder, name)
    storage.write_parquet(rows.replace_schema_metadata({SPARK_SCHEMA_KEY: spark_schema_json}), uri)
    return uri
