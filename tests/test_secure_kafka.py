"""A pipeline against a secured cluster (SASL_SSL, SCRAM-SHA-512, a throwaway CA): both
clients connect from one `kafka.security` section, a wrong password is one line and exit
code 2, and the password is nowhere a pipeline writes (issue: hostile infrastructure)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from jobs.examples.sample_data import pageviews
from jobs.wiring.pipeline import build
from ledger.store.ledger_store import LedgerStore
from orchestration.pipeline_definitions import pipeline_definitions
from resources.config.loading import load_config
from resources.config.pipeline_config import PipelineConfig
from resources.kafka.client import KafkaClient
from tests.fixtures.pipeline import assert_exactly_once
from tests.fixtures.secure_kafka import RESTRICTED_USER, SecureKafka
from tests.fixtures.spark_conf import suite_spark
from tests.test_cli import EXACTLY, REPO, one_error_line

PASSWORD_ENV = "EXACTLY_TEST_KAFKA_PASSWORD"


def secure_config(
    tmp_path: Path,
    kafka: SecureKafka,
    name: str = "secured",
    max_records: int = 200,
    user: str | None = None,
) -> PipelineConfig:
    """A pipeline on a fresh topic of the secured broker; the password only by its variable."""
    topic = f"{name}-{time.monotonic_ns()}"
    with KafkaClient(kafka.plain_bootstrap, timeout=60) as admin:
        admin.create_topic(topic, 2)
    folder = tmp_path / name
    folder.mkdir()
    doc = {
        "pipeline": name,
        "kafka": {
            "bootstrap_servers": kafka.bootstrap,
            "topic": topic,
            "security": {
                "protocol": "SASL_SSL",
                "mechanism": "SCRAM-SHA-512",
                "username": user or kafka.user,
                "password": {"env": PASSWORD_ENV},
                "ca_file": str(kafka.ca_file),
            },
        },
        "delta": {
            "table_uri": str(folder / "table"),
            "quarantine_uri": str(folder / "quarantine"),
        },
        "ledger": {"url": f"sqlite:///{folder / 'ledger.db'}"},
        "spark": suite_spark(),
        "batch": {"max_records_per_partition": max_records},
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    config = load_config(path)
    object.__setattr__(config, "_path", path)
    return config


def test_a_pipeline_reads_plans_and_commits_through_sasl_ssl(
    spark: Any, secure_kafka: SecureKafka, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PASSWORD_ENV, secure_kafka.password)
    config = secure_config(tmp_path, secure_kafka)
    # produced through the secured listener: librdkafka speaks the section's settings
    with KafkaClient(config.kafka.bootstrap_servers, config.kafka.resolved_options()) as client:
        assert client.produce(config.kafka.topic, pageviews(500, malformed_every=25)) == 500
    # planned and acked by librdkafka, read by Spark's Java Kafka source, both over SASL_SSL
    tpc = build(config, spark_factory=lambda: spark)
    batches = 0
    while tpc.run_batch() is not None:
        batches += 1
    assert batches >= 2
    with KafkaClient(secure_kafka.plain_bootstrap, timeout=60) as plain:
        assert assert_exactly_once(config, plain) == (480, 20)


def test_a_wrong_password_is_one_line_naming_the_broker_and_exit_code_2(
    secure_kafka: SecureKafka, tmp_path: Path
) -> None:
    config = secure_config(tmp_path, secure_kafka, "refused")
    path = str(config._path)  # type: ignore[attr-defined]
    started = time.monotonic()
    result = subprocess.run(
        [*EXACTLY, "run", "-c", path],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, PASSWORD_ENV: secure_kafka.password + "-wrong"},
    )
    line = one_error_line(result)
    print(f"wrong password refused after {time.monotonic() - started:.1f} s: {line}")
    assert "refused our credentials" in line and secure_kafka.bootstrap in line
    assert "Traceback" not in result.stdout + result.stderr
    assert secure_kafka.password not in result.stdout + result.stderr
    assert LedgerStore(config.ledger.url).batches(pipeline=config.pipeline, limit=5) == []


def _grant(bootstrap: str, operation: str, resource: str, name: str) -> None:
    """An ACL allowing RESTRICTED_USER `operation` on the topic or group `name`, created on
    the plaintext listener (whose ANONYMOUS principal is a super user)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    binding = AclBinding(
        ResourceType[resource],
        name,
        ResourcePatternType.LITERAL,
        f"User:{RESTRICTED_USER}",
        "*",
        AclOperation[operation],
        AclPermissionType.ALLOW,
    )
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_acls([binding]).values():
        future.result(timeout=60)


