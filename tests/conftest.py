"""Shared fixtures: backend harnesses for the conformance suite."""

from __future__ import annotations

import uuid
from pathlib import Path

import attrs

import idempotent
from adapters import open_backend
from adapters.memory import reset_store
from idempotent.broker import Broker, BrokerConfig
from idempotent.testing.faults import FaultyBroker, LinkFaults


@attrs.define
class LocalHarness:
    """Harness for the embedded backends (memory, sqlite)."""

    url: str
    durable: bool

    def open(self, config: BrokerConfig | None = None, faults: LinkFaults | None = None) -> Broker:
        if faults is not None:
            return FaultyBroker(open_backend(self.url), config, faults)
        return idempotent.connect(self.url, config)

    def restart_backend(self) -> None:
        """Nothing to restart: the store lives in this process or in a file."""


def memory_harness() -> LocalHarness:
    name = uuid.uuid4().hex
    reset_store(name)
    return LocalHarness(f"memory://{name}", durable=False)


def sqlite_harness(tmp_path: Path) -> LocalHarness:
    return LocalHarness(f"sqlite:///{tmp_path / 'log.db'}", durable=True)
