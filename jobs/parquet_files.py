"""Describe staged Parquet files for the prepare vote: size, record count, Delta statistics.

Each footer is read once, here; the vote stores the result and the commit reuses it, so
publishing never touches the data files again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from ledger.batch import StagedFile
from resources import storage
from resources.delta import delta_stats


def describe(
    folder: str, table_root: str, target: str, columns: Sequence[str] | None = None
) -> list[StagedFile]:
    """The Parquet files in one attempt's own staging folder, as the vote records them.

    With `columns`, the statistics cover those columns only: a file may hold columns its
    table does not have (jobs/stage.py: `routed`), and Delta's statistics name the table's.
    """
    files = []
    for info in storage.list_data_files(folder):
        meta = storage.read_parquet_metadata(info.uri)
        files.append(
            StagedFile(
                target=target,
                path=storage.relative(info.uri, table_root),
                size=info.size,
                records=meta.num_rows,
                modification_time=info.modification_time_ms,
                stats=json.dumps(delta_stats(meta, columns), separators=(",", ":")),
            )
        )
    return files
