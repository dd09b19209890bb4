"""Log backends: one module per storage system, each implementing ``idempotent.backend.LogBackend``.

``open_backend(url)`` picks the adapter by URL scheme and imports it lazily, so optional
client libraries (confluent-kafka, pulsar-client) are needed only when used.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from idempotent.backend import LogBackend
from idempotent.errors import ConfigError

#: Every URL the project takes, for messages that say what to use instead of a bad one.
URL_FORMS = (
    "sqlite:///relative.db or sqlite:////absolute.db",
    "memory://[name]",
    "kafka://host:port",
    "pulsar://host:port (also pulsar+ssl://, http://, https://)",
    "idem://host:port or idems://host:port (a broker server)",
)
#: Plain (not idempotent) topics, read by ``idempotent mirror`` and ``idempotent tail``.
NATIVE_URL_FORMS = ("kafka+native://host:port", "pulsar+native://host:port[?admin_url=...]")
#: Network schemes whose adapters take ``connect_timeout`` (see :mod:`idempotent.adapters.reach`).
NETWORK_SCHEMES = ("kafka", "pulsar", "pulsar+ssl", "http", "https")

SCHEMES = {
    "memory": ("idempotent.adapters.memory", "MemoryBackend", None),
    "sqlite": ("idempotent.adapters.sqlite.backend", "SQLiteBackend", None),
    "kafka": ("idempotent.adapters.kafka.backend", "KafkaBackend", "kafka"),
    "pulsar": ("idempotent.adapters.pulsar.backend", "PulsarBackend", "pulsar"),
    # Pulsar's other service URLs, as pulsar-client takes them: TLS, and lookups over HTTP(S)
    "pulsar+ssl": ("idempotent.adapters.pulsar.backend", "PulsarBackend", "pulsar"),
    "http": ("idempotent.adapters.pulsar.backend", "PulsarBackend", "pulsar"),
    "https": ("idempotent.adapters.pulsar.backend", "PulsarBackend", "pulsar"),
}


def unknown_scheme_message(url: str, *, native: bool = False) -> str:
    """The message for a URL whose scheme the project does not know: what it got, and every
    form it takes (with the plain-topic forms of ``mirror`` and ``tail`` when ``native``)."""
    scheme = urlsplit(url).scheme
    forms = ", ".join(URL_FORMS + (NATIVE_URL_FORMS if native else ()))
    got = f"unknown URL scheme {scheme!r}" if scheme else "no URL scheme"
    tail = "" if native else f"; mirror and tail also read plain topics: {', '.join(NATIVE_URL_FORMS)}"
    return f"{got} in {url!r}: use {forms}{tail}"


def open_backend(url: str, **options: Any) -> LogBackend:
    """Open the backend a URL names (``memory://``, ``sqlite:///path``, ``kafka://``, ``pulsar://``;
    Pulsar's ``pulsar+ssl://``, ``http://`` and ``https://`` service URLs too).

    Raises:
        ConfigError: unknown scheme (the message lists every URL form), a broker server's
            URL (``idem://``), malformed URL, or the adapter's client library is missing.
    """
    if not isinstance(url, str):
        raise ConfigError(f"backend URL must be a str, got {type(url).__name__}")
    scheme = urlsplit(url).scheme
    if scheme in ("idem", "idems"):
        raise ConfigError(
            f"{url!r} names a broker server, not a backend: open it with idempotent.connect(url), "
            "or give a backend URL (sqlite://, memory://, kafka://, pulsar://)"
        )
    if scheme not in SCHEMES:
        raise ConfigError(unknown_scheme_message(url))
    module_name, class_name, extra = SCHEMES[scheme]
    try:
        module = __import__(module_name, fromlist=[class_name])
    except ImportError as exc:
        hint = f" (pip install 'idempotent[{extra}]')" if extra else ""
        raise ConfigError(f"the {scheme} backend needs a missing library: {exc}{hint}") from exc
    backend: LogBackend = getattr(module, class_name)(url, **options)
    return backend
