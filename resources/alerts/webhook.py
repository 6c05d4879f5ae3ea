"""Alert sinks: the Dagster log always; a generic JSON webhook and Slack when configured.

A prepared batch that cannot commit means data that Kafka may delete before anyone
publishes it (docs/protocol.md, "commit must eventually succeed, or data is lost"), so it must
reach a person. Secrets (webhook URLs, Slack tokens) are read from environment variables at
send time and never logged, returned, or stored; only the variables' names are config.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

import dagster as dg

from ledger.core.errors import with_config

_log = logging.getLogger("exactly.alerts")


@dataclass(frozen=True)
class Alert:
    """One message to operators. `kind` is stuck_<state> (stuck_planned, stuck_staged,
    stuck_prepared, stuck_committed), ack_failing, blocked, staged_files_missing, resolved or
    run_failed."""

    kind: str
    pipeline: str
    title: str
    text: str
    details: Mapping[str, Any] = field(default_factory=dict)

    def payload(self) -> dict[str, Any]:
        return {"source": "exactly", **asdict(self), "details": dict(self.details)}


class AlertSink(Protocol):
    name: str

    def send(self, alert: Alert) -> None:
        """Deliver `alert`; raise on failure (the caller logs and carries on)."""


class LogSink:
    """Always on: the alert lands in the Dagster run or sensor log."""

    name = "log"

    def __init__(self, log: Callable[[str], None]) -> None:
        self._log = log

    def send(self, alert: Alert) -> None:
        self._log(f"ALERT [{alert.kind}] {alert.title}: {alert.text}")


class WebhookSink:
    """POSTs the alert as JSON to a URL read from an environment variable."""

    name = "webhook"

    def __init__(self, url_env: str, timeout: float = 10.0) -> None:
        self.url_env = url_env
        self.timeout = timeout

    def send(self, alert: Alert) -> None:
        url = os.environ.get(self.url_env)
        if not url:
            raise RuntimeError(f"environment variable {self.url_env} (webhook URL) is not set")
        body = json.dumps(alert.payload()).encode()
        request = urllib.request.Request(
            url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                if response.status >= 300:
                    raise RuntimeError(f"webhook answered HTTP {response.status}")
        except urllib.error.URLError as exc:
            # the URL itself may carry a token: name the variable, never the value
            raise RuntimeError(f"webhook from ${self.url_env} failed: {exc.reason}") from None


class SlackSink:
    """Posts to a Slack channel through dagster-slack, token from an environment variable.

    `api_url` replaces Slack's API root (an egress proxy, or a local stand-in in tests).
    """

    name = "slack"

    def __init__(self, token_env: str, channel: str, api_url: str | None = None) -> None:
        self.token_env = token_env
        self.channel = channel
        self.api_url = api_url

    def send(self, alert: Alert) -> None:
        from dagster_slack import SlackResource

        token = os.environ.get(self.token_env)
        if not token:
            raise RuntimeError(f"environment variable {self.token_env} (Slack token) is not set")
        client = SlackResource(token=token).get_client()
        if self.api_url:
            client.base_url = self.api_url.rstrip("/") + "/"
        client.chat_postMessage(channel=self.channel, text=f"*{alert.title}*\n{alert.text}")


class AlertsResource(dg.ConfigurableResource):
    """The configured sinks of one pipeline. Holds environment variable names only."""

    webhook_url_env: str | None = None
    slack_token_env: str | None = None
    slack_channel: str | None = None
    slack_api_url: str | None = None
    #: the pipeline's config file, for the commands an alert tells a person to run
    config_path: str | None = None

    def sinks(self, log: Callable[[str], None]) -> list[AlertSink]:
        sinks: list[AlertSink] = [LogSink(log)]
        if self.webhook_url_env:
            sinks.append(WebhookSink(self.webhook_url_env))
        if self.slack_token_env and self.slack_channel:
            sinks.append(SlackSink(self.slack_token_env, self.slack_channel, self.slack_api_url))
        return sinks

    def send(self, alert: Alert, log: Callable[[str], None]) -> list[str]:
        """Send to every sink; returns the names of sinks that failed (each one logged).

        Every alert passes here, so here the commands it names get the config file's path.
        """
        if self.config_path is not None:
            alert = replace(
                alert,
                title=with_config(alert.title, self.config_path),
                text=with_config(alert.text, self.config_path),
            )
        failed = []
        for sink in self.sinks(log):
            try:
                sink.send(alert)
            except Exception as exc:
                failed.append(sink.name)
                log(f"alert sink {sink.name} failed: {exc}")
                _log.warning("alert sink %s failed: %s", sink.name, exc)
        return failed
