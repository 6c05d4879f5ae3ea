"""Every column type a data engineer's topic carries, end to end against the real broker,
Spark and Delta: JSON records parsed into typed columns by a Spark transform, staged, voted
and committed, then read back through delta-rs and delta-spark and compared with what was
produced; the Delta log's statistics checked against each file's rows, as written and as
delta-rs and delta-spark parse them; and an aggregate's decimal sums checked exactly.

Issue 28 found the first contact with a decimal column crashing the batch (pyarrow could not
read the statistics of the INT32/INT64 decimals Spark writes), and no test writing one.
"""

from __future__ import annotations

import base64
import json
import math
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal, localcontext
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
import yaml
from deltalake import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from jobs.derived.invariants import aggregate_differences, recompute_aggregate
from jobs.wiring.pipeline import build
from resources.config.loading import load_config
from resources.delta.compaction import Compaction
from resources.delta.table import DeltaTarget
from tests.fixtures.pipeline import assert_exactly_once
from tests.fixtures.spark_conf import compiled_session

TRANSFORM = "tests.transforms:every_type"
NAN, INF = float("nan"), float("inf")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
D = Decimal


@pytest.fixture(scope="module")
def spark(spark: Any) -> Any:
    """The worker's session with code generation on, as the product's sessions have it (the
    suite's pipelines interpret their queries: tests/fixtures/spark_conf.py): every column type
    goes through the compiled code paths."""
    return compiled_session(spark)


