"""How the conformance suites open brokers over one backend, and the configs they use.

A backend's test module gives a :class:`Harness` (a few lines, see
:mod:`idempotent.testing.conformance`); both suites (:class:`~idempotent.testing.conformance.BackendConformance`
and the storage contract's :class:`~idempotent.testing.conformance_storage.StorageConformance`)
open every broker through it.
"""

from __future__ import annotations

import uuid
from typing import Any, Protocol

import attrs

from idempotent.broker.broker import Broker, BrokerConfig
from idempotent.core.checker import CheckerConfig

from .faults import LinkFaults


class Harness(Protocol):
    """How the suite opens brokers over one backend."""

    #: backend URL shared by every broker a test opens
    url: str
    #: True when acknowledged data survives a crash of the checker process
    durable: bool

    def open(self, config: BrokerConfig | None = None, faults: LinkFaults | None = None) -> Broker:
        """A new broker over the same stored data."""
        ...

    def restart_backend(self) -> None:
        """Restart the storage service itself (a no-op where there is none)."""
        ...


def small_config(**checker: Any) -> BrokerConfig:
    """A broker config with small snapshot intervals, to exercise snapshot + replay."""
    options: dict[str, Any] = {"snapshot_entries": 3, "snapshot_seconds": 3600.0}
    options.update(checker)
    return BrokerConfig(checker=CheckerConfig(**options), maintenance_interval=0)


def cluster_config(broker_id: str, lease_duration: float = 1.0, **checker: Any) -> BrokerConfig:
    """:func:`small_config` for one of several brokers over one backend (short leases)."""
    return attrs.evolve(
        small_config(**checker),
        broker_id=broker_id,
        advertised_address=f"{broker_id}.example:9092",
        lease_duration=lease_duration,
    )


def topic_name(prefix: str = "t") -> str:
    """A unique topic name, so tests on a shared external cluster never collide."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"
