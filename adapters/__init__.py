"""Log backends: one module per storage system, each implementing ``idempotent.backend.LogBackend``.

``open_backend(url)`` picks the adapter by URL scheme and imports it lazily, so optional
client libraries (confluent-kafka, pulsar-client) are needed only when used.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from idempotent.backend import LogBackend
from idempotent.errors import ConfigError

SCHEMES = {
    "memory": ("adapters.memory", "MemoryBackend", None),
    "sqlite": ("adapters.sqlite", "SQLiteBackend", None),
    "kafka": ("adapters.kafka", "KafkaBackend", "kafka"),
    "pulsar": ("adapters.pulsar", "PulsarBackend", "pulsar"),
    # Pulsar's other service URLs, as pulsar-client takes them: TLS, and lookups over HTTP(S)
    "pulsar+ssl": ("adapters.pulsar", "PulsarBackend", "pulsar"),
    "http": ("adapters.pulsar", "PulsarBackend", "pulsar"),
    "https": ("adapters.pulsar", "PulsarBackend", "pulsar"),
}


def open_backend(url: str, **options: Any) -> LogBackend:
    """Open the backend a URL names (``memory://``, ``sqlite:///path``, ``kafka://``, ``pulsar://``;
    Pulsar's ``pulsar+ssl://``, ``http://`` and ``https://`` service URLs too).

    Raises:
        ConfigError: unknown scheme, malformed URL, or the adapter's client library is missing.
    """
    if not isinstance(url, str):
        raise ConfigError(f"backend URL must be a str, got {type(url).__name__}")
    scheme = urlsplit(url).scheme
    if scheme not in SCHEMES:
        raise ConfigError(f"unknown backend URL scheme {scheme!r} in {url!r}; use one of {sorted(SCHEMES)}")
    module_name, class_name, extra = SCHEMES[scheme]
    try:
        module = __import__(module_name, fromlist=[class_name])
    except ImportError as exc:
        hint = f" (pip install 'idempotent[{extra}]')" if extra else ""
        raise ConfigError(f"the {scheme} backend needs a missing library: {exc}{hint}") from exc
    backend: LogBackend = getattr(module, class_name)(url, **options)
    return backend
