"""The network client: the Broker API against broker servers (``idem://``, ``idems://``).

:class:`RemoteBroker` talks to one broker server over one pipelined connection
(:mod:`idempotent.net.remote`, its connection in :mod:`idempotent.net.link`);
:class:`ClusterBroker` to several brokers over one backend, following each partition's owner
(:mod:`idempotent.net.cluster`). ``idempotent.connect`` picks one from the URL.
"""

from __future__ import annotations

from idempotent.net.cluster import ClusterBroker, parse_bootstrap
from idempotent.net.remote import DEFAULT_PORT, RemoteBroker, parse_url

__all__ = ["DEFAULT_PORT", "ClusterBroker", "RemoteBroker", "parse_bootstrap", "parse_url"]
