"""The CLI on a pipeline config that reads several topics: what needs a topic named refuses
in one line with exit code 2, before reaching Kafka or the tables; what names the topics
names them all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from orchestration.assets import topic_spec
from resources.config.loading import load_config

EXACTLY = [sys.executable, "-m", "exactly_cli"]


def write_config(tmp_path: Path, kafka: dict[str, object]) -> Path:
    path = tmp_path / "orders.yaml"
    doc = {
        "pipeline": "orders",
        "kafka": {"bootstrap_servers": "127.0.0.1:1", **kafka},
        "delta": {"table_uri": f"{tmp_path}/t", "quarantine_uri": f"{tmp_path}/q"},
        "ledger": {"url": f"sqlite:///{tmp_path / 'ledger.db'}"},
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_exactly_backfill_on_several_topics_must_name_its_topic(tmp_path: Path) -> None:
    """Which topic's offsets a range means cannot be guessed: without --topic the backfill
    is refused in one line, before reaching Kafka or the tables."""
    path = write_config(tmp_path, {"topics": ["a", "b"]})
    done = subprocess.run(
        [*EXACTLY, "backfill", "-c", str(path), "--partition", "0", "--from", "0", "--to", "5"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, done.stderr
    assert "error: --topic: pipeline orders reads several topics (" in lines[0], lines
    assert "Traceback" not in done.stderr


def test_the_topic_asset_names_every_topic_the_pipeline_reads(tmp_path: Path) -> None:
    listed = load_config(write_config(tmp_path, {"topics": ["a", "b"]}))
    assert (
        topic_spec(listed).description == "Kafka topics a, b on 127.0.0.1:1 (read, never written)"
    )
    pattern = load_config(write_config(tmp_path, {"pattern": "o-.*"}))
    assert "Kafka topics matching 'o-.*' on" in (topic_spec(pattern).description or "")
    one = load_config(write_config(tmp_path, {"topic": "a"}))
    assert topic_spec(one).description == "Kafka topic a on 127.0.0.1:1 (read, never written)"


def test_the_dagster_code_location_loads_a_pipeline_on_a_pattern(tmp_path: Path) -> None:
    """The definitions are built at load from the config alone (no broker): nothing there
    may assume one topic."""
    import dagster as dg

    from orchestration.pipeline_definitions import pipeline_definitions

    path = write_config(tmp_path, {"pattern": "orders-.*"})
    defs = pipeline_definitions(path).definitions
    graph = defs.resolve_asset_graph()
    topic = graph.get(dg.AssetKey("orders_topic"))
    assert "topics matching 'orders-.*'" in (topic.description or "")
