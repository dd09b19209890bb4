"""Shared fixtures: backend harnesses for the conformance suite."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

import idempotent
from idempotent.adapters import open_backend
from idempotent.adapters.memory import reset_store
from idempotent.broker.broker import Broker, BrokerConfig
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


@attrs.define
class ServiceHarness:
    """Harness for a backend served by a real broker process (Kafka, Pulsar)."""

    url: str
    service: str
    options: dict[str, object] = attrs.field(factory=dict)
    durable: bool = True

    def open(self, config: BrokerConfig | None = None, faults: LinkFaults | None = None) -> Broker:
        if faults is not None:
            return FaultyBroker(open_backend(self.url, **self.options), config, faults)
        return idempotent.connect(self.url, config, **self.options)

    def restart_backend(self) -> None:
        from idempotent.testing import services

        services.restart(self.service)


def _session_service(name: str) -> Iterator[object]:
    """Start a real broker for the session; leave one that someone started by hand running."""
    from idempotent.testing import services
    from idempotent.testing.services import kafka_cluster

    if name == kafka_cluster.NAME:
        status, up, down = kafka_cluster.status, kafka_cluster.up, kafka_cluster.down
    else:
        status, up, down = (lambda: services.status(name)), (lambda: services.up(name)), (lambda: services.down(name))
    already_running = status() is not None
    info = up()
    yield info
    if not already_running:
        down()


@pytest.fixture(scope="session")
def kafka_service() -> Iterator[object]:
    """A real single-node Kafka (KRaft), started by the project itself."""
    yield from _session_service("kafka")


@pytest.fixture(scope="session")
def kafka_cluster_service() -> Iterator[object]:
    """A real 3-node replicated Kafka cluster (KRaft, RF 3, min ISR 2), started by the project
    itself: an ``idempotent.testing.services.kafka_cluster.ClusterInfo``. A test that injects faults
    (``kafka_cluster.kill9``, ``pause``, ...) calls ``kafka_cluster.heal()`` when it ends."""
    yield from _session_service("kafka-cluster")


@pytest.fixture(scope="session")
def pulsar_service() -> Iterator[object]:
    """A real Pulsar standalone broker, started by the project itself."""
    yield from _session_service("pulsar")


def ctrl_c_while_retaking(cond: threading.Condition) -> list[BaseException]:
    """Ctrl-C (SIGINT) reaches the main thread while its ``cond.wait()`` has timed out and
    waits to take the lock back from another thread. Returns what that other thread raised
    when it released the lock: nothing, unless the interrupted wait gave the lock up and the
    main thread's ``with`` released the lock the other thread held."""
    import signal

    assert threading.current_thread() is threading.main_thread()
    # Ctrl-C must raise KeyboardInterrupt here, whatever handler an earlier test left installed
    # (signal.signal also puts the interpreter's own C handler back in place)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _ctrl_c_while_retaking(cond)
    finally:
        signal.signal(signal.SIGINT, previous)


def _ctrl_c_while_retaking(cond: threading.Condition) -> list[BaseException]:
    import os
    import signal
    import time

    entered, errors = threading.Event(), []

    def holder() -> None:
        entered.wait()
        try:
            with cond:  # taken while the main thread waits, held past its timeout and the signal
                time.sleep(0.6)
        except BaseException as exc:
            errors.append(exc)

    other = threading.Thread(target=holder)
    other.start()
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    interrupted = False
    try:
        with cond:
            entered.set()
            cond.wait(0.1)
            time.sleep(1.0)  # the signal arrived during the wait's re-acquire, if not before
    except KeyboardInterrupt:
        interrupted = True
    other.join()
    timer.join()
    assert interrupted
    return errors
