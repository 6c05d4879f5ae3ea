"""resources/delta/upsert_pruning.py: the rows an upsert's MERGE is spared are exactly the
ones it would not have changed, and a table merged with pruning ends the same as one merged
without it (real delta-rs tables on disk)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from resources.config.derived_spec import UpsertOutput, parse_output
from resources.delta import merge, upsert_pruning
from resources.delta.merge import merge_upsert
from resources.delta.table import DeltaTarget
from resources.delta.upsert_pruning import pruned_partial, unchanged_rows_dropped

APP = "pageviews.derived.users"

Row = tuple[str | None, str, int, int]  # user, topic, partition, offset


def rows(found: list[Row], name: str = "x") -> pa.Table:
    return pa.table(
        {
            "user": pa.array([r[0] for r in found], pa.string()),
            "name": pa.array([f"{name}{i}" for i in range(len(found))], pa.string()),
            "_kafka_topic": pa.array([r[1] for r in found], pa.string()),
            "_kafka_partition": pa.array([r[2] for r in found], pa.int32()),
            "_kafka_offset": pa.array([r[3] for r in found], pa.int64()),
            "_deleted": pa.array([False] * len(found), pa.bool_()),
        }
    )


def users(partial: pa.Table) -> list[str | None]:
    return partial.column("user").to_pylist()


def test_a_row_is_dropped_only_where_the_table_holds_its_key_at_or_after_it() -> None:
    table = rows(
        [("later", "t", 0, 50), ("earlier", "t", 0, 5), ("same", "t", 1, 7),
         ("higher-partition", "t", 2, 1), ("tie-topic", "b", 1, 7), (None, "t", 0, 99)]
    )  # fmt: skip
    partial = rows(
        [("later", "t", 0, 20), ("earlier", "t", 0, 20), ("same", "t", 1, 7),
         ("higher-partition", "t", 1, 900), ("tie-topic", "c", 1, 7), (None, "t", 0, 1),
         ("new", "t", 0, 3)]
    )  # fmt: skip
    kept = unchanged_rows_dropped(partial, table, ["user"], with_topic=True)
    # a null key is the MERGE's to decide (null-safe), as is a key the table lacks
    assert users(kept) == ["earlier", "tie-topic", None, "new"]
    # without the topic, equal coordinates are not later: the tie goes too
    kept = unchanged_rows_dropped(partial, table, ["user"], with_topic=False)
    assert users(kept) == ["earlier", None, "new"]


def test_a_key_the_table_holds_twice_keeps_its_row_if_it_is_later_than_either() -> None:
    """A table written by someone else may hold a key twice; the MERGE updates each row
    the batch's record is later than, so the record stays unless it is later than none."""
    table = rows([("twice", "t", 0, 50), ("twice", "t", 0, 5), ("both", "t", 0, 60)])
    table = pa.concat_tables([table, rows([("both", "t", 0, 70)])])
    partial = rows([("twice", "t", 0, 20), ("both", "t", 0, 20)])
    assert users(unchanged_rows_dropped(partial, table, ["user"], with_topic=True)) == ["twice"]


def _later(a: Row, b: Row) -> bool:
    return (a[2], a[3], a[1]) > (b[2], b[3], b[1])


def test_pruning_matches_the_merge_predicate_on_random_rows() -> None:
    """Brute force: a row is dropped iff its key (non-null) is in the table, and at rows
    it comes after none of, as merge.py `_newer` orders them."""
    rng = random.Random(31)
    for _ in range(200):
        keys = [f"k{i}" for i in range(rng.randint(1, 12))] + [None]
        table = [
            (k, rng.choice("ab"), rng.randint(0, 2), rng.randint(0, 5))
            for k in rng.sample(keys, rng.randint(0, len(keys)))
        ]
        partial = [
            (k, rng.choice("ab"), rng.randint(0, 2), rng.randint(0, 5))
            for k in rng.sample(keys, rng.randint(0, len(keys)))
        ]
        table += [r for r in table if rng.random() < 0.2]  # some keys twice
        table = [(r[0], r[1], r[2], r[3] + rng.randint(0, 1)) for r in table]
        theirs: dict[str | None, list[Row]] = {}
        for r in table:
            if r[0] is not None:
                theirs.setdefault(r[0], []).append(r)
        expected = [
            r[0] for r in partial if r[0] not in theirs or any(_later(r, t) for t in theirs[r[0]])
        ]
        kept = unchanged_rows_dropped(rows(partial), rows(table), ["user"], with_topic=True)
        assert users(kept) == expected


