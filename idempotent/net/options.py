"""The options of a client of a broker server (``idem://``, ``idems://``): its credentials and
TLS settings. Kept apart from the client so :mod:`idempotent.connection` can name them without
importing it."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    import ssl


class ClientOptions(TypedDict, total=False):
    """The credentials and TLS options of a :class:`~idempotent.net.remote.RemoteBroker` (see
    there), which a :class:`~idempotent.net.client.ClusterBroker` passes to each broker's client."""

    token: str | None
    cafile: str | None
    verify: bool
    certfile: str | None
    keyfile: str | None
    ssl_context: ssl.SSLContext | None
    client_name: str | None


__all__ = ["ClientOptions"]
