"""A :class:`~idempotent.backend.LogBackend` wrapper that never writes (``tail``, ``stats``, ``admin`` reads)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import NoReturn

from idempotent.backend import AppendBatch, LogBackend
from idempotent.broker.broker import Broker, BrokerConfig
from idempotent.core.ownership import Lease
from idempotent.core.records import Snapshot, StoredBatch, StoredRecord
from idempotent.core.registry import ProducerRecord
from idempotent.errors import ConfigError, UsageError


class ReadOnlyBackend:
    """A :class:`~idempotent.backend.LogBackend` wrapper that never writes.

    Reads pass through. Derived state a broker persists on its own (checker snapshots,
    producer records flagged after expiry) is dropped; writes of data, topics, producer ids
    or settings are refused.
    """

    def __init__(self, inner: LogBackend) -> None:
        self.inner = inner
        self.url = inner.url
        self.durable = inner.durable

    def _refuse(self, what: str) -> NoReturn:
        raise UsageError(f"{self.url} is opened read-only: cannot {what}")

    def list_topics(self) -> dict[str, int]:
        return self.inner.list_topics()

    def describe_topic(self, topic: str) -> int | None:
        return self.inner.describe_topic(topic)

    def create_topic(self, topic: str, partitions: int) -> int:
        self._refuse(f"create topic {topic!r}")

    def delete_topic(self, topic: str) -> None:
        self._refuse(f"delete topic {topic!r}")

    def append(self, topic: str, partition: int, batch: AppendBatch, snapshot: Snapshot | None) -> Future[int]:
        self._refuse(f"append to {topic}[{partition}]")

    def read(self, topic: str, partition: int, offset: int, max_records: int) -> list[StoredRecord]:
        return self.inner.read(topic, partition, offset, max_records)

    def replay(self, topic: str, partition: int, from_offset: int) -> Iterator[StoredBatch]:
        return self.inner.replay(topic, partition, from_offset)

    def end_offset(self, topic: str, partition: int) -> int:
        return self.inner.end_offset(topic, partition)

    def latest_snapshot(self, topic: str, partition: int) -> Snapshot | None:
        return self.inner.latest_snapshot(topic, partition)

    def write_snapshot(self, topic: str, partition: int, snapshot: Snapshot) -> None:
        return None

    def allocate_producer_ids(self, count: int) -> int:
        self._refuse("allocate producer ids")

    def load_producers(self) -> list[ProducerRecord]:
        return self.inner.load_producers()

    def save_producer(self, record: ProducerRecord) -> None:
        return None

    def delete_producers(self, producer_ids: Sequence[int]) -> None:
        return None

    def load_settings(self) -> dict[str, str]:
        return self.inner.load_settings()

    def save_setting(self, key: str, value: str | None) -> None:
        self._refuse("change settings")

    def load_leases(self) -> list[Lease]:
        return self.inner.load_leases()

    def propose_leases(self, proposals: Sequence[Lease]) -> list[Lease | None]:
        self._refuse("claim partitions")

    @property
    def max_record_bytes(self) -> int | None:
        return self.inner.max_record_bytes

    @property
    def max_batch_bytes(self) -> int | None:
        return self.inner.max_batch_bytes

    def claim_writer(self) -> bool:
        return False  # writers are per partition (see LogBackend.claim_writer)

    def release(self, topic: str, partition: int) -> None:
        return None

    def close(self) -> None:
        self.inner.close()


def open_read_only_broker(url: str, **options: object) -> Broker:
    """An in-process broker over the backend ``url`` names that never writes to it.

    The backend is wrapped in :class:`ReadOnlyBackend`; Kafka and Pulsar are also opened with
    ``read_only=True``, so no partition is taken over from a writer, and no topic is created.
    ``options`` go to the adapter (``connect_timeout`` ...).

    Raises:
        ConfigError: bad URL, or a ``sqlite://`` URL of a file that does not exist.
        BackendUnavailableError: the backend could not be opened.
    """
    from urllib.parse import urlsplit

    from idempotent.adapters import open_backend

    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        import os

        from idempotent.adapters.sqlite.backend import parse_sqlite_url

        path, _ = parse_sqlite_url(url)
        if not os.path.exists(path):
            raise ConfigError(f"no database file {path!r} (from {url})")
    served = ("kafka", "pulsar", "pulsar+ssl", "http", "https")  # Kafka's and Pulsar's URLs
    if scheme in served:
        options = {**options, "read_only": True}
    backend = ReadOnlyBackend(open_backend(url, **options))
    try:
        return Broker(backend, BrokerConfig(auto_create_topics=False, maintenance_interval=0))
    except BaseException:
        backend.close()
        raise
