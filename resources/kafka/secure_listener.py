"""The embedded broker's optional second listener, SASL_SSL with SCRAM, as a managed cluster
offers: what it adds to server.properties and which SCRAM users the storage is formatted with.

Kept apart from the plaintext KRaft configuration (resources/kafka/broker_config.py) so the
one place that knows how the broker authenticates clients is this one; the key store it
points at is resources/kafka/tls.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from resources.jvm.process import HOST


@dataclass(frozen=True)
class SecureListener:
    """A second listener, SASL_SSL with SCRAM-SHA-512, as a managed cluster offers: TLS with
    the key and certificate in `key_store` (PEM: unencrypted PKCS#8 key, then certificate;
    resources/kafka/tls.py makes one) and the SCRAM `users` (name -> password) written into the
    storage when it is formatted. Inter-broker and controller traffic stay on loopback
    plaintext listeners."""

    port: int
    key_store: Path
    users: tuple[tuple[str, str], ...]
    mechanism: str = "SCRAM-SHA-512"
    #: users allowed everything when ACLs are enforced (`authorize`); the others only what
    #: an ACL grants them. The plaintext listeners' ANONYMOUS principal always is one.
    super_users: tuple[str, ...] = ()
    #: enforce ACLs (KRaft's StandardAuthorizer), as a managed cluster does
    authorize: bool = False

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"


def security_properties(secure: SecureListener | None) -> dict[str, str]:
    """The listeners' security protocols, and with `secure` its SASL and TLS settings."""
    if secure is None:
        return {"listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"}
    mechanism = secure.mechanism.lower()
    prefix = "listener.name.sasl_ssl"
    return {
        "listener.security.protocol.map": (
            "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL"
        ),
        "sasl.enabled.mechanisms": secure.mechanism,
        f"{prefix}.{mechanism}.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
        f"{prefix}.ssl.keystore.type": "PEM",
        f"{prefix}.ssl.keystore.location": str(secure.key_store),
        **_authorizer_properties(secure),
    }


def _authorizer_properties(secure: SecureListener) -> dict[str, str]:
    """ACLs enforced on every listener; the broker itself, its controller and whoever uses
    the plaintext listeners (ANONYMOUS) stay super users, so only the SASL users are held
    to their ACLs."""
    if not secure.authorize:
        return {}
    supers = ["User:ANONYMOUS", *(f"User:{name}" for name in secure.super_users)]
    return {
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": ";".join(supers),
    }


def scram_arguments(secure: SecureListener | None) -> list[str]:
    """kafka-storage format's arguments that write `secure`'s SCRAM users into the storage."""
    if secure is None:
        return []
    arguments: list[str] = []
    for name, password in secure.users:
        credential = f"name={name},password={password}"
        arguments += ["--add-scram", f"{secure.mechanism}=[{credential}]"]
    return arguments
