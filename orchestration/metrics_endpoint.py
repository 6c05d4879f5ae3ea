"""The code location's metrics endpoint: every pipeline's figures (jobs/metrics) at the
address EXACTLY_METRICS names, served by the process that loads the code location.

Dagster loads the code location in several processes: the code server the webserver and
the daemon ask, and every run worker. Only the first should serve, so a run worker never
does (its argv names `execute_run` or `execute_step`), and a process that finds the port
taken logs one line and goes on: another process of this location serves it. Nothing here
may stop the code location from loading; a bad address is one warning.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jobs.metrics.collector import PipelineCollector
from jobs.metrics.exposition import registry_of, serve
from ledger.core.errors import ExactlyError
from orchestration.resources import PipelineResource
from resources.config.loading import load_config

#: the environment variable naming the address (`host:port`, or `:port` for every interface)
METRICS_ENV = "EXACTLY_METRICS"
_RUN_WORKER = ("execute_run", "execute_step", "resume_run")
_log = logging.getLogger("exactly")
#: this process's server, once one was started
_server: Any = None


def serve_code_location_metrics(config_files: Sequence[Path]) -> Any:
    """Serve every pipeline's figures at $EXACTLY_METRICS, once per process; returns the
    server, or None when the variable is unset, this is a run worker, or it cannot serve."""
    global _server
    address = os.environ.get(METRICS_ENV, "").strip()
    if not address or _server is not None or any(w in sys.argv for w in _RUN_WORKER):
        return _server
    collectors = [
        PipelineCollector(
            load_config(path).pipeline,
            PipelineResource(config_path=str(path)).pipeline,
            log=_log.warning,
        )
        for path in config_files
    ]
    try:
        _server = serve(registry_of(collectors), address, METRICS_ENV)
    except ExactlyError as error:
        _log.warning(f"metrics not served by this process: {error}")
    return _server
