"""The decoder a config's `format:` section names (resources/config/formats.py), by kind: the
pipeline's transform when it has no hand-written one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame

from resources.config.formats import FormatSettings
from resources.config.pipeline_config import PipelineConfig


def pipeline_transform(config: PipelineConfig, spec: str | None = None) -> Callable[..., Any]:
    """The transform a batch of `config` stages with: its format's decoder when `spec` (by
    default the pipeline's own transform) names the format, else the hand-written one."""
    spec = spec or config.transform
    if config.format is not None and spec == config.format.transform_name:
        return format_transform(config.format)
    return config.load_transform(spec)


def format_transform(fmt: FormatSettings) -> Callable[[DataFrame], DataFrame]:
    if fmt.kind == "protobuf":
        from jobs.formats.protobuf_decode import protobuf_decoder

        return protobuf_decoder(fmt)
    from jobs.formats.avro_decode import avro_decoder

    return avro_decoder(fmt)
