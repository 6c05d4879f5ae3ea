"""The decoder a config's `format:` section names (resources/formats.py), by kind: the
pipeline's transform when it has no hand-written one."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame

from resources.formats import FormatSettings


def format_transform(fmt: FormatSettings) -> Callable[[DataFrame], DataFrame]:
    if fmt.kind == "protobuf":
        from jobs.protobuf_decode import protobuf_decoder

        return protobuf_decoder(fmt)
    from jobs.avro_decode import avro_decoder

    return avro_decoder(fmt)
