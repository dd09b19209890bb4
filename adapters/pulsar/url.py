"""The URLs of the Pulsar backend: the service URL pulsar-client connects to, the admin REST
URL next to it, the options a URL may carry, and TLS for both.

pulsar-client takes ``pulsar://host:port`` (the binary protocol), ``pulsar+ssl://host:port``
(the same over TLS) and ``http://host:port`` or ``https://host:port`` (lookups over the web
service, which also serves the admin REST API), each with a list of hosts. The backend takes
the same, and derives the admin URL from it when none is given:

============================  =======================
service URL                   admin URL (default)
============================  =======================
``pulsar://h1:6650,h2:6650``  ``http://h1:8080``
``pulsar+ssl://h1:6651``      ``https://h1:8443``
``http://h1:8080``            ``http://h1:8080``
``https://h1:8443``           ``https://h1:8443``
============================  =======================

TLS settings are pulsar-client's ``Client`` arguments (``tls_trust_certs_file_path``,
``tls_allow_insecure_connection``, ``tls_validate_hostname``, ``tls_certificate_file_path``,
``tls_private_key_file_path``); they apply to the admin calls over ``https`` as well.
"""

from __future__ import annotations

import ssl
import urllib.parse
from collections.abc import Mapping
from typing import Any

import attrs

from idempotent.errors import ConfigError

#: the schemes pulsar-client's ``Client`` takes, and the admin URL each defaults to
_ADMIN_DEFAULTS = {"pulsar": ("http", 8080), "pulsar+ssl": ("https", 8443), "http": None, "https": None}
SCHEMES = tuple(_ADMIN_DEFAULTS)
#: pulsar-client's TLS arguments that are file paths, and those that are flags
TLS_PATHS = ("tls_trust_certs_file_path", "tls_certificate_file_path", "tls_private_key_file_path")
TLS_FLAGS = ("tls_allow_insecure_connection", "tls_validate_hostname")
#: the backend's options a URL may carry as query parameters (keywords win)
QUERY_OPTIONS = frozenset(
    {"admin_url", "timeout", "connect_timeout", "meta_topic", "max_entry_bytes", "read_only", *TLS_PATHS, *TLS_FLAGS}
)


def flag(value: str) -> bool:
    """A boolean URL parameter."""
    return value.strip().lower() in ("1", "true", "yes")


@attrs.frozen
class PulsarURL:
    """A parsed backend URL.

    Attributes:
        service_url: what pulsar-client connects to (the URL without its query).
        admin_url: the admin REST base URL it implies (see the module docstring).
        query: the backend options given as query parameters.
        tls: pulsar-client's TLS arguments among them, typed.
    """

    service_url: str
    admin_url: str
    query: Mapping[str, str]
    tls: Mapping[str, Any]


def parse_url(url: str) -> PulsarURL:
    """Parse a Pulsar backend URL.

    Raises:
        ConfigError: another scheme, no host, or an unknown query parameter (the message
            shows the accepted forms).
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in _ADMIN_DEFAULTS or not parts.netloc:
        raise ConfigError(
            f"expected pulsar://host:port, pulsar+ssl://host:port, http://host:port or https://host:port "
            f"(a host list allowed, options as ?admin_url=...), got {url!r}"
        )
    query = {k: v[-1] for k, v in urllib.parse.parse_qs(parts.query).items()}
    unknown = set(query) - QUERY_OPTIONS
    if unknown:
        raise ConfigError(f"unknown pulsar URL option(s) {sorted(unknown)}; known: {sorted(QUERY_OPTIONS)}")
    first = parts.netloc.split(",")[0]
    default = _ADMIN_DEFAULTS[parts.scheme]
    if default is None:  # the web service: lookups and admin calls on the same URL
        admin = f"{parts.scheme}://{first}"
    else:
        host = first.rsplit(":", 1)[0] if not first.endswith("]") else first
        admin = f"{default[0]}://{host}:{default[1]}"
    tls: dict[str, Any] = {name: query[name] for name in TLS_PATHS if name in query}
    tls.update({name: flag(query[name]) for name in TLS_FLAGS if name in query})
    service = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
    return PulsarURL(service, admin, query, tls)


def admin_ssl_context(admin_url: str, client_options: Mapping[str, Any]) -> ssl.SSLContext | None:
    """The TLS context of admin calls to an ``https`` admin URL, from pulsar-client's TLS
    arguments as the Pulsar client gets them: the trusted CA file (else the system's), no
    verification with ``tls_allow_insecure_connection``, the host name checked only with
    ``tls_validate_hostname`` (pulsar-client's default is not to), and a client certificate
    for mutual TLS. None for an ``http`` admin URL.

    Raises:
        ConfigError: a certificate or key file that cannot be read.
    """
    if urllib.parse.urlsplit(admin_url).scheme != "https":
        return None
    try:
        context = ssl.create_default_context(cafile=client_options.get("tls_trust_certs_file_path") or None)
        if client_options.get("tls_allow_insecure_connection"):
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        else:
            context.check_hostname = bool(client_options.get("tls_validate_hostname"))
        certificate = client_options.get("tls_certificate_file_path")
        if certificate:
            context.load_cert_chain(certificate, client_options.get("tls_private_key_file_path") or None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"pulsar: the TLS files for {admin_url} cannot be used: {exc}") from exc
    return context
