"""The transform of a `format: avro` pipeline (resources/config/formats.py): Kafka values decoded
by Spark's own `from_avro`, each field of the record a column, every record that does not
decode kept for the quarantine with the reason (invariant 9).

It keeps the transform contract (jobs/stage/routing.py `check_output`): the coordinate columns,
`value` and `_error`. So the stage, the quarantine, the coordinate check (invariant 13) and
the schema rules (invariant 14: a new optional field is a new nullable column in the same
commit, a changed type is refused) are the ones every transform has.

The Confluent wire format is undone in Spark, not in Python: the first byte must be 0, the
next four are the schema id (big-endian), the datum starts at byte 6. Each known id is
decoded with its own (writer) schema resolved to the newest id's (reader) schema, so every
id yields the same columns. A record goes to the quarantine when its value is missing or
shorter than the header, its magic byte is not 0, its schema id is not configured, its
writer schema cannot be resolved to the reader's, or its datum does not decode.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro

from jobs.stage.routing import RESERVED
from ledger.core.errors import ConfigError
from ledger.core.layout import COORDINATES
from resources.config.formats import FormatSettings, unreadable_because

#: The Confluent wire header: magic byte 0, then a 4-byte big-endian schema id.
HEADER_BYTES = 5
_DECODED = "_exactly_decoded"
#: A field added to the reader schema, absent from every writer's, default true: Avro's
#: schema resolution fills it in for every datum it decodes. In PERMISSIVE mode Spark's
#: from_avro returns a record of nulls (not a null record) for a datum it cannot decode, so
#: this field null, and only then, means the datum failed: a record of nulls that did
#: decode, from whichever schema id, has it true.
_DECODED_OK = "_exactly_decoded_ok"
#: Columns a record's fields may not be named: the contract's and the stage's own.
_TAKEN = frozenset({*COORDINATES, "key", "value", "_error", *RESERVED, _DECODED, _DECODED_OK})


def avro_decoder(fmt: FormatSettings) -> Callable[[DataFrame], DataFrame]:
    """The transform for `fmt`; the schemas are read now (the stager builds it before
    any batch is planned), so a file gone since the config loaded fails here."""
    try:
        writers = fmt.writer_schemas()
    except ValueError as exc:
        raise ConfigError(f"format: {exc}") from None
    reader = writers[max(writers)]
    fields = [f["name"] for f in json.loads(reader)["fields"]]
    clash = taken_names(fields)
    if clash:
        raise ConfigError(
            f"format: the record's field(s) {clash} are named like columns the pipeline adds "
            "itself (the _kafka_* coordinates, _batch_id, key, value, _error): rename them"
        )

    def transform(records: DataFrame) -> DataFrame:
        if fmt.wire == "plain":
            decoded, error = _plain(writers[0])
        else:
            decoded, error = _confluent(writers, reader)
        with_record = records.withColumn(_DECODED, decoded)
        missing = F.col("value").isNull()
        # Columns are built here, not above: the stager loads the transform before any
        # Spark session exists, and a classic session's columns need one
        undecoded = F.col(_DECODED).isNull() | F.col(f"{_DECODED}.{_DECODED_OK}").isNull()
        reason = (
            F.when(missing, F.lit("record has no value"))
            .when(error.isNotNull(), error)
            .when(undecoded, F.lit("value is not an Avro datum of the schema"))
        )
        return with_record.select(
            *(F.col(f"{_DECODED}.`{name}`").alias(name) for name in fields),
            *COORDINATES,
            "value",
            reason.alias("_error"),
        )

    return transform


def taken_names(fields: list[str]) -> list[str]:
    """The record's field names that would clash with a column the pipeline adds itself
    (Delta column names are case-insensitive)."""
    return sorted(n for n in fields if n.lower() in {t.lower() for t in _TAKEN})


def with_sentinel(reader: str) -> str:
    """The reader schema with the `_DECODED_OK` field last."""
    schema = json.loads(reader)
    sentinel = {"name": _DECODED_OK, "type": "boolean", "default": True}
    return json.dumps({**schema, "fields": [*schema["fields"], sentinel]})


def _options(reader: str) -> dict[str, str]:
    # PERMISSIVE: a datum that does not decode is a record of nulls, which the quarantine
    # keeps with its reason, not a failed job; the reader always carries the sentinel
    return {"mode": "PERMISSIVE", "avroSchema": with_sentinel(reader)}


def _plain(schema: str) -> tuple[Column, Column]:
    decoded = from_avro(F.col("value"), schema, _options(schema))
    return decoded, F.lit(None).cast("string")


def _confluent(writers: dict[int, str], reader: str) -> tuple[Column, Column]:
    """The record decoded by its schema id's writer schema, and the reason it cannot be
    (null when it decoded, or when only the datum itself is bad)."""
    value = F.col("value")
    magic = F.conv(F.hex(F.substring(value, 1, 1)), 16, 10).cast("int")
    schema_id = F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("long")
    payload = F.expr(f"substring(value, {HEADER_BYTES + 1})")
    parsed_reader = json.loads(reader)
    decoded: Column | None = None
    refused: dict[int, str] = {}
    for sid, writer in writers.items():
        why = unreadable_because(json.loads(writer), parsed_reader)
        if why is not None:
            refused[sid] = why
            continue
        branch = from_avro(payload, writer, _options(reader))
        decoded = (decoded if decoded is not None else F).when(schema_id == sid, branch)
    # the newest id reads itself, so one branch at least
    assert decoded is not None, "the newest schema id cannot be read as itself"
    newest = max(writers)
    error = F.when(
        F.length(value) < HEADER_BYTES,
        F.lit("value is shorter than the Confluent header (5 bytes)"),
    )
    error = error.when(
        magic != 0,
        F.concat(
            F.lit("magic byte is "),
            magic.cast("string"),
            F.lit(", not 0: not the Confluent wire format"),
        ),
    )
    error = error.when(
        ~schema_id.isin(list(writers)),
        F.concat(
            F.lit("schema id "),
            schema_id.cast("string"),
            F.lit(f" is unknown (format.schema_ids has {', '.join(map(str, sorted(writers)))})"),
        ),
    )
    for sid, why in refused.items():
        error = error.when(
            schema_id == sid, F.lit(f"schema id {sid} cannot be read as schema id {newest}: {why}")
        )
    return decoded, error