def upsert_spec(uri: str) -> UpsertOutput:
    spec = parse_output({"kind": "upsert", "name": "users", "table_uri": uri, "key": ["user"]})
    assert isinstance(spec, UpsertOutput)
    return spec


def _merged(uri: str, batches: list[pa.Table]) -> list[dict[str, Any]]:
    target, spec = DeltaTarget(uri), upsert_spec(uri)
    for batch_id, partial in enumerate(batches, start=1):
        merge_upsert(target, spec, partial, app_id=APP, batch_id=batch_id)
    assert DeltaTable(uri).transaction_version(APP) == len(batches)
    found = DeltaTable(uri).to_pyarrow_table().to_pylist()
    return sorted(found, key=lambda r: (r["user"] is not None, r["user"]))


def test_a_table_merged_with_pruning_ends_as_one_merged_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mixed batches (some keys newer, some older, new keys, a null key, a batch that
    changes nothing) through the real MERGE: the same rows either way, and the pruned
    MERGE did get fewer rows to apply."""
    rng = random.Random(7)
    keys = [f"u{i}" for i in range(40)] + [None]
    batches = [
        rows(
            [(k, "t", rng.randint(0, 3), rng.randint(0, 100)) for k in rng.sample(keys, 25)],
            name=f"b{b}-",
        )
        for b in range(5)
    ]
    batches.append(batches[-1])  # applied again under a new batch id: nothing is newer
    seen: list[int] = []
    pruned = upsert_pruning.unchanged_rows_dropped

    def counted(partial: pa.Table, *args: Any, **kwargs: Any) -> pa.Table:
        kept = pruned(partial, *args, **kwargs)
        seen.append(partial.num_rows - kept.num_rows)
        return kept

    monkeypatch.setattr(upsert_pruning, "unchanged_rows_dropped", counted)
    with_pruning = _merged(str(tmp_path / "pruned"), batches)
    assert sum(seen) > 0 and seen[-1] == 25  # the repeated batch is pruned whole
    monkeypatch.setattr(merge, "pruned_partial", lambda table, uri, partial, *a: partial)
    without = _merged(str(tmp_path / "whole"), batches)
    assert with_pruning == without


def test_a_table_much_larger_than_the_partial_is_not_read(tmp_path: Path) -> None:
    uri = str(tmp_path / "users")
    big = rows([(f"u{i}", "t", 0, i) for i in range(50)])
    _merged(uri, [big])
    stale = rows([("u1", "t", 0, 0)])
    table = DeltaTable(uri)
    # 50 table rows for 1 partial row: past the bound, the partial goes whole
    assert pruned_partial(table, uri, stale, ["user"], True).num_rows == 1
    within = rows([(f"u{i}", "t", 0, 0) for i in range(13)])
    assert pruned_partial(table, uri, within, ["user"], True).num_rows == 0


def test_a_table_whose_files_cannot_be_read_gives_the_merge_the_whole_partial(
    tmp_path: Path,
) -> None:
    """A live file deleted behind the log: pruning cannot read it and leaves the partial
    whole, so the MERGE meets the missing file itself, as it would without pruning."""
    uri = str(tmp_path / "users")
    _merged(uri, [rows([(f"u{i}", "t", 0, 10) for i in range(4)])])
    stale = rows([(f"u{i}", "t", 0, 0) for i in range(4)])
    table = DeltaTable(uri)
    assert pruned_partial(table, uri, stale, ["user"], True).num_rows == 0
    for path in table.file_uris():
        Path(path.removeprefix("file://")).unlink()
    assert pruned_partial(table, uri, stale, ["user"], True).num_rows == 4
