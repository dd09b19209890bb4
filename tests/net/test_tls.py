"""TLS contexts (idempotent/net/tls.py) and the test certificates (idempotent/testing/certs.py)."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from idempotent.errors import ConfigError
from idempotent.net.tls import client_context, server_context
from idempotent.testing.certs import CertFiles, make_certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    return make_certs(tmp_path_factory.mktemp("certs"))


class EchoServer:
    """Accepts connections in a thread, completes the TLS handshake and echoes one message."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.context = context
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.errors: list[BaseException] = []
        self.peers: list[object] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            conn.settimeout(5)
            try:
                with self.context.wrap_socket(conn, server_side=True) as tls:
                    self.peers.append(tls.getpeercert())
                    tls.sendall(tls.recv(100))
            except (OSError, ssl.SSLError) as exc:
                self.errors.append(exc)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def server_factory() -> Iterator[list[EchoServer]]:
    servers: list[EchoServer] = []
    yield servers
    for server in servers:
        server.close()


def talk(port: int, context: ssl.SSLContext, host: str = "127.0.0.1") -> bytes:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        tls.sendall(b"ping")
        return tls.recv(100)


def test_client_verifies_the_server(certs: CertFiles, server_factory: list[EchoServer]) -> None:
    server = EchoServer(server_context(certs.server_cert, certs.server_key))
    server_factory.append(server)
    assert talk(server.port, client_context(certs.ca_cert)) == b"ping"
    assert talk(server.port, client_context(certs.ca_cert), host="localhost") == b"ping"
    with pytest.raises(ssl.SSLCertVerificationError):
        talk(server.port, client_context(certs.ca_cert), host="broker.example")  # not a name of the cert
    with pytest.raises(ssl.SSLCertVerificationError):
        talk(server.port, client_context(certs.server_cert))  # not signed by a trusted CA


def test_mutual_tls_requires_a_client_certificate(certs: CertFiles, server_factory: list[EchoServer]) -> None:
    server = EchoServer(server_context(certs.server_cert, certs.server_key, client_ca=certs.ca_cert))
    server_factory.append(server)
    with_cert = client_context(certs.ca_cert, certfile=certs.client_cert, keyfile=certs.client_key)
    assert talk(server.port, with_cert) == b"ping"
    assert server.peers[-1]["subject"] == ((("commonName", "test-client"),),)  # type: ignore[index]
    with pytest.raises((ssl.SSLError, ConnectionError)):
        talk(server.port, client_context(certs.ca_cert))


def test_tls_1_2_or_newer_only(certs: CertFiles) -> None:
    contexts = [server_context(certs.server_cert, certs.server_key), client_context(certs.ca_cert)]
    assert [c.minimum_version for c in contexts] == [ssl.TLSVersion.TLSv1_2] * 2
    assert contexts[1].verify_mode is ssl.CERT_REQUIRED and contexts[1].check_hostname


def test_missing_or_mismatched_files_are_config_errors(certs: CertFiles, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="certificate"):
        server_context(tmp_path / "missing.pem", certs.server_key)
    with pytest.raises(ConfigError, match="certificate"):
        server_context(certs.server_cert, certs.client_key)  # the key of another certificate
    with pytest.raises(ConfigError, match="CA file"):
        client_context(tmp_path / "missing.pem")
    with pytest.raises(ConfigError, match="CA file"):
        server_context(certs.server_cert, certs.server_key, client_ca=tmp_path / "missing.pem")
    with pytest.raises(ConfigError, match="client certificate"):
        client_context(certs.ca_cert, certfile=tmp_path / "missing.pem")
