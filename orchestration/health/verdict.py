"""One asset check's result, as the checks sensor reports it and a check run yields it: in a
module of its own so that the table checks (orchestration/health/table_checks.py) and the derived
outputs' checks (orchestration/health/derived_checks.py) judge into one type without importing
each other."""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import dagster as dg


@dataclass(frozen=True)
class Verdict:
    """One check's result: pass or fail, one line that says why, and plottable figures."""

    check: str
    asset: dg.AssetKey
    passed: bool
    text: str
    metadata: Mapping[str, Any]

    def evaluation(self) -> dg.AssetCheckEvaluation:
        """As a sensor reports it."""
        return dg.AssetCheckEvaluation(
            asset_key=self.asset,
            check_name=self.check,
            passed=self.passed,
            metadata=dict(self.metadata),
            description=self.text,
        )

    def result(self) -> dg.AssetCheckResult:
        """As a check run reports it."""
        return dg.AssetCheckResult(
            asset_key=self.asset,
            check_name=self.check,
            passed=self.passed,
            metadata=dict(self.metadata),
            description=self.text,
        )
