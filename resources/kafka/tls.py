"""A throwaway certificate authority and a broker certificate for loopback, made by openssl.

What the secured embedded broker (resources/kafka/secure_listener.py `SecureListener`) and its
tests need:
a CA certificate the clients trust (`ssl.ca.location`, or a PEM trust store for Java) and a
broker key and certificate signed by it for 127.0.0.1, in one PEM file (Kafka's PEM key
store: an unencrypted PKCS#8 key, then the certificate). Valid for two days: a test's CA is
never something to keep.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from ledger.core.errors import ExactlyError

DAYS = "2"


@dataclass(frozen=True)
class LoopbackCertificates:
    #: the CA certificate, PEM: what clients trust
    ca_file: Path
    #: the broker's unencrypted PKCS#8 key followed by its certificate, PEM
    broker_pem: Path


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    if result.returncode != 0:
        raise ExactlyError(f"openssl {args[0]} failed: {result.stderr.strip()[-300:]}")


def make_test_certificates(folder: Path, host: str = "127.0.0.1") -> LoopbackCertificates:
    """A new CA and a broker certificate for `host` (IP and localhost in its SANs)."""
    folder.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", DAYS, "-subj", "/CN=exactly throwaway test CA", cwd=folder,
    )  # fmt: skip
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key", "-out", "broker.csr",
        "-subj", f"/CN={host}", cwd=folder,
    )  # fmt: skip
    (folder / "san.cnf").write_text(f"subjectAltName=IP:{host},DNS:localhost\n")
    _openssl(
        "x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "broker.crt", "-days", DAYS, "-extfile", "san.cnf",
        cwd=folder,
    )  # fmt: skip
    broker_pem = folder / "broker.pem"
    broker_pem.write_text((folder / "broker.key").read_text() + (folder / "broker.crt").read_text())
    return LoopbackCertificates(ca_file=folder / "ca.pem", broker_pem=broker_pem)
