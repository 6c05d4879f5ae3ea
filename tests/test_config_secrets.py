"""Config values that name environment variables instead of holding secrets.

`{env: NAME}` is resolved only where a client is made, so the config object, which the
Dagster UI, the logs and the ledger may show, never holds the secret itself.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from jobs.stage.spark_stager import SharedSpark
from ledger.core.errors import ConfigError
from resources.config.loading import load_config

SECRET = "s3cr3t-planted-9f1c"

CONFIG = """
pipeline: orders
kafka:
  bootstrap_servers: 127.0.0.1:9092
  topic: orders
  options:
    security.protocol: SASL_SSL
    sasl.password: {env: ORDERS_KAFKA_PASSWORD}
delta:
  table_uri: tables/orders
  quarantine_uri: tables/orders_quarantine
  storage_options:
    AWS_SECRET_ACCESS_KEY: {env: ORDERS_S3_SECRET}
spark:
  conf:
    spark.hadoop.fs.s3a.secret.key: {env: ORDERS_S3_SECRET}
"""


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "orders.yaml"
    path.write_text(CONFIG)
    return path


def test_named_variables_are_read_where_the_clients_are_made(
    config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORDERS_KAFKA_PASSWORD", SECRET)
    monkeypatch.setenv("ORDERS_S3_SECRET", SECRET + "-s3")
    config = load_config(config_file)
    assert config.kafka.resolved_options() == {
        "security.protocol": "SASL_SSL",
        "sasl.password": SECRET,
    }
    assert config.delta.resolved_storage_options() == {"AWS_SECRET_ACCESS_KEY": SECRET + "-s3"}
    assert SharedSpark.for_config(config).conf == {"spark.hadoop.fs.s3a.secret.key": SECRET + "-s3"}


def test_the_config_itself_never_holds_the_secret(
    config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORDERS_KAFKA_PASSWORD", SECRET)
    monkeypatch.setenv("ORDERS_S3_SECRET", SECRET)
    config = load_config(config_file)
    for shown in (repr(config), str(config.model_dump()), config.model_dump_json()):
        assert SECRET not in shown
        assert "ORDERS_KAFKA_PASSWORD" in shown


def test_an_unset_variable_names_the_option_and_the_variable(
    config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ORDERS_KAFKA_PASSWORD", raising=False)
    config = load_config(config_file)
    with pytest.raises(ConfigError) as info:
        config.kafka.resolved_options()
    assert str(info.value) == (
        "kafka.options.sasl.password: environment variable ORDERS_KAFKA_PASSWORD is not set"
    )


def test_a_value_in_place_of_a_variable_name_is_refused(tmp_path: Path) -> None:
    data = yaml.safe_load(CONFIG)
    data["kafka"]["options"]["sasl.password"] = {"env": "hunter2 with spaces"}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "kafka.options.sasl.password" in str(info.value)
    assert "must be the NAME of an environment variable" in str(info.value)
