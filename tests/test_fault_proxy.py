"""The fault proxy's faults against a plain HTTP server on loopback (the proxy is test
machinery: these tests show each fault does what the storage-fault tests rely on)."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.fixtures.fault_proxy import Delay, DropResponse, FaultProxy, SlowDown


class Counting(BaseHTTPRequestHandler):
    """Answers every request 200 with its own count: what the server executed."""

    protocol_version = "HTTP/1.1"
    executed: list[str] = []

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        Counting.executed.append(f"{self.command} {self.path}")
        body = str(len(Counting.executed)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_DELETE = do_POST = _answer


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    Counting.executed = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with FaultProxy(upstream_port=int(server.server_address[1])) as faulty:
            yield faulty
    finally:
        server.shutdown()
        server.server_close()


def call(proxy: FaultProxy, method: str, path: str, timeout: float = 10) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=timeout)
    try:
        connection.request(method, path, body=b"x" if method == "PUT" else None)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_slow_down_answers_503_in_bursts_without_reaching_the_server(proxy: FaultProxy) -> None:
    proxy.inject(SlowDown(times=2, methods=frozenset({"PUT"})))
    answers = [call(proxy, "PUT", f"/b/k{i}") for i in range(3)]
    assert [status for status, _ in answers] == [503, 503, 200]
    assert b"<Code>SlowDown</Code>" in answers[0][1]
    assert Counting.executed == ["PUT /b/k2"]
    assert [entry.outcome for entry in proxy.log] == ["503 SlowDown", "503 SlowDown", "200"]


def test_a_dropped_response_was_executed_but_never_answered(proxy: FaultProxy) -> None:
    proxy.inject(DropResponse(path_contains="/_delta_log/"))
    with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
        call(proxy, "PUT", "/b/t/_delta_log/00000000000000000001.json")
    # the operation happened: a retry of it is a second execution
    assert Counting.executed == ["PUT /b/t/_delta_log/00000000000000000001.json"]
    assert proxy.log[-1].outcome == "200, response dropped"
    assert call(proxy, "GET", "/b/t/_delta_log/00000000000000000001.json")[0] == 200


def test_a_delay_holds_the_answer(proxy: FaultProxy) -> None:
    proxy.inject(Delay(seconds=1.0))
    started = time.monotonic()
    assert call(proxy, "GET", "/b/slow")[0] == 200
    held = time.monotonic() - started
    assert held >= 1.0, held
    assert call(proxy, "GET", "/b/fast")[0] == 200


def test_refused_connections_for_a_while_then_the_same_port_again(proxy: FaultProxy) -> None:
    port = proxy.port
    reopening = proxy.refuse_for(1.5)
    with pytest.raises(ConnectionRefusedError):
        call(proxy, "GET", "/b/k")
    reopening.join(timeout=10)
    assert proxy.port == port
    assert call(proxy, "GET", "/b/k")[0] == 200


def test_deletes_are_logged_with_the_keys_they_remove(proxy: FaultProxy) -> None:
    call(proxy, "DELETE", "/b/t/part%2D0.parquet?x-id=DeleteObject")
    connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    body = (
        b"<Delete><Object><Key>t/_temporary/a&amp;b</Key></Object>"
        b"<Object><Key>t/x.parquet</Key></Object><Quiet>true</Quiet></Delete>"
    )
    connection.request("POST", "/b?delete", body=body)
    assert connection.getresponse().status == 200
    connection.close()
    call(proxy, "PUT", "/b/t/y.parquet")
    assert [entry.deleted for entry in proxy.log] == [
        ("/b/t/part-0.parquet",),
        ("/b/t/_temporary/a&b", "/b/t/x.parquet"),
        (),
    ]
