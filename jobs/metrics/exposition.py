"""Where the figures go: an HTTP endpoint Prometheus scrapes, or a node-exporter text file.

`exactly run --continuous --metrics ADDR` serves while the loop runs; the Dagster code
location serves when EXACTLY_METRICS names an address (orchestration/definitions.py); a
one-shot `exactly run --metrics-textfile PATH` writes the same families after each batch,
for node-exporter's textfile collector. The address is `host:port`, or `:port` for every
interface. A port another process holds is one line naming it (exit code 2 from the
command line); the text file is replaced whole (written beside it, then renamed), so the
collector never reads half of it.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server, write_to_textfile
from prometheus_client.registry import Collector

from ledger.core.errors import ConfigError


def registry_of(collectors: Iterable[Collector]) -> CollectorRegistry:
    """A registry of `collectors` alone: none of the client's process or platform figures,
    which would describe whichever process happens to serve."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    return registry


def parse_address(address: str, what: str) -> tuple[str, int]:
    """`host:port` or `:port` (every interface) as (host, port); `what` names the setting
    in the error."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{what} {address!r}: give host:port, or :port for every interface")
    return host.strip("[]") or "0.0.0.0", int(port)


def serve(registry: CollectorRegistry, address: str, what: str) -> Any:
    """Serve `registry` at `address` in a background thread; returns the server (its
    `shutdown()` stops it)."""
    host, port = parse_address(address, what)
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        why = "another process listens there" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise ConfigError(f"{what} {address}: cannot serve metrics there ({why})") from exc
    return server


def write_textfile(registry: CollectorRegistry, path: Path) -> None:
    """Replace `path` with the registry's figures (written beside it, then renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_to_textfile(str(path), registry)


class MetricsOutput:
    """Where one running command sends a pipeline's figures: an endpoint served while it
    runs (`address`), a text file rewritten after every batch and at the end (`textfile`),
    both, or neither."""

    def __init__(
        self, collector: Collector, address: str | None = None, textfile: Path | None = None
    ) -> None:
        self.collector = collector
        self.registry = registry_of([collector])
        self.address = address
        self.textfile = textfile
        self._server: Any = None

    def __enter__(self) -> MetricsOutput:
        if self.address is None and self.textfile is None:
            return self
        begin = getattr(self.collector, "begin", None)
        if begin is not None:
            begin()
        if self.address:
            self._server = serve(self.registry, self.address, "--metrics")
        return self

    def after_batch(self) -> None:
        if self.textfile is not None:
            write_textfile(self.registry, self.textfile)

    def __exit__(self, *_exc: object) -> None:
        try:
            self.after_batch()
        finally:
            if self._server is not None:
                self._server.shutdown()
                self._server.server_close()
