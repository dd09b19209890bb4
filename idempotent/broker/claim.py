"""Becoming the backend's writer, and what a broker must forget when it does.

A backend written by one process at a time (SQLite: a file another process may have written
until now) says through ``claim_writer`` whether this broker just became its writer. Then
everything the broker read before is stale: the producer records, the topics, the settings and
every partition's checker are rebuilt from what is stored now, never from what was cached while
another process wrote. A :class:`~idempotent.broker.broker.Broker` claims before it decides on a write.

Locks: the claim has its own lock (one claim at a time); the broker's lock, given in, is held
while the cached records, topics and settings are replaced, and released before the partitions
are forgotten (partition locks come before the broker lock).
"""

from __future__ import annotations

import threading

from idempotent.backend import LogBackend
from idempotent.broker.partitions import PartitionMap
from idempotent.broker.producers import ProducerRecords
from idempotent.broker.settings import BrokerSettings
from idempotent.broker.topics import TopicDirectory


class WriterClaim:
    """Whether a broker is its backend's writer (:attr:`claimed`), and :meth:`claim`.
    Thread-safe."""

    def __init__(
        self,
        backend: LogBackend,
        lock: threading.RLock,
        producers: ProducerRecords,
        topics: TopicDirectory,
        settings: BrokerSettings,
        partitions: PartitionMap,
    ) -> None:
        self._backend = backend
        self._lock = lock
        self._producers = producers
        self._topics = topics
        self._settings = settings
        self._partitions = partitions
        self._claim_lock = threading.Lock()
        #: the backend confirmed this broker as its writer (read without a lock)
        self.claimed = False

    def claim(self) -> None:
        """Become the backend's writer, rebuilding what the broker cached when the backend
        says it just became it (see the module docstring). Nothing once claimed.

        Raises:
            ConfigError: another live process writes the backend (SQLite); not claimed.
            BackendUnavailableError: the backend failed; not claimed (the caches are left as
                they were, or partly replaced when the failure came after the claim).
        """
        if self.claimed:
            return
        with self._claim_lock:
            if self.claimed:
                return
            backend = self._backend
            if backend.claim_writer():
                records = backend.load_producers()
                settings = dict(backend.load_settings())
                topics = dict(backend.list_topics())
                with self._lock:
                    self._producers.replace(records)
                    self._topics.replace(topics)
                    self._settings.replace(settings)
                self._partitions.forget_all()  # (outside the broker lock: partition locks come first)
            self.claimed = True
