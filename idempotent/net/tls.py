"""TLS contexts for the broker server's listener and its clients (the standard ssl module).

Both sides speak TLS 1.2 or newer only. The server presents a certificate chain and, when
given a client CA, requires every client to present a certificate signed by it (mutual TLS).
The client verifies the server's certificate against a CA file (or the system's trust store)
and checks that it names the host the client connected to.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from idempotent.errors import ConfigError

MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2


def server_context(
    certfile: str | Path, keyfile: str | Path | None = None, *, client_ca: str | Path | None = None
) -> ssl.SSLContext:
    """A server-side context presenting ``certfile`` (PEM, the server certificate followed by
    any intermediates) with its private key ``keyfile`` (None: the key is in ``certfile``).
    With ``client_ca``, clients must present a certificate signed by a CA in that PEM file.

    Raises:
        ConfigError: a file is missing or unreadable, or the key does not match the certificate.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = MINIMUM_VERSION
    try:
        context.load_cert_chain(str(certfile), None if keyfile is None else str(keyfile))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the TLS certificate {str(certfile)!r} / key {str(keyfile)!r}: {exc}") from None
    if client_ca is not None:
        _load_ca(context, client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(
    cafile: str | Path | None = None,
    *,
    certfile: str | Path | None = None,
    keyfile: str | Path | None = None,
    check_hostname: bool = True,
) -> ssl.SSLContext:
    """A client-side context that trusts the CAs in ``cafile`` (None: the system's trust
    store) and checks the server's host name unless ``check_hostname`` is False. ``certfile``
    (and ``keyfile``) is the client's own certificate, for brokers that require one.

    Raises:
        ConfigError: a file is missing or unreadable.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = MINIMUM_VERSION
    context.check_hostname = check_hostname
    context.verify_mode = ssl.CERT_REQUIRED
    if cafile is None:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    else:
        _load_ca(context, cafile)
    if certfile is not None:
        try:
            context.load_cert_chain(str(certfile), None if keyfile is None else str(keyfile))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load the TLS client certificate {str(certfile)!r}: {exc}") from None
    return context


def _load_ca(context: ssl.SSLContext, cafile: str | Path) -> None:
    try:
        context.load_verify_locations(cafile=str(cafile))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the CA file {str(cafile)!r}: {exc}") from None


__all__ = ["MINIMUM_VERSION", "client_context", "server_context"]
