"""The Pulsar backend's URLs: pulsar-client's service URLs (``pulsar://``, ``pulsar+ssl://``,
``http(s)://``), the admin URL each implies, and TLS, through the backend and the drop-in."""

from __future__ import annotations

import ssl
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import pytest

import idempotent
from idempotent.errors import BackendUnavailableError, ConfigError


def test_each_service_url_implies_its_admin_url() -> None:
    from idempotent.adapters.pulsar.url import parse_url

    cases = {
        "pulsar://h1:6650,h2:6650": ("pulsar://h1:6650,h2:6650", "http://h1:8080"),
        "pulsar+ssl://h1:6651": ("pulsar+ssl://h1:6651", "https://h1:8443"),
        "http://h1:8080,h2:8080": ("http://h1:8080,h2:8080", "http://h1:8080"),
        "https://h1:8443/?timeout=5": ("https://h1:8443/", "https://h1:8443"),
        "pulsar://[::1]:6650": ("pulsar://[::1]:6650", "http://[::1]:8080"),
    }
    for url, (service, admin) in cases.items():
        parsed = parse_url(url)
        assert (parsed.service_url, parsed.admin_url) == (service, admin), url
    tls = parse_url("pulsar+ssl://h:6651?tls_trust_certs_file_path=/ca.pem&tls_validate_hostname=true").tls
    assert tls == {"tls_trust_certs_file_path": "/ca.pem", "tls_validate_hostname": True}


def test_other_urls_are_refused_with_the_accepted_forms() -> None:
    from idempotent.adapters.pulsar.url import parse_url

    for url in ("pulsar+tls://h:1", "ws://h:1", "pulsar://", "http:/h"):
        with pytest.raises(ConfigError, match=r"expected pulsar://host:port, pulsar\+ssl://host:port, http://"):
            parse_url(url)
    with pytest.raises(ConfigError, match=r"unknown pulsar URL option\(s\) \['tls_key'\]"):
        parse_url("pulsar+ssl://h:1?tls_key=x")


def test_admin_calls_over_https_use_the_clients_tls_settings(tmp_path: Path) -> None:
    from idempotent.adapters.pulsar.url import admin_ssl_context
    from idempotent.testing.certs import make_certs

    files = make_certs(tmp_path)
    assert admin_ssl_context("http://h:8080", {"tls_trust_certs_file_path": str(files.ca_cert)}) is None
    context = admin_ssl_context("https://h:8443", {"tls_trust_certs_file_path": str(files.ca_cert)})
    assert context is not None and context.verify_mode is ssl.CERT_REQUIRED and not context.check_hostname
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "idempotent test CA"),),)]
    strict = admin_ssl_context("https://h:8443", {"tls_validate_hostname": True})
    assert strict is not None and strict.check_hostname
    loose = admin_ssl_context("https://h:8443", {"tls_allow_insecure_connection": True})
    assert loose is not None and loose.verify_mode is ssl.CERT_NONE
    mutual = {"tls_certificate_file_path": str(files.client_cert), "tls_private_key_file_path": str(files.client_key)}
    assert admin_ssl_context("https://h:8443", mutual) is not None
    with pytest.raises(ConfigError, match="TLS files for https://h:8443 cannot be used"):
        admin_ssl_context("https://h:8443", {"tls_trust_certs_file_path": str(tmp_path / "missing.pem")})


class _Recorded(Exception):
    pass


