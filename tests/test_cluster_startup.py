"""The standalone cluster's start-up wait (resources/spark/standalone_cluster.py): while the
master's web UI is starting, its JSON answer can be empty; that means "not up yet", like a
refused connection, not a failed start."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

from resources.spark.standalone_cluster import SparkCluster, _registered


class EmptyBody(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


def test_an_empty_answer_from_a_starting_master_ui_counts_as_no_worker_yet(
    tmp_path: Path,
) -> None:
    server = HTTPServer(("127.0.0.1", 0), EmptyBody)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        cluster = SparkCluster(port=1, ui_port=server.server_address[1], work_dir=tmp_path)
        assert _registered(cluster) == 0
    finally:
        server.shutdown()
