"""Brokers shared by the drop-in producers of one process.

An application written for confluent-kafka or pulsar-client may create several producers (or
clients) with the same broker URL and never close them. Opening one broker per producer would
fail for ``sqlite://`` (one writer per file) and waste resources elsewhere, so producers opened
from the same URL in one process share one broker, which is closed when the last of them is
closed (or garbage collected).
"""

from __future__ import annotations

import threading

from ..api import BrokerAPI

_LOCK = threading.Lock()
_BROKERS: dict[str, tuple[BrokerAPI, int]] = {}


def acquire(url: str) -> BrokerAPI:
    """Return the process's broker for ``url``, opening it on first use.

    Raises:
        ConfigError: bad URL (nothing opened).
        BackendUnavailableError: the backend could not be opened.
    """
    from .. import connect

    with _LOCK:
        entry = _BROKERS.get(url)
        if entry is None:
            broker = connect(url)
            _BROKERS[url] = (broker, 1)
            return broker
        _BROKERS[url] = (entry[0], entry[1] + 1)
        return entry[0]


def release(url: str) -> None:
    """Give back one reference; the broker is closed when the last one is returned."""
    with _LOCK:
        entry = _BROKERS.get(url)
        if entry is None:
            return
        broker, refs = entry
        if refs > 1:
            _BROKERS[url] = (broker, refs - 1)
            return
        del _BROKERS[url]
    broker.close()