def _record_clients(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """Replace the backend's ``pulsar.Client`` by one that records how it was made and then
    fails to connect, as a client with no broker behind its URL does."""
    import pulsar

    import idempotent.adapters.pulsar.backend

    made: list[tuple[str, dict[str, Any]]] = []

    def client(url: str, **options: Any) -> Any:
        made.append((url, options))
        raise pulsar.ConnectError("recorded")

    monkeypatch.setattr(idempotent.adapters.pulsar.backend.pulsar, "Client", client)
    # past the backend's own check that something listens there (idempotent.adapters.reach)
    monkeypatch.setattr(idempotent.adapters.pulsar.backend, "wait_reachable", lambda *args: None)
    return made


def test_a_pulsar_ssl_url_reaches_the_pulsar_client_with_its_tls_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from idempotent.testing.certs import make_certs

    ca = str(make_certs(tmp_path).ca_cert)
    made = _record_clients(monkeypatch)
    query = urllib.parse.urlencode({"tls_trust_certs_file_path": ca, "tls_validate_hostname": "true"})
    with pytest.raises(BackendUnavailableError, match="recorded"):
        idempotent.connect(
            f"pulsar+ssl://pulsar-1:6651?{query}", client_options={"tls_allow_insecure_connection": False}
        )
    url, options = made[0]
    assert url == "pulsar+ssl://pulsar-1:6651"
    assert options["tls_trust_certs_file_path"] == ca
    assert options["tls_validate_hostname"] is True and options["tls_allow_insecure_connection"] is False


def test_the_drop_in_client_passes_a_pulsar_ssl_url_and_its_tls_arguments(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 22: ``pulsar.Client("pulsar+ssl://...")`` was refused with InvalidConfiguration."""
    from idempotent.compat import pulsar as drop_in
    from idempotent.testing.certs import make_certs

    ca = str(make_certs(tmp_path).ca_cert)
    made = _record_clients(monkeypatch)
    client = drop_in.Client(  # connects when first needed, as pulsar-client's
        "pulsar+ssl://pulsar-1:6651",
        tls_trust_certs_file_path=ca,
        tls_validate_hostname=True,
        operation_timeout_seconds=7,
    )
    with pytest.raises(drop_in.PulsarException, match="recorded"):
        client.create_producer("t")
    url, options = made[0]
    assert url == "pulsar+ssl://pulsar-1:6651"
    assert options["tls_trust_certs_file_path"] == ca and options["tls_validate_hostname"] is True
    with pytest.raises(drop_in.PulsarException, match="recorded"):
        drop_in.Client("https://pulsar-1:8443", tls_allow_insecure_connection=True).create_producer("t")
    assert made[1] == ("https://pulsar-1:8443", {**made[1][1], "tls_allow_insecure_connection": True})


@pytest.mark.pulsar
def test_an_http_service_url_works_as_pulsar_clients_does(pulsar_service: Any) -> None:
    """Issue 22: an ``http://`` service URL was refused with InvalidConfiguration. Lookups
    then go over the web service, which is the admin URL too."""
    import pulsar

    from idempotent.compat import pulsar as drop_in

    topic = f"persistent://public/default/http-{uuid.uuid4().hex[:10]}"
    broker = idempotent.connect(pulsar_service.admin_url)
    try:
        s = broker.init_producer()
        assert broker.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"over-http"]).base_offset is not None
    finally:
        broker.close()
    client = drop_in.Client(pulsar_service.admin_url)
    try:
        client.create_producer(topic).send(b"drop-in over http")
        reader = client.subscribe(topic, "plain")  # a real pulsar.Client on the same URL
        reader.close()
    finally:
        client.close()
    plain = pulsar.Client(pulsar_service.bootstrap, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        reader = plain.create_reader(topic + "-partition-0", pulsar.MessageId.earliest)
        assert [reader.read_next(20_000).data() for _ in range(2)] == [b"over-http", b"drop-in over http"]
    finally:
        plain.close()


@pytest.mark.pulsar
def test_a_pulsar_ssl_url_works_against_a_tls_pulsar(pulsar_service: Any) -> None:
    """The test Pulsar's TLS listeners, with the CA that signed them: the binary protocol
    over TLS, admin calls over https, host names checked."""
    import pulsar

    from idempotent.compat import pulsar as drop_in

    topic = f"tls-{uuid.uuid4().hex[:10]}"
    query = urllib.parse.urlencode({"admin_url": pulsar_service.tls_admin_url})
    tls = {"tls_trust_certs_file_path": pulsar_service.ca_cert, "tls_validate_hostname": True}
    broker = idempotent.connect(f"{pulsar_service.tls_url}?{query}", client_options=tls)
    try:
        s = broker.init_producer()
        assert broker.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"over-tls"]).base_offset is not None
        assert [r.value for r in broker.read(topic, 0, 0, 10)] == [b"over-tls"]
    finally:
        broker.close()
    client = drop_in.Client(f"{pulsar_service.tls_url}?{query}", **tls)
    try:
        client.create_producer(topic).send(b"drop-in over tls")
    finally:
        client.close()
    untrusted = drop_in.Client(f"{pulsar_service.tls_url}?{query}", operation_timeout_seconds=3)
    with pytest.raises(drop_in.PulsarException):  # without the CA the certificate is not trusted
        untrusted.create_producer(topic)
    plain = pulsar.Client(pulsar_service.bootstrap, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        reader = plain.create_reader(f"persistent://public/default/{topic}-partition-0", pulsar.MessageId.earliest)
        assert [reader.read_next(20_000).data() for _ in range(2)] == [b"over-tls", b"drop-in over tls"]
    finally:
        plain.close()
