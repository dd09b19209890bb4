"""Which source module reads which URL: :func:`open_source`.

The source modules are imported when a URL of theirs is opened, so that a job reading files
needs neither confluent-kafka nor pulsar-client. The plain-topic readers live beside their
backends (:mod:`idempotent.adapters.kafka.source`, :mod:`idempotent.adapters.pulsar.source`),
sharing each backend's one error translation; they depend on the mirror only through
:mod:`.source`, and nothing imports this module back from them.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from ..errors import ConfigError
from .source import Source

#: Broker URL schemes whose idempotent topics are read through a broker (:mod:`.topic`).
BROKER_SCHEMES = ("sqlite", "memory", "idem", "idems", "kafka", "pulsar")


def open_source(url: str) -> Source:
    """Open the source a URL names (see the table in :mod:`idempotent.mirror.source`).

    Raises:
        ConfigError: unknown scheme or malformed URL, or the client library is missing.
        BackendUnavailableError: the source could not be reached.
    """
    if not isinstance(url, str):
        raise ConfigError(f"a source URL must be a str, got {type(url).__name__}")
    scheme = urlsplit(url).scheme
    if scheme == "file":
        from .file import FileSource

        return FileSource(url)
    if scheme == "kafka+native":
        from idempotent.adapters.kafka.source import KafkaNativeSource

        return KafkaNativeSource(url)
    if scheme == "pulsar+native":
        from idempotent.adapters.pulsar.source import PulsarNativeSource

        return PulsarNativeSource(url)
    if scheme in BROKER_SCHEMES:
        from .topic import TopicSource

        return TopicSource(url)
    raise ConfigError(
        f"unknown source URL scheme {scheme!r} in {url!r}; use file://, kafka+native://, "
        "pulsar+native:// or a broker URL (sqlite://, memory://, idem://, idems://, kafka://, pulsar://)"
    )


__all__ = ["BROKER_SCHEMES", "open_source"]
