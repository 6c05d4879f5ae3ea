"""bench/harness.py: the Parquet limit's input is the first routed run's table, and the
bench must not hold it in this process while contenders are measured.

Every contender's peak is this process's resident memory while it runs (bench/memory.py), so
rows the bench itself reads count as the product's: the 2M-record table read into Arrow
inside the first routed contender's window, and held through the whole repetition, put
1.1 GiB in the Python peak of that contender and of every one after it (the 12-02 full
run: a cached 100k run that came first peaked at 564 MiB, every one after the read at 1.6
to 2.1 GiB). No JVM: the run itself is replaced by a small delta-rs table.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from bench import harness, limits, product


def test_the_parquet_limit_s_input_stays_on_disk_until_that_limit_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table_uri = str(tmp_path / "run" / "table")
    config = SimpleNamespace(delta=SimpleNamespace(table_uri=table_uri))
    rows = pa.table({"id": list(range(1, 101))})

    def run_cli_path(_session: Any, _config: Any, **_kwargs: Any) -> dict[str, Any]:
        write_deltalake(table_uri, rows, mode="overwrite")  # each run's table, as a run's
        return {"records": rows.num_rows, "seconds": 1.0}

    read: list[str] = []
    real_rows = limits.table_rows
    monkeypatch.setattr(product, "run_cli_path", run_cli_path)
    monkeypatch.setattr(limits, "table_rows", lambda uri: read.append(uri) or real_rows(uri))
    parquet_input = tmp_path / "parquet-input"

    def contender(routed: bool) -> dict[str, Any]:
        return harness._cli_path(
            None,
            config=config,
            records=rows.num_rows,
            routed=routed,
            empty_batches=0,
            parquet_input=parquet_input,
        )

    contender(routed=False)
    assert not parquet_input.exists()  # the former plan's table is not the input
    assert contender(routed=True)["records"] == 100
    assert read == []  # nothing read inside the contender's window
    contender(routed=True)  # a later routed run: its table is not kept again
    assert read == [] and (tmp_path / "run" / "table").exists()

    figures = harness.parquet_limit(parquet_input, tmp_path / "parquet-limit")
    assert read == [str(parquet_input)] and figures["records"] == 100
