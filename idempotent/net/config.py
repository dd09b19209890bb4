"""The broker server's settings and hooks: :class:`ServerConfig`, the authentication and
authorization hooks and their defaults, and the parsing of ``--listen`` and TLS files.
Re-exported by :mod:`idempotent.net.server`.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any, Protocol

import attrs

import idempotent.core.protocol as wire
import idempotent.net.tls as tls
from idempotent.core.registry import ProducerRecord
from idempotent.errors import ConfigError
from idempotent.net.auth import ANONYMOUS


class Authenticator(Protocol):
    """Turns the handshake's token into a principal; raises AuthenticationError to refuse.

    It runs on a worker thread before any other request of the connection, so it may block.
    """

    def __call__(self, token: str | None) -> object: ...


class Authorizer(Protocol):
    """Sees every request (after the handshake) before it runs; raises (for example
    AuthorizationError) to refuse it. ``args`` are the validated arguments of ``op``."""

    def __call__(self, principal: object, op: str, args: Mapping[str, Any]) -> None: ...


class Claimer(Protocol):
    """Decides, under the broker lock, whether ``principal`` may initialise ``producer_name``
    (None: an anonymous producer) whose current record is ``previous`` (None when new), and
    returns the principal name to record as its owner; raises (AuthorizationError) to refuse.
    See :meth:`idempotent.net.auth.AccessPolicy.claim`."""

    def __call__(self, principal: object, producer_name: str | None, previous: ProducerRecord | None) -> str | None: ...


def allow_anonymous(token: str | None) -> object:
    """The default authenticator: every connection is :data:`ANONYMOUS`, tokens are ignored."""
    return ANONYMOUS


def allow_all(principal: object, op: str, args: Mapping[str, Any]) -> None:
    """The default authorizer: everything is allowed."""


@attrs.frozen
class ServerConfig:
    """Limits of a broker server.

    Attributes:
        max_frame: largest frame body accepted (and announced in ``hello``).
        max_in_flight: unanswered requests per connection before it stops being read.
        max_pending: unanswered requests over all connections before the server stops reading.
        lanes: threads that submit produce requests (a partition always uses the same one).
        workers: threads for every other request but ``hello`` and ``ping``.
        control_workers: threads for ``hello`` and ``ping``.
        read_chunk: most records one ``read`` fetches from the backend (a client asking for
            more gets fewer and asks again).
        handshake_timeout: seconds a new connection has to complete ``hello``.
        idle_timeout: seconds a connection may stay silent with nothing in flight.
        frame_timeout: seconds a started frame may take to arrive completely (slow senders).
        drain_timeout: seconds ``close`` waits for in-flight requests to be answered.
    """

    max_frame: int = wire.DEFAULT_MAX_FRAME
    max_in_flight: int = 64
    max_pending: int = 4096
    lanes: int = 4
    workers: int = 8
    control_workers: int = 2
    read_chunk: int = 1000
    handshake_timeout: float = 10.0
    idle_timeout: float = 300.0
    frame_timeout: float = 30.0
    drain_timeout: float = 30.0

    def __attrs_post_init__(self) -> None:
        if self.max_frame < 1024 or self.max_in_flight < 1 or self.max_pending < 1:
            raise ConfigError("max_frame must be at least 1024, max_in_flight and max_pending at least 1")
        if self.lanes < 1 or self.workers < 1 or self.control_workers < 1 or self.read_chunk < 1:
            raise ConfigError("lanes, workers, control_workers and read_chunk must be at least 1")


def parse_listen(text: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) -> (host, port). Raises ConfigError."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"expected host:port, got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def server_ssl_context(certfile: str, keyfile: str | None = None, cafile: str | None = None) -> ssl.SSLContext:
    """A TLS server context from a certificate chain and key; with ``cafile``, clients must
    present a certificate signed by it (see :func:`idempotent.net.tls.server_context`).
    Raises ConfigError when the files cannot be loaded."""
    return tls.server_context(certfile, keyfile, client_ca=cafile or None)


__all__ = [
    "Authenticator",
    "Authorizer",
    "Claimer",
    "ServerConfig",
    "allow_all",
    "allow_anonymous",
    "parse_listen",
    "server_ssl_context",
]
