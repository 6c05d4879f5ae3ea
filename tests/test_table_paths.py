"""Tables whose folders are named as people name them: a space, a percent sign, a letter
outside ASCII. Spark takes a location as a Hadoop path, in which `%C3%A9` is three
characters and not `é`; a percent-encoded `file:` URI handed to it lands the stage's files
in a folder of that literal name beside the table, where neither the vote nor the cleaner
looks (every batch was refused at its coordinate check, invariant 13). A `%` followed by two
hex digits is the one spelling the two readers cannot agree on (delta-rs decodes it, Spark
does not): refused in one line when the config is read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from ledger.core.errors import ConfigError
from resources.config.loading import parse_config
from resources.object_storage import storage
from tests.fixtures.derived import assert_derived_match, derived_outputs
from tests.fixtures.partitioned import check_partitions, produce, run_until_caught_up
from tests.fixtures.pipeline import assert_exactly_once

#: a folder name with each character a URI would encode
AWKWARD = "data lake 100% é"


def test_file_uris_of_awkward_folders_are_read_as_the_folders_they_name(tmp_path: Path) -> None:
    folder = tmp_path / AWKWARD / "table"
    encoded = folder.as_uri()  # file:///...data%20lake%20100%25%20%C3%A9/table
    assert storage.resolve(encoded, tmp_path) == str(folder)
    folder.mkdir(parents=True)
    (folder / "f").write_bytes(b"x")
    assert storage.exists(f"{encoded}/f") and storage.read_bytes(f"{encoded}/f") == b"x"


@pytest.mark.parametrize(
    ("field", "value"),
    [("table_uri", "./sales%20eu/table"), ("quarantine_uri", "s3://lake/q%C3%A9")],
)
def test_a_location_with_a_percent_encoded_character_is_refused_in_one_line(
    tmp_path: Path, field: str, value: str
) -> None:
    doc = {
        "pipeline": "orders",
        "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topic": "orders"},
        "delta": {"table_uri": "./table", "quarantine_uri": "./quarantine", field: value},
        "ledger": {"url": "sqlite:///./ledger.db"},
        "transform": "jobs.examples.pageviews:transform",
    }
    with pytest.raises(ConfigError) as refused:
        parse_config(doc, "orders.yaml", base_dir=tmp_path)
    line = str(refused.value)
    assert "\n" not in line and f"delta.{field}" in line, line
    encoded = value[value.index("%") : value.index("%") + 3]
    assert repr(encoded) in line and "rename" in line, line


def test_a_pipeline_in_a_folder_with_a_space_a_percent_and_an_accent_holds_each_record_once(
    spark: Any, kafka_client: Any, partitioned_factory: Any, tmp_path: Path
) -> None:
    root = tmp_path / AWKWARD
    config = partitioned_factory(
        2, max_records=40, table_root=str(root), derived=derived_outputs(root)
    )
    instants = produce(kafka_client, config, 90)
    assert run_until_caught_up(config, spark) >= 2

    assert assert_exactly_once(config, kafka_client) == (90, 5)
    check_partitions(config.delta.table_uri, instants)
    assert_derived_match(config)
    # delta-spark reads what delta-rs committed, at the same location
    for uri in (config.delta.table_uri, config.delta.quarantine_uri):
        by_spark = spark.read.format("delta").load(storage.spark_uri(uri)).count()
        assert by_spark == len(DeltaTable(uri).to_pyarrow_table()), uri
    # and nothing was written anywhere else: no folder spelled as a URI beside the tables
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [AWKWARD], sorted(
        p.name for p in tmp_path.iterdir()
    )