def _ts(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


#: The records as produced (JSON) and as the table must hold them. A field left out of a
#: record is null; the record with id 4 has nothing but its id, id 5 says null for every
#: field. Decimals reach the JSON as numbers with every digit (`_to_json`).
RECORDS: list[dict[str, Any]] = [
    {
        "id": 0,
        "dec9": D("12.50"),
        "dec18": D("1234.5678"),
        "dec38": D("0.0000000001"),
        "tiny": 1,
        "small": 2,
        "medium": 3,
        "big": 4,
        "f32": 1.5,
        "f64": 2.25,
        "f64_finite": 0.5,
        "flag": True,
        "day": date(2024, 2, 29),
        "ts": _ts("2024-02-29T12:00:00.123456+05:30"),
        "ts_ntz": datetime(2024, 2, 29, 12, 0, 0, 123456),
        "blob": b"\x00\x01\xfe\xff",
        "text": "naïve café",
        "tags": ["a", "b"],
        "amounts": {"eur": D("1.50"), "usd": D("-2.00")},
        "point": {
            "x": 1.5,
            "label": "é",
            "day": date(2024, 1, 1),
            "amount": D("12.34"),
            "dims": [1, 2],
        },
    },
    {
        "id": 1,
        "dec9": D("9999999.99"),
        "dec18": D("99999999999999.9999"),
        "dec38": D("123456789012345678901234567.0123456789"),
        "tiny": 127,
        "small": 32767,
        "medium": 2147483647,
        "big": 9223372036854775807,
        "f32": NAN,
        "f64": INF,
        "f64_finite": 1.7976931348623157e308,
        "flag": True,
        "day": date(9999, 12, 31),
        "ts": _ts("9999-12-31T23:59:59.999999+00:00"),
        "ts_ntz": datetime(9999, 12, 31, 23, 59, 59, 999999),
        "blob": b"\xff\xff\xff",
        "text": "東京 🚀 שלום",
        "tags": [],
        "amounts": {},
        "point": {
            "x": -0.5,
            "label": "zz",
            "day": date(9999, 12, 31),
            "amount": D("9999999999.99"),
            "dims": [],
        },
    },
    {
        "id": 2,
        "dec9": D("-9999999.99"),
        "dec18": D("-99999999999999.9999"),
        "dec38": D("-9999999999999999999999999999.9999999999"),
        "tiny": -128,
        "small": -32768,
        "medium": -2147483648,
        "big": -9223372036854775808,
        "f32": -INF,
        "f64": NAN,
        "f64_finite": -2.5e-300,
        "flag": False,
        "day": date(1900, 1, 1),
        "ts": _ts("1900-01-01T00:00:00+00:00"),
        "ts_ntz": datetime(1900, 1, 1),
        "blob": b"",
        "text": "",
        "tags": [None, "ü"],
        "amounts": {"ß": None},
        "point": {
            "x": None,
            "label": None,
            "day": date(1969, 12, 31),
            "amount": D("-0.01"),
            "dims": None,
        },
    },
    {
        "id": 3,
        "dec9": D("-0.01"),
        "dec18": D("0.0001"),
        "dec38": D("5.5"),
        "tiny": 0,
        "small": -1,
        "medium": 0,
        "big": -1,
        "f32": INF,
        "f64": -INF,
        "f64_finite": 0.0,
        "flag": False,
        "day": date(1969, 12, 31),
        "ts": _ts("1969-12-31T23:59:59.999999+00:00"),
        "ts_ntz": datetime(1969, 7, 20, 20, 17, 40, 500000),
        "blob": b"\x80",
        "text": 'e\u0301 tab\there\nnewline "quoted" \\ back',
        "tags": ["x"],
        "amounts": {"k": D("0.10")},
        "point": None,
    },
    {"id": 4},
    {
        "id": 5,
        **dict.fromkeys(
            [
                "dec9",
                "dec18",
                "dec38",
                "tiny",
                "small",
                "medium",
                "big",
                "f32",
                "f64",
                "f64_finite",
                "flag",
                "day",
                "ts",
                "ts_ntz",
                "blob",
                "text",
                "tags",
                "amounts",
                "point",
            ]
        ),
    },
    *(
        {
            "id": i,
            "dec9": D(i * 123457) / 100,
            "dec18": D(i * 98765432109) / 10_000,
            "dec38": D(i * 10**20 + 7) / 10**10,
            "tiny": i,
            "small": i * 100,
            "medium": i * 100_000,
            "big": i * 10**15,
            "f32": i + 0.25,
            "f64": i / 4,
            "f64_finite": i * 1.5,
            "flag": i % 2 == 0,
            "day": date(1970, 1, 1) + timedelta(days=i * 1000),
            "ts": EPOCH + timedelta(days=i * 999, microseconds=i),
            "ts_ntz": datetime(2000, 1, 1) + timedelta(hours=i, microseconds=i),
            "blob": bytes([i]) * i,
            "text": f"row {i} ✓",
            "tags": [f"t{i}"] * (i % 3),
            "amounts": {f"a{i}": D(i) / 4},
            "point": {
                "x": float(i),
                "label": f"p{i}",
                "day": None,
                "amount": D(i),
                "dims": [i, None],
            },
        }
        for i in range(6, 16)
    ),
]
COLUMNS = [c for c in RECORDS[5] if c != "id"]
#: The columns whose min/max the log must carry: every orderable type, struct fields too.
ORDERABLE = [
    "dec9",
    "dec18",
    "dec38",
    "tiny",
    "small",
    "medium",
    "big",
    "f64_finite",
    "day",
    "ts",
    "ts_ntz",
    "text",
    "point.x",
    "point.label",
    "point.day",
    "point.amount",
]
#: Columns holding NaN or an infinity: no min/max (JSON has no number for them, and a max
#: that leaves NaN out would let data skipping drop the rows a `> max` filter matches).
NOT_FINITE = ["f32", "f64"]
#: Columns with a null count in the log: every column that is one Parquet column.
COUNTED = [*ORDERABLE, *NOT_FINITE, "flag", "blob"]
#: Columns with min/max in the log where the file's values allow (all finite, for floats).
BOUNDED = [*ORDERABLE, *NOT_FINITE]
DECIMALS = {"dec9", "dec18", "dec38", "point.amount"}
TIMESTAMPS = {"ts", "ts_ntz"}


def _to_json(record: dict[str, Any]) -> bytes:
    """The record as a producer writes it: decimals as JSON numbers with all their digits,
    NaN and infinities as the non-standard tokens Spark's JSON reader accepts, binary as
    base64, dates and timestamps as ISO 8601 text."""

    def encode(value: Any) -> Any:
        if isinstance(value, Decimal):
            return f"__decimal__{value}__"
        if isinstance(value, bytes):
            return base64.b64encode(value).decode("ascii")
        if isinstance(value, date):
            return value.isoformat()
        raise TypeError(type(value))

    text = json.dumps(record, default=encode, ensure_ascii=False)
    return re.sub(r'"__decimal__([-0-9.E+]+)__"', r"\1", text).encode()


def _get(row: dict[str, Any], column: str) -> Any:
    value: Any = row
    for part in column.split("."):
        value = None if value is None else value.get(part)
    return value


def _canon(value: Any) -> Any:
    """A value comparable with ==: NaN as a string (NaN != NaN), timestamps as microseconds
    since the epoch (naive ones too: the table holds no zone for them), maps as dicts,
    Spark's Rows and bytearrays as dicts and bytes."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, datetime):
        naive = value.tzinfo is None
        since = value - (EPOCH.replace(tzinfo=None) if naive else EPOCH)
        return ("ntz" if naive else "utc", since // timedelta(microseconds=1))
    if isinstance(value, bytearray):
        return bytes(value)
    if hasattr(value, "asDict"):
        value = value.asDict()
    if isinstance(value, dict):
        return {k: _canon(v) for k, v in value.items()}
    if isinstance(value, list) and value and all(isinstance(v, tuple) for v in value):
        return {k: _canon(v) for k, v in value}  # a map, as pyarrow lists it
    if isinstance(value, list):
        return [_canon(v) for v in value]
    return value


def _expected_rows() -> list[dict[str, Any]]:
    return [{"id": r["id"], **{c: _canon(r.get(c)) for c in COLUMNS}} for r in RECORDS]


def _spark_rows(df: DataFrame) -> list[dict[str, Any]]:
    """Rows as delta-spark reads them; a zoned timestamp read as its microseconds (Spark
    hands back naive datetimes in the Python process's zone) and marked as `_canon` does."""
    selected = df.select("id", *(F.unix_micros(c).alias(c) if c == "ts" else c for c in COLUMNS))
    rows = []
    for row in selected.collect():
        canon = _canon_row(row.asDict())
        if canon["ts"] is not None:
            canon["ts"] = ("utc", canon["ts"])
        rows.append(canon)
    return rows


def _canon_row(row: dict[str, Any]) -> dict[str, Any]:
    """`_canon` of every column; an empty map, which pyarrow lists as [], as {}."""
    canon = {k: _canon(v) for k, v in row.items()}
    if canon["amounts"] == []:
        canon["amounts"] = {}
    return canon


def _committed_adds(table_uri: str) -> Iterator[dict[str, Any]]:
    """The add actions of the table's live files, as the log's JSON commits hold them."""
    adds: dict[str, dict[str, Any]] = {}
    for commit in sorted(Path(table_uri, "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                adds[action["add"]["path"]] = action["add"]
            elif "remove" in action:
                adds.pop(action["remove"]["path"], None)
    yield from adds.values()


def _file_truth(
    table_uri: str, path: str
) -> tuple[int, dict[str, Any], dict[str, Any], dict[str, int]]:
    """Row count, min, max and null count per checked column, from the file's own rows."""
    rows = pq.read_table(Path(table_uri, path), columns=COLUMNS).to_pylist()
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for column in COUNTED:
        values = [_get(r, column) for r in rows]
        present = [v for v in values if v is not None]
        nulls[column] = len(values) - len(present)
        finite = all(not isinstance(v, float) or math.isfinite(v) for v in present)
        if column in BOUNDED and present and finite:
            mins[column], maxs[column] = min(present), max(present)
    return len(rows), mins, maxs, nulls


def _not_json(token: str) -> Any:
    """Python's json reads NaN and Infinity; JSON (and so other readers of the log) does not."""
    raise ValueError(f"{token} is not JSON")


def _nested(stats: dict[str, Any], column: str) -> Any:
    return _get(stats, column) if stats is not None else None


def _stat_value(column: str, text_value: Any) -> Any:
    """A min/max of the log's JSON as the Python value it stands for."""
    if column in TIMESTAMPS and text_value is not None:
        parsed = datetime.fromisoformat(text_value)
        if column == "ts":
            assert parsed.tzinfo is not None, f"{column}: {text_value!r} names no zone"
            return parsed.astimezone(UTC)
        assert parsed.tzinfo is None, f"{column}: {text_value!r} is timestamp_ntz, no zone"
        return parsed
    if column in {"day", "point.day"} and text_value is not None:
        return date.fromisoformat(text_value)
    return text_value


#: The money aggregate per flag, as a Delta or a PostgreSQL output.
MONEY = {
    "group_by": ["flag"],
    "measures": [
        {"name": "rows", "fn": "count"},
        {"name": "dec9_sum", "fn": "sum", "column": "dec9"},
        {"name": "dec18_sum", "fn": "sum", "column": "dec18"},
        {"name": "dec38_sum", "fn": "sum", "column": "dec38"},
        {"name": "dec9_max", "fn": "max", "column": "dec9"},
    ],
}


def _run_records(config: Any, spark: Any, kafka_client: Any) -> None:
    """RECORDS and one malformed record through the pipeline until it has caught up."""
    kafka_client.produce(config.kafka.topic, [*(_to_json(r) for r in RECORDS), b"{bad"])
    tpc = build(config, spark_factory=lambda: spark)
    tpc.recover_and_commit()
    while tpc.run_batch() is not None:
        pass


def _assert_money(rows: list[dict[str, Any]]) -> None:
    """The money aggregate's rows equal Python's exact Decimal sums per flag."""
    got = {r["flag"]: r for r in rows}
    assert set(got) == {True, False, None}
    for flag, row in got.items():
        group = [r for r in RECORDS if r.get("flag") is flag]
        assert row["rows"] == len(group)
        for column in ("dec9", "dec18", "dec38"):
            values = [r[column] for r in group if r.get(column) is not None]
            with localcontext(prec=80):  # the default 28 digits would round a decimal(38)
                want = sum(values, Decimal(0)) if values else None
            assert row[f"{column}_sum"] == want, (flag, column)
        values = [r["dec9"] for r in group if r.get("dec9") is not None]
        assert row["dec9_max"] == (max(values) if values else None)


def _typed_pipeline(kafka_broker: str, kafka_client: Any, spark: Any, root: Path) -> Any:
    """A pipeline of RECORDS (and one malformed record) with the money aggregate, in two
    batches (two files, and a MERGE that adds the second batch's sums to the first's), run
    until it has caught up. Its config as tests/fixtures/pipeline.py `pipeline_factory`
    writes one, for a module-scoped fixture (that factory is per test)."""
    topic = f"every-type-{uuid.uuid4().hex[:8]}"
    kafka_client.create_topic(topic, 1)
    money = {"kind": "aggregate", "name": "money", "table_uri": str(root / "money"), **MONEY}
    doc = {
        "pipeline": "every_type",
        "kafka": {
            "bootstrap_servers": kafka_broker,
            "topic": topic,
            "starting_offsets": "earliest",
        },
        "delta": {"table_uri": str(root / "table"), "quarantine_uri": str(root / "quarantine")},
        "ledger": {"url": f"sqlite:///{root / 'ledger.db'}"},
        "spark": {"master": "local[2]"},
        "batch": {"max_records_per_partition": 10, "lease_seconds": 30},
        "transform": TRANSFORM,
        "derived": [money],
    }
    path = root / "every_type.yaml"
    path.write_text(yaml.safe_dump(doc))
    config = load_config(path)
    _run_records(config, spark, kafka_client)
    return config


@pytest.fixture(scope="module")
def typed_table(
    kafka_broker: str, kafka_client: Any, spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> Any:
    """The pipeline of `_typed_pipeline`, shared by the tests that only read its tables: a
    run is most of this file's time."""
    return _typed_pipeline(kafka_broker, kafka_client, spark, tmp_path_factory.mktemp("typed"))


@pytest.fixture(scope="module")
def compacted_table(
    kafka_broker: str, kafka_client: Any, spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Any, Compaction | None]:
    """Another such pipeline, its table then compacted by delta-rs's OPTIMIZE (which writes
    the new file's statistics itself); with what the compaction did."""
    root = tmp_path_factory.mktemp("compacted")
    config = _typed_pipeline(kafka_broker, kafka_client, spark, root)
    return config, DeltaTarget(config.delta.table_uri).compact()


def _assert_reads_back(uri: str, spark: Any) -> None:
    """The table's rows equal RECORDS through delta-rs and through delta-spark."""
    expected = sorted(_expected_rows(), key=lambda r: r["id"])
    via_rs = DeltaTable(uri).to_pyarrow_table(columns=["id", *COLUMNS]).to_pylist()
    got_rs = sorted((_canon_row(r) for r in via_rs), key=lambda r: r["id"])
    for want, got in zip(expected, got_rs, strict=True):
        assert got == want, f"delta-rs, record {want['id']}"
    got_spark = sorted(_spark_rows(spark.read.format("delta").load(uri)), key=lambda r: r["id"])
    for want, got in zip(expected, got_spark, strict=True):
        assert got == want, f"delta-spark, record {want['id']}"


def test_every_type_reads_back_equal_through_delta_rs_and_delta_spark(
    typed_table: Any, spark: Any, kafka_client: Any
) -> None:
    table_rows, quarantined = assert_exactly_once(typed_table, kafka_client)
    assert (table_rows, quarantined) == (len(RECORDS), 1)
    uri = typed_table.delta.table_uri
    _assert_reads_back(uri, spark)
    schema = pa.schema(DeltaTable(uri).schema().to_arrow())
    kinds = {f.name: str(f.type) for f in schema}
    assert kinds["dec9"] == "decimal128(9, 2)"
    assert kinds["dec18"] == "decimal128(18, 4)"
    assert kinds["dec38"] == "decimal128(38, 10)"
    assert (kinds["tiny"], kinds["small"]) == ("int8", "int16")
    assert kinds["ts_ntz"] == "timestamp[us]" and kinds["ts"].startswith("timestamp[us, tz=")


def _log_stats_problems(uri: str, complete: bool = True) -> list[str]:
    """How the live files' statistics in the log differ from each file's own rows: every
    min/max (of the orderable columns, and of the float columns where every value is
    finite) and every null count, strict JSON.

    `complete` (what the stage writes): every bound and count there, and exact. Otherwise
    (what another writer may write): a missing bound or count is no problem (statistics
    are optional), and a bound need only be sound, the min at or below the rows' and the
    max at or above; a timestamp's max may be cut to the millisecond, as delta-spark writes
    it and reads it back (its data skipping adds the millisecond)."""
    adds = list(_committed_adds(uri))
    assert adds
    problems = []
    for add in adds:
        records, mins, maxs, nulls = _file_truth(uri, add["path"])
        raw = add["stats"]
        stats = json.loads(raw, parse_constant=_not_json)
        exact = json.loads(raw, parse_float=Decimal, parse_constant=_not_json)
        if stats["numRecords"] != records:
            problems.append(f"{add['path']}: numRecords {stats['numRecords']}, rows {records}")
        for column in COUNTED:
            count = _nested(stats.get("nullCount"), column)
            if (complete or count is not None) and count != nulls[column]:
                problems.append(f"{add['path']}: nullCount.{column} {count}, {nulls[column]}")
        for column in BOUNDED:
            source = exact if column in DECIMALS else stats
            lo = _stat_value(column, _nested(source.get("minValues"), column))
            hi = _stat_value(column, _nested(source.get("maxValues"), column))
            want_lo, want_hi = mins.get(column), maxs.get(column)
            if complete:
                wrong = (lo, hi) != (want_lo, want_hi)
            else:
                if hi is not None and column in TIMESTAMPS:
                    try:
                        hi += timedelta(milliseconds=1)
                    except OverflowError:
                        hi = None  # the last millisecond of year 9999: no row is above it
                wrong = (lo is not None and want_lo is not None and lo > want_lo) or (
                    hi is not None and want_hi is not None and hi < want_hi
                )
            if wrong:
                problems.append(
                    f"{add['path']}: {column} bounds {lo!r}..{hi!r}, rows {want_lo!r}..{want_hi!r}"
                )
    return problems


def test_every_orderable_column_has_min_max_and_null_counts_in_the_delta_log(
    typed_table: Any,
) -> None:
    assert len(list(_committed_adds(typed_table.delta.table_uri))) == 2
    problems = _log_stats_problems(typed_table.delta.table_uri)
    assert not problems, "\n".join(problems)


def test_compaction_keeps_every_type(
    compacted_table: tuple[Any, Compaction | None], spark: Any
) -> None:
    """delta-rs's OPTIMIZE rewrites the files: the rows must read back as they were."""
    config, done = compacted_table
    assert done is not None and (done.files_removed, done.files_added) == (2, 1)
    _assert_reads_back(config.delta.table_uri, spark)


def test_compaction_writes_sound_statistics(
    compacted_table: tuple[Any, Compaction | None],
) -> None:
    """The statistics OPTIMIZE writes for its new file, which delta-rs computes itself (not
    the stage's `delta_stats`): any bound it writes must hold the file's rows. delta-rs
    1.6.6 writes a wide decimal's as a float (decimal(38,10)'s minimum came out above the
    rows'), so compaction writes none for those columns (resources/delta/compaction.py)."""
    config, _ = compacted_table
    problems = _log_stats_problems(config.delta.table_uri, complete=False)
    assert not problems, "\n".join(problems)


def test_delta_rs_parses_the_logs_statistics(typed_table: Any) -> None:
    """delta-rs reads the statistics into the columns' own types (a decimal as a decimal, a
    timestamp_ntz without a zone): what its file pruning compares with."""
    uri = typed_table.delta.table_uri
    actions = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()
    assert actions
    for action in actions:
        records, mins, maxs, nulls = _file_truth(uri, action["path"])
        assert action["num_records"] == records
        for column in ORDERABLE:
            got = (action.get(f"min.{column}"), action.get(f"max.{column}"))
            assert got == (mins.get(column), maxs.get(column)), column
        for column in COUNTED:
            assert action.get(f"null_count.{column}") == nulls[column], column


def test_delta_spark_parses_the_logs_statistics(typed_table: Any, spark: Any) -> None:
    """delta-spark's own parse of each file's statistics (the snapshot's `withStats`, which
    its data skipping reads): every orderable column's min/max and every null count."""
    uri = typed_table.delta.table_uri
    log = spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, uri)
    files = DataFrame(log.unsafeVolatileSnapshot().withStats(), spark)

    def stat(kind: str, column: str) -> Any:
        value = F.col(f"stats.{kind}.{column}")
        micros = column == "ts" and kind != "nullCount"
        return (F.unix_micros(value) if micros else value).alias(f"{kind}.{column}")

    picked = files.select(
        "path",
        F.col("stats.numRecords").alias("numRecords"),
        *(stat(kind, c) for kind in ("minValues", "maxValues") for c in ORDERABLE),
        *(stat("nullCount", c) for c in COUNTED),
    ).collect()
    assert picked
    for row in picked:
        got = row.asDict()
        records, mins, maxs, nulls = _file_truth(uri, got["path"])
        assert got["numRecords"] == records
        for column in ORDERABLE:
            lo, hi = mins.get(column), maxs.get(column)
            if column == "ts":
                lo, hi = (None if v is None else _canon(v)[1] for v in (lo, hi))
            assert (got[f"minValues.{column}"], got[f"maxValues.{column}"]) == (lo, hi), column
        for column in COUNTED:
            assert got[f"nullCount.{column}"] == nulls[column], column


def test_an_aggregate_sums_decimals_exactly(typed_table: Any) -> None:
    """Sums of decimal(9,2), (18,4) and (38,10) per group, compared with Python's exact
    Decimal sums: a float anywhere on the way would lose the cents of the large values."""
    (output,) = typed_table.derived
    table = DeltaTable(output.table_uri).to_pyarrow_table()
    for name in ("dec9_sum", "dec18_sum", "dec38_sum", "dec9_max"):
        assert pa.types.is_decimal(table.schema.field(name).type), name
    _assert_money(table.to_pylist())
    # and the asset check's recomputation from the raw rows (pyarrow's decimal sums) agrees
    raw = DeltaTable(typed_table.delta.table_uri).to_pyarrow_table()
    assert aggregate_differences(recompute_aggregate(raw, output), table, output) == []


def test_the_aggregates_decimal_statistics_hold_its_rows(typed_table: Any) -> None:
    """The derived table's files are written by delta-rs's MERGE, which (1.6.6) writes a
    wide decimal's bounds as a float: a sum of decimal(38,10) bounded above its smallest
    value, so a reader filtering on it would skip a file holding matching rows. Every
    decimal bound in the log must hold the file's rows (or be absent)."""
    (output,) = typed_table.derived
    problems = []
    for add in _committed_adds(output.table_uri):
        rows = pq.read_table(Path(output.table_uri, add["path"]))
        stats = json.loads(add["stats"], parse_float=Decimal, parse_constant=_not_json)
        for field in rows.schema:
            if not pa.types.is_decimal(field.type):
                continue
            present = [v for v in rows.column(field.name).to_pylist() if v is not None]
            lo = (stats.get("minValues") or {}).get(field.name)
            hi = (stats.get("maxValues") or {}).get(field.name)
            if present and lo is not None and Decimal(lo) > min(present):
                problems.append(f"{add['path']}: {field.name} min {lo} > {min(present)}")
            if present and hi is not None and Decimal(hi) < max(present):
                problems.append(f"{add['path']}: {field.name} max {hi} < {max(present)}")
    assert not problems, "\n".join(problems)


def test_a_postgres_output_sums_decimals_exactly(
    spark: Any, kafka_client: Any, pipeline_factory: Any, postgres_url: str
) -> None:
    """The same sums in a PostgreSQL output: numeric columns, Decimals both ways."""
    table = f"money_{uuid.uuid4().hex[:12]}"
    money = {"kind": "postgres", "name": "money", "url": postgres_url, "table": table, **MONEY}
    config = pipeline_factory(1, transform=TRANSFORM, derived=[money])
    _run_records(config, spark, kafka_client)
    engine = sa.create_engine(postgres_url)
    try:
        with engine.connect() as conn:
            rows = [dict(r._mapping) for r in conn.execute(sa.text(f'SELECT * FROM "{table}"'))]
    finally:
        engine.dispose()
    _assert_money(rows)


#: Orders as issue 28's first contact had them: `amount` a decimal(12,2) JSON number.
ORDERS: list[dict[str, Any]] = [
    {
        "order_id": 1,
        "amount": D("12.34"),
        "total": D("123456789012345678901234567.0123456789"),
        "placed": date(9999, 12, 31),
        "at": _ts("9999-12-31T23:59:59.999999+00:00"),
        "local_at": datetime(9999, 12, 31, 23, 59, 59, 999999),
        "rate": NAN,
    },
    {
        "order_id": 2,
        "amount": D("-9999999999.99"),
        "total": D("-0.0000000001"),
        "placed": date(1900, 1, 1),
        "at": _ts("1969-12-31T23:59:59.999999+00:00"),
        "local_at": datetime(1900, 1, 1),
        "rate": INF,
    },
    {
        "order_id": 3,
        "amount": D("9999999999.99"),
        "total": D("0"),
        "placed": date(1970, 1, 1),
        "at": _ts("2026-11-26T12:00:00.5+01:00"),
        "local_at": datetime(2026, 11, 26, 12),
        "rate": 0.25,
    },
    {"order_id": 4},
]


def _order_json(order: dict[str, Any]) -> bytes:
    """An order as JSON: timestamps with their zone (or none, for `local_at`)."""
    return _to_json({k: v.isoformat() if isinstance(v, datetime) else v for k, v in order.items()})


def test_a_pandas_transform_lands_decimals_and_far_timestamps_exactly(
    spark: Any, kafka_client: Any, pipeline_factory: Any
) -> None:
    """The same types through a pandas transform (Arrow batches both ways, in Spark's
    Python workers): decimals, dates and timestamps up to year 9999, infinity (a NaN lands
    as null), and the log's decimal statistics for the `amount` column that crashed the
    first batch."""
    config = pipeline_factory(1, transform="tests.pandas_transforms:orders")
    kafka_client.produce(config.kafka.topic, [_order_json(o) for o in ORDERS])
    tpc = build(config, spark_factory=lambda: spark)
    tpc.recover_and_commit()
    while tpc.run_batch() is not None:
        pass
    columns = ["amount", "total", "placed", "at", "local_at", "rate"]
    want = {o["order_id"]: {c: _canon(o.get(c)) for c in columns} for o in ORDERS}
    # pandas has one marker for NaN and null, and pyspark turns a pandas NaN into a null:
    # a pandas transform cannot land a NaN (README, pandas transforms)
    want[1]["rate"] = None
    uri = config.delta.table_uri
    rows = DeltaTable(uri).to_pyarrow_table(columns=["order_id", *columns]).to_pylist()
    assert {r.pop("order_id"): {c: _canon(v) for c, v in r.items()} for r in rows} == want
    spark_rows = (
        spark.read.format("delta")
        .load(uri)
        .select("order_id", *(F.unix_micros(c).alias(c) if c == "at" else c for c in columns))
        .collect()
    )
    got = {}
    for row in spark_rows:
        values = {c: _canon(v) for c, v in row.asDict().items()}
        if values["at"] is not None:
            values["at"] = ("utc", values["at"])
        got[values.pop("order_id")] = values
    assert got == want
    (add,) = _committed_adds(uri)
    stats = json.loads(add["stats"], parse_float=Decimal, parse_constant=_not_json)
    assert stats["minValues"]["amount"] == D("-9999999999.99")
    assert stats["maxValues"]["amount"] == D("9999999999.99")
    assert stats["nullCount"]["amount"] == 1
    assert stats["maxValues"]["local_at"] == "9999-12-31T23:59:59.999999"
    assert "rate" not in stats["maxValues"]
