"""The scale section's summary and table (bench/scale.py) over figures made up here: the
ratios against Structured Streaming and against the former task-per-partition stage at each
partition count, and a failed contender named. `make test`'s smoke run turns those
contenders off (Structured Streaming is measured in its throughput section already); this
keeps their arithmetic tested."""

from __future__ import annotations

from typing import Any

from bench import scale
from bench.product import PHASES


def run(records: int, seconds: float) -> dict[str, Any]:
    phases = dict.fromkeys(PHASES, 0.1)
    return {
        "records": records,
        "seconds": seconds,
        "batches": [{"records": records // 2, "phases": phases}] * 2,
        "empty_batches": [{"seconds": 0.3, "phases": phases}],
        "cpu_s": {"python": 1.0},
    }


def raw() -> dict[str, Any]:
    settings = scale.ScaleSettings(records=400_000, record_bytes=500, partition_counts=(8, 64))
    return {
        "settings": {**settings.__dict__, "partition_counts": [8, 64]},
        "data": {"partitions": {"8": {"mean_record_bytes": 500.0}}, "slices": [1, 2, 3, 4]},
        "partitions": {"8": run(400_000, 8.0), "64": run(400_000, 10.0)},
        "per_partition_tasks": {"8": run(400_000, 8.0), "64": run(400_000, 20.0)},
        "structured_streaming": {"8": run(400_000, 16.0), "64": {"failed": "query died"}},
        "alone": run(400_000, 4.0),
        "together": {**run(400_000, 3.6), "pipelines": [run(100_000, 3.6)] * 4},
    }


def test_each_count_is_compared_with_structured_streaming_and_the_former_stage() -> None:
    figures = raw()
    summary = scale.summarize(figures)
    rows = {r["partitions"]: r for r in summary["partitions"]}
    assert rows[8]["product_over_structured_streaming"] == 2.0
    assert rows[8]["product_over_per_partition_tasks"] == 1.0
    assert rows[64]["product_over_per_partition_tasks"] == 2.0
    assert "product_over_structured_streaming" not in rows[64]  # its query failed
    text = "\n".join(scale.render(figures, summary))
    assert "product/SS" in text and "2.00x" in text
    assert scale.failures(figures) == [
        "scale/Structured Streaming, 64 partitions: query died",
    ]
