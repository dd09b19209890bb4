"""Is anything listening? A TCP check the network adapters make before they open clients.

The native clients take long to give up on an address where nothing listens: librdkafka
and the Pulsar C++ client retry until their request or operation timeout (30 s by
default) and then report a timeout that does not say why. The adapters first connect to
the addresses themselves, for at most ``connect_timeout`` seconds, so an unreachable
broker fails within that time, with a message that names the address, the reason and the
timeout. A port that answers is no proof of a working broker: the client's own timeouts
apply after this check.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence

from idempotent.errors import BackendUnavailableError, ConfigError

#: Seconds the adapters try to reach a broker's address before failing (their ``connect_timeout``).
DEFAULT_CONNECT_TIMEOUT = 10.0


def parse_addresses(netloc: str, default_port: int | None = None) -> list[tuple[str, int]]:
    """``host:port[,host:port...]`` (``[v6]:port`` for IPv6) as ``(host, port)`` pairs.

    Raises:
        ConfigError: an entry without a host, or with a port that is not a number (and no
            ``default_port``).
    """
    out: list[tuple[str, int]] = []
    for entry in netloc.split(","):
        entry = entry.strip().rpartition("://")[2]  # librdkafka's PROTOCOL://host:port
        host, colon, port = entry.rpartition(":")
        if not colon or (host.startswith("[") != host.endswith("]")) or entry.endswith("]"):
            host, port = entry, ""
        host = host.strip("[]")
        if not host:
            raise ConfigError(f"no host in {entry!r} of {netloc!r}: give host:port")
        if not port:
            if default_port is None:
                raise ConfigError(f"no port in {entry!r} of {netloc!r}: give host:port")
            out.append((host, default_port))
            continue
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"bad port {port!r} in {netloc!r}: give host:port with a port 1..65535")
        out.append((host, int(port)))
    return out


def check_connect_timeout(value: object) -> float:
    """A ``connect_timeout`` option as seconds.

    Raises:
        ConfigError: not a positive number.
    """
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"connect_timeout must be a number of seconds, got {value!r}") from None
    if not 0 < seconds < float("inf"):
        raise ConfigError(f"connect_timeout must be a positive number of seconds, got {value!r}")
    return seconds


def wait_reachable(what: str, addresses: Sequence[tuple[str, int]], connect_timeout: float) -> None:
    """Return once a TCP connection to one of ``addresses`` succeeds; try them in turn, again
    and again (a broker may be starting), for at most ``connect_timeout`` seconds.

    Raises:
        BackendUnavailableError: none answered in time; the first line names ``what``, the
            addresses, the last error and the timeout, and says what to do.
    """
    deadline = time.monotonic() + connect_timeout
    pause = 0.05
    last: OSError | None = None
    while True:
        for host, port in addresses:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                with socket.create_connection((host, port), timeout=left):
                    return
            except OSError as exc:
                last = exc
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(pause, left))
        pause = min(pause * 2, 1.0)
    where = ", ".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in addresses)
    reason = "timed out" if last is None or isinstance(last, TimeoutError) else (last.strerror or str(last))
    raise BackendUnavailableError(
        f"{what}: cannot connect to {where} within the connect timeout of {connect_timeout:g} s ({reason}); "
        "check that it runs there and the URL is right, or allow longer with connect_timeout "
        "(--connect-timeout on the command line)"
    )


__all__ = ["DEFAULT_CONNECT_TIMEOUT", "check_connect_timeout", "parse_addresses", "wait_reachable"]
