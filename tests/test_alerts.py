"""Alert sinks against real local HTTP endpoints: a webhook and a Slack API stand-in."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

import pytest

from ledger.core.errors import CONFIG_PLACEHOLDER
from resources.alerts.webhook import Alert, AlertsResource
from resources.jvm.process import free_port

ALERT = Alert(
    "stuck_prepared", "pv", "pv: batch 3 stuck in PREPARED", "voted 6 min ago", {"batch_id": 3}
)


class SlackStandIn:
    """Answers chat.postMessage like Slack's Web API and records what it was sent."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None, dict[str, Any]]] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
                if "json" in (self.headers.get("Content-Type") or ""):
                    body = json.loads(raw)
                else:
                    body = {k: v[0] for k, v in parse_qs(raw).items()}
                stand_in.calls.append((self.path, self.headers.get("Authorization"), body))
                answer = json.dumps({"ok": True, "channel": body.get("channel"), "ts": "1.0"})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(answer.encode())

            def log_message(self, *_args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def slack(monkeypatch: pytest.MonkeyPatch) -> Iterator[SlackStandIn]:
    stand_in = SlackStandIn()
    monkeypatch.setenv("EXACTLY_TEST_SLACK_TOKEN", "xoxb-test-token")
    yield stand_in
    stand_in.server.shutdown()
    stand_in.server.server_close()


def test_every_configured_sink_gets_the_alert(webhook: Any, slack: SlackStandIn) -> None:
    logged: list[str] = []
    sinks = AlertsResource(
        webhook_url_env="EXACTLY_TEST_WEBHOOK_URL",
        slack_token_env="EXACTLY_TEST_SLACK_TOKEN",
        slack_channel="#data-alerts",
        slack_api_url=slack.url,
    )
    assert sinks.send(ALERT, logged.append) == []
    assert logged == ["ALERT [stuck_prepared] pv: batch 3 stuck in PREPARED: voted 6 min ago"]
    assert webhook.posts == [
        {
            "source": "exactly",
            "kind": "stuck_prepared",
            "pipeline": "pv",
            "title": "pv: batch 3 stuck in PREPARED",
            "text": "voted 6 min ago",
            "details": {"batch_id": 3},
        }
    ]
    ((path, auth, body),) = slack.calls
    assert path == "/api/chat.postMessage"
    assert auth == "Bearer xoxb-test-token"
    assert body["channel"] == "#data-alerts"
    assert "pv: batch 3 stuck in PREPARED" in body["text"]


def test_a_broken_sink_never_mutes_the_others_nor_leaks_its_secret(
    monkeypatch: pytest.MonkeyPatch, slack: SlackStandIn
) -> None:
    secret_url = f"http://127.0.0.1:{free_port()}/hooks/secret-token-456"
    monkeypatch.setenv("EXACTLY_TEST_WEBHOOK_URL", secret_url)
    logged: list[str] = []
    sinks = AlertsResource(
        webhook_url_env="EXACTLY_TEST_WEBHOOK_URL",
        slack_token_env="EXACTLY_TEST_SLACK_TOKEN",
        slack_channel="#data-alerts",
        slack_api_url=slack.url,
    )
    assert sinks.send(ALERT, logged.append) == ["webhook"]
    assert len(slack.calls) == 1
    failure = next(line for line in logged if "webhook failed" in line)
    assert "$EXACTLY_TEST_WEBHOOK_URL" in failure
    assert "secret-token-456" not in " ".join(logged)


def test_an_alert_names_the_pipeline_config_file_in_the_commands_it_gives(webhook: Any) -> None:
    logged: list[str] = []
    sinks = AlertsResource(webhook_url_env="EXACTLY_TEST_WEBHOOK_URL", config_path="/etc/pv.yaml")
    told = Alert("blocked", "pv", "pv: blocked", f"run `exactly ledger -c {CONFIG_PLACEHOLDER}`")
    assert sinks.send(told, logged.append) == []
    assert logged == ["ALERT [blocked] pv: blocked: run `exactly ledger -c /etc/pv.yaml`"]
    assert webhook.posts[0]["text"] == "run `exactly ledger -c /etc/pv.yaml`"


def test_a_sink_without_its_environment_variable_says_which_one() -> None:
    logged: list[str] = []
    sinks = AlertsResource(webhook_url_env="EXACTLY_TEST_UNSET_VARIABLE")
    assert sinks.send(ALERT, logged.append) == ["webhook"]
    assert any("EXACTLY_TEST_UNSET_VARIABLE" in line and "not set" in line for line in logged)