def test_a_user_kafka_does_not_authorize_is_one_line_and_nothing_is_lost(
    secure_kafka: SecureKafka, tmp_path: Path
) -> None:
    """A managed cluster's ACLs, as they are often got wrong: a user with no ACL on the
    topic stops at the plan; one allowed to describe it but not to read it plans, and
    Spark's Kafka source is refused the read, in the JVM. Each is one line naming Kafka's
    authorization and the cluster, exit code 2, nothing voted; once READ is granted (the
    topic, and the consumer group exactly commits to), the next run commits every record
    once."""
    config = secure_config(tmp_path, secure_kafka, "restricted", user=RESTRICTED_USER)
    path = str(config._path)  # type: ignore[attr-defined]
    topic, plain = config.kafka.topic, secure_kafka.plain_bootstrap
    with KafkaClient(plain, timeout=60) as client:
        client.produce(topic, pageviews(120, malformed_every=30))

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*EXACTLY, "run", "-c", path, "--until-caught-up"],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=REPO,
            env={**os.environ, PASSWORD_ENV: secure_kafka.restricted_password},
        )

    store = LedgerStore(config.ledger.url)
    try:
        for grant in (None, "DESCRIBE"):
            if grant:
                _grant(plain, grant, "TOPIC", topic)
            result = run()
            line = one_error_line(result)
            print(f"with {grant or 'no'} ACL: {line}")
            assert f"Kafka at {secure_kafka.bootstrap} did not authorize" in line, line
            assert "grant" in line and "credentials" not in line, line
            assert "SparkException" not in line and "Job aborted" not in line, line
            assert "Traceback" not in result.stderr and "\tat " not in result.stderr
            assert not [b for b in store.batches(pipeline=config.pipeline) if b.voted_once]

        _grant(plain, "READ", "TOPIC", topic)
        _grant(plain, "READ", "GROUP", config.group_id)
        done = run()
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        store.dispose()
    with KafkaClient(plain, timeout=60) as client:
        assert assert_exactly_once(config, client) == (116, 4)


def _files_holding(secret: str, *roots: Path) -> list[str]:
    needle = secret.encode()
    found = []
    for root in roots:
        for path in [root] if root.is_file() else root.rglob("*"):
            if path.is_file() and needle in path.read_bytes():
                found.append(str(path))
    return found


def test_the_kafka_password_is_in_no_log_ledger_run_or_commit(
    spark: Any, secure_kafka: SecureKafka, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PASSWORD_ENV, secure_kafka.password)
    config = secure_config(tmp_path, secure_kafka, "planted", max_records=100_000)
    with KafkaClient(secure_kafka.plain_bootstrap, timeout=60) as plain:
        plain.produce(config.kafka.topic, pageviews(300, malformed_every=30))
    path = config._path  # type: ignore[attr-defined]
    # a batch by the CLI, its Spark driver's log in its state folder, the rest on its
    # stdout and stderr...
    state = tmp_path / "state"
    cli = subprocess.run(
        [*EXACTLY, "run", "-c", str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env={**os.environ, "EXACTLY_STATE_DIR": str(state)},
    )
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert list((state / "logs").glob("spark-*.log")), "the scan below must see the JVM's log"
    logs = tmp_path / "cli.log"
    logs.write_text(cli.stdout + cli.stderr)
    # ...and one by Dagster, with its run config and event log in a real instance
    with KafkaClient(secure_kafka.plain_bootstrap, timeout=60) as plain:
        plain.produce(config.kafka.topic, pageviews(300, malformed_every=30, start=300))
    jobs = pipeline_definitions(path)
    (tmp_path / "dagster").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "dagster")) as instance:
        result = jobs.next_batch.execute_in_process(instance=instance)
        assert result.success
    with KafkaClient(secure_kafka.plain_bootstrap, timeout=60) as plain:
        assert assert_exactly_once(config, plain) == (580, 20)
    folder = Path(config.delta.table_uri).parent
    control = tmp_path / "control.txt"
    control.write_text(f"x{secure_kafka.password}x")
    assert _files_holding(secure_kafka.password, control) == [str(control)]  # the scan sees
    leaks = _files_holding(
        secure_kafka.password,
        logs,
        state,
        folder / "ledger.db",
        Path(config.delta.table_uri) / "_delta_log",
        Path(config.delta.quarantine_uri) / "_delta_log",
        tmp_path / "dagster",
    )
    assert leaks == []
