"""The asset check of each derived output: `<name>_matches_recomputation`, the derived
invariant (docs/derived-tables.md) on the derived table's asset: the table a MERGE of
partials made batch after batch holds what one recomputation over the raw table's rows
gives (jobs/derived/invariants.py, pyarrow only: no JVM in a check).

The two tables must be read at versions that hold the same batches. A batch is published
to every derived output before the raw table (invariant 12), so a derived table read after
the raw table may be ahead of it by the batch in flight: the raw table is read first, at a
version and its application transactions (the live application id and its backfill's),
then the derived table's versions are walked back from its latest until its own
application transactions (`spec.app_id(...)`) are the raw table's. A derived table behind
the raw table breaks invariant 12 and fails the check without a recomputation.

`judge_derived` and `match_version` are pure; `derived_verdicts` reads the tables with
delta-rs. The verdicts join the table checks' (orchestration/health/table_checks.py), so the checks
sensor alerts on them once and resolves them once, and the UI runs them with the others.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import dagster as dg
import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from jobs.derived.invariants import (
    aggregate_differences,
    live_rows,
    raw_table_rows,
    recompute_aggregate,
    recompute_latest,
    upsert_differences,
)
from jobs.wiring.pipeline import Pipeline
from ledger.core.backfill import backfill_app_id
from ledger.core.batch import Batch
from ledger.core.layout import OFFSET, PARTITION
from ledger.core.protocol import PUBLISHED
from orchestration.assets import derived_key
from orchestration.health.verdict import Verdict
from resources.config.derived_spec import DELETED, AggregateOutput, UpsertOutput
from resources.config.pipeline_config import PipelineConfig
from resources.delta.table import DeltaTarget
from resources.postgres.target import PostgresTarget, read_output

#: The application transactions a pair of versions must agree on: (live, backfill) batch ids.
Apps = tuple[int | None, int | None]
#: How many versions of a derived table the walk reads back before giving up without a
#: verdict: one batch in flight per application id, plus the compactions between them.
MAX_WALK = 50
#: How many differing groups a failure names.
NAMED = 3


def check_name(output: AggregateOutput | UpsertOutput) -> str:
    """Unique across the pipeline (output names are), as the checks sensor keys its alerts
    by check name."""
    return f"{output.name}_matches_recomputation"


def derived_check_specs(config: PipelineConfig) -> list[dg.AssetCheckSpec]:
    return [
        dg.AssetCheckSpec(
            check_name(output),
            asset=derived_key(config.pipeline, output.name),
            description=(
                "The derived table equals its recomputation from the raw table's rows, both "
                "read at versions holding the same batches (the derived invariant; behind the "
                "raw table breaks invariant 12)"
            ),
        )
        for output in config.derived
    ]


def _behind(have: int | None, want: int | None) -> bool:
    return (-1 if have is None else have) < (-1 if want is None else want)


def match_version(
    raw_apps: Apps, latest: int, apps_at: Callable[[int], Apps]
) -> tuple[int | None, str | None]:
    """Pure but for `apps_at`: walk the derived table's versions back from `latest` to the
    one whose application transactions are `raw_apps`.

    Returns (version, None) when found, (None, why) when the derived table is behind the
    raw table at some version on the way (a failure: invariant 12), and (None, None) when
    no verdict can be given (more than MAX_WALK versions ahead, or none left)."""
    for version in range(latest, max(latest - MAX_WALK, -1), -1):
        have = apps_at(version)
        if have == raw_apps:
            return version, None
        if _behind(have[0], raw_apps[0]) or _behind(have[1], raw_apps[1]):
            return None, (
                f"the derived table at version {version} holds live batch {have[0]} and "
                f"backfill batch {have[1]}, behind the raw table's {raw_apps[0]} and "
                f"{raw_apps[1]}: every output is published before the raw table (invariant 12), "
                "so a committed batch's changes are missing from it"
            )
    return None, None


def unfinished_ahead(
    apps: tuple[str, str],
    raw_apps: Apps,
    held: Apps,
    ledger: Callable[[str, int], Batch | None],
    finishing: Callable[[Batch], bool],
) -> str | None:
    """Pure but for `ledger` (a batch by app id and id) and `finishing` (whether its owner
    may still be running): why the output holds a batch the raw table does not while nobody
    finishes it, or None.

    Every output is published before the raw table (invariant 12), so an output may hold,
    per application id, the one batch in flight that the raw table does not hold yet; the
    version walk then compares the version before it. That is no disagreement while the
    batch's owner is finishing it. It is one when nobody is: a run killed between the
    outputs' commits, or a ledger lost since (the batch is then unknown to it). The check
    must fail then, else the output reads right at its walked-back version and wrong at
    its latest, silently, until some start finishes the batch.
    """
    for app_id, have, raw in zip(apps, held, raw_apps, strict=True):
        if have is None or not _behind(raw, have):
            continue
        batch = ledger(app_id, have)
        if batch is None:
            return (
                f"holds batch {app_id}/{have}, which the raw table does not and the ledger "
                "does not know (a lost ledger?): the next start (`exactly recover`) rebuilds "
                "the ledger from the outputs' logs and finishes the batch"
            )
        if batch.state in PUBLISHED or finishing(batch):
            continue  # committed since the raw table was read, or its owner is finishing it
        return (
            f"holds batch {app_id}/{have}, which the raw table does not, and nobody is "
            f"finishing it ({batch.state}, its owner {batch.owner} gone): the re-drive sensor "
            "or `exactly recover` finishes it"
        )
    return None


def judge_derived(
    pipeline: str,
    spec: AggregateOutput | UpsertOutput,
    expected: pa.Table,
    actual: pa.Table,
    raw_version: int,
    derived_version: int,
) -> Verdict:
    """Pure: the derived table's rows (`actual`, as read) against their recomputation from
    the raw rows (`expected`), with the figures compared, or the first differing groups."""
    if not isinstance(spec, UpsertOutput):  # an aggregate, in Delta or PostgreSQL
        unit = "groups"
        problems = aggregate_differences(expected, actual, spec)
    else:
        unit = "keys"
        actual = live_rows(actual)
        problems = upsert_differences(expected, actual, spec)
    metadata: dict[str, Any] = {
        f"recomputed_{unit}": expected.num_rows,
        f"derived_{unit}": actual.num_rows,
        f"differing_{unit}": len(problems),
        "raw_version": raw_version,
        "derived_version": derived_version,
    }
    asset = derived_key(pipeline, spec.name)
    where = (
        f"{spec.name} at version {derived_version}, recomputed from the raw table at version "
        f"{raw_version}"
    )
    if not problems:
        return Verdict(
            check_name(spec),
            asset,
            True,
            f"{where}: all {expected.num_rows} {unit} equal",
            metadata,
        )
    more = f" (and {len(problems) - NAMED} more)" if len(problems) > NAMED else ""
    return Verdict(
        check_name(spec),
        asset,
        False,
        f"{where}: {len(problems)} of {max(expected.num_rows, actual.num_rows)} {unit} differ: "
        f"{'; '.join(problems[:NAMED])}{more}; the table was changed outside exactly, or a "
        "batch was applied twice or not at all: rebuild the output from the raw table",
        metadata,
    )


def _open(target: DeltaTarget) -> DeltaTable | None:
    try:
        return DeltaTable(target.uri, storage_options=target.storage_options or None)
    except TableNotFoundError:
        return None


def _raw_columns(spec: AggregateOutput | UpsertOutput, derived: Sequence[str]) -> list[str]:
    """Only what the recomputation reads: the raw table can be wide."""
    if not isinstance(spec, UpsertOutput):  # an aggregate, in Delta or PostgreSQL
        wanted = [*spec.group_by, *(m.column for m in spec.measures if m.column)]
        if spec.window is not None:
            wanted.append(spec.window.column)
        # `_deleted`: an upsert's tombstones in the raw table are no events to count
        return [*wanted, "_error", DELETED]
    return [*spec.key, *derived, PARTITION, OFFSET, DELETED, "value", "_error"]


def derived_verdict(
    pipeline: Pipeline, spec: AggregateOutput | UpsertOutput, target: DeltaTarget
) -> Verdict | None:
    """The output's verdict now, or None while the tables cannot be compared (either does
    not exist yet, or the derived table is too far ahead to walk back to the raw table)."""
    config = pipeline.config
    name = config.pipeline
    raw = _open(pipeline.publisher.table)
    derived = _open(target)
    if raw is None or derived is None:
        return None
    apps = (config.app_id, backfill_app_id(name))
    raw_version = raw.version()
    raw_apps: Apps = (raw.transaction_version(apps[0]), raw.transaction_version(apps[1]))

    def apps_at(version: int) -> Apps:
        derived.load_as_version(version)
        return (
            derived.transaction_version(spec.app_id(apps[0])),
            derived.transaction_version(spec.app_id(apps[1])),
        )

    stuck = unfinished_ahead(
        apps, raw_apps, apps_at(derived.version()), pipeline.store.get, pipeline.live.may_be_alive
    )
    if stuck is not None:
        return _failed_unrecounted(name, spec, stuck, raw_version)
    version, behind = match_version(raw_apps, derived.version(), apps_at)
    if behind is not None:
        return _failed_unrecounted(name, spec, behind, raw_version)
    if version is None:
        return None
    derived.load_as_version(version)
    actual = derived.to_pyarrow_table()
    dataset = raw.to_pyarrow_dataset()
    present = set(dataset.schema.names)
    columns = list(
        dict.fromkeys(c for c in _raw_columns(spec, actual.column_names) if c in present)
    )
    rows = raw_table_rows(dataset.to_table(columns=columns))
    if isinstance(spec, AggregateOutput):
        expected = recompute_aggregate(rows, spec)
    else:
        expected = recompute_latest(rows, spec)
        # the coordinates that order the rows are compared only if the table keeps them
        unkept = [c for c in (PARTITION, OFFSET) if c not in actual.column_names]
        expected = expected.drop_columns([c for c in unkept if c in expected.column_names])
    return judge_derived(name, spec, expected, actual, raw_version, version)


def _failed_unrecounted(pipeline: str, spec: Any, why: str, raw_version: int) -> Verdict:
    """A failure found before any recount: the output behind the raw table, or ahead of
    it by a batch nobody finishes."""
    return Verdict(
        check_name(spec),
        derived_key(pipeline, spec.name),
        False,
        f"{spec.name}: {why} (raw table at version {raw_version})",
        {"raw_version": raw_version},
    )


def postgres_verdict(pipeline: Pipeline, pg: PostgresTarget) -> Verdict | None:
    """A PostgreSQL output's verdict now, or None while they cannot be compared.

    A database table has no versions to walk back: the table's rows and the state's batch
    ids are read in one transaction (`read_output`), after the raw table's snapshot, and
    compared only when the state holds exactly the raw snapshot's last batch of each app id
    (live and backfill). One past it is a batch between its commits (the output is
    published before the raw table): no verdict, the next check compares. Behind it breaks
    invariant 12, a failure."""
    config = pipeline.config
    name = config.pipeline
    spec = pg.spec
    raw = _open(pipeline.publisher.table)
    if raw is None:
        return None
    apps = (config.app_id, backfill_app_id(name))
    raw_version = raw.version()
    raw_apps: Apps = (raw.transaction_version(apps[0]), raw.transaction_version(apps[1]))
    actual, held = read_output(pg.engine, spec, [spec.app_id(a) for a in apps])
    behind = [a for a, h, r in zip(apps, held, raw_apps, strict=True) if _behind(h, r)]
    if behind:
        return Verdict(
            check_name(spec),
            derived_key(name, spec.name),
            False,
            f"{spec.name}: holds batch(es) {list(held)} of {list(apps)}, behind the raw table's "
            f"{list(raw_apps)} (raw table at version {raw_version}; invariant 12)",
            {"raw_version": raw_version},
        )
    stuck = unfinished_ahead(
        apps, raw_apps, tuple(held), pipeline.store.get, pipeline.live.may_be_alive
    )
    if stuck is not None:
        return _failed_unrecounted(name, spec, stuck, raw_version)
    if tuple(held) != raw_apps:
        return None
    dataset = raw.to_pyarrow_dataset()
    present = set(dataset.schema.names)
    columns = list(dict.fromkeys(c for c in _raw_columns(spec, []) if c in present))
    expected = recompute_aggregate(dataset.to_table(columns=columns), spec)  # type: ignore[arg-type]
    return judge_derived(name, spec, expected, actual, raw_version, held[0] or 0)


def derived_verdicts(pipeline: Pipeline, log: Callable[[str], None]) -> list[Verdict]:
    """Every derived output's verdict; one that cannot be given is left out, and logged."""
    found = []
    outputs: list[tuple[Any, Callable[[], Verdict | None]]] = [
        (spec, partial(derived_verdict, pipeline, spec, target))
        for spec, target in pipeline.publisher.derived
    ]
    outputs += [
        (pg.spec, partial(postgres_verdict, pipeline, pg))
        for pg in pipeline.publisher.postgres.values()
    ]
    for spec, verdict_now in outputs:
        try:
            verdict = verdict_now()
        except Exception as exc:  # a store unreachable, a version's log cleaned
            log(f"{check_name(spec)}: could not compare the tables: {exc}")
            continue
        if verdict is None:
            log(
                f"{check_name(spec)}: no verdict: a table does not exist yet, or the derived "
                f"table is over {MAX_WALK} versions ahead of the raw table"
            )
        else:
            found.append(verdict)
    return found
