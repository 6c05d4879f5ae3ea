"""The derived outputs' cost section (bench/derived_cost.py) over figures made up here: the
first round is a warm-up and left out, the medians of the others compared with the pipeline
without derived outputs. `make test`'s smoke run leaves the section out (three pipelines
over the data set each round); this keeps its arithmetic tested."""

from __future__ import annotations

from typing import Any

import pytest

from bench import derived_cost
from bench.product import PHASES


def run(seconds: float, stage: float, commit: float) -> dict[str, Any]:
    phases = {**dict.fromkeys(PHASES, 0.0), "stage": stage, "commit": commit}
    return {"seconds": seconds, "batches": [{"phases": phases}] * 3}


def test_the_warm_up_round_is_left_out_and_each_contender_compared_with_raw() -> None:
    rounds = [
        {
            "raw": run(50, 5, 0.1),
            "derived": run(10, 1.0, 0.1),
            "derived-whole-upsert": run(11, 1, 0.2),
            "derived-spark": run(9, 1, 1),
        },
        {
            "raw": run(20, 2, 0.03),
            "derived": run(23, 2.2, 0.3),
            "derived-whole-upsert": run(24, 2, 0.4),
            "derived-spark": run(30, 3, 0.3),
        },
        {
            "raw": run(22, 2.2, 0.03),
            "derived": run(27, 2.6, 0.3),
            "derived-whole-upsert": run(28, 2, 0.4),
            "derived-spark": run(40, 4, 0.3),
        },
    ]
    summary = derived_cost.summarize(rounds)
    assert summary["raw"]["seconds"] == pytest.approx(21.0)
    assert summary["derived"]["seconds"] == pytest.approx(25.0)
    assert summary["derived"]["stage_per_batch"] == pytest.approx(2.4)
    assert summary["derived_over_raw"] == pytest.approx(25.0 / 21.0)
    assert summary["derived-spark_over_raw"] == pytest.approx(35.0 / 21.0)
    assert summary["derived-whole-upsert_over_raw"] == pytest.approx(26.0 / 21.0)
    # each round's own ratio, then their median: (23/20 + 27/22) / 2
    assert summary["derived_over_raw_per_round"] == pytest.approx((23 / 20 + 27 / 22) / 2)


def test_one_round_is_its_own_figure() -> None:
    rounds = [
        {
            "raw": run(10.0, 1, 0),
            "derived": run(12.0, 1, 0),
            "derived-whole-upsert": run(13.0, 1, 0),
            "derived-spark": run(15, 1, 0),
        }
    ]
    assert derived_cost.summarize(rounds)["derived_over_raw"] == pytest.approx(1.2)
