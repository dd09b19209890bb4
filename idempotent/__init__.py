"""idempotent: exactly-once publishing with a broker-side sequence checker.

The broker assigns each producer an id and an epoch; the producer numbers its records per
partition; the broker's checker stores a batch only when its first sequence follows the last
one stored, answers resends as duplicates with their original offsets, and refuses gaps.
SQLite (embedded default), Kafka and Pulsar serve as the durable log underneath.

    >>> import idempotent
    >>> with idempotent.Producer("memory://") as producer:
    ...     producer.send("events", b"hello").result().offset
    0
"""

from typing import Any as _Any

from ._checker import CheckerConfig, Policy
from ._outcomes import DeliveryStatus, Outcome, ProduceResult, RecordMetadata
from ._ownership import Lease
from ._records import Record, StoredRecord
from ._request import ProduceRequest
from ._types import TopicPartition
from .aio import AsyncProducer
from .api import BrokerAPI
from .broker import Broker, BrokerConfig, PartitionStats, ProducerSession
from .dedup import DuplicateFilter, DuplicateVerdict
from .delivery import DeliveryFuture
from .errors import (
    BackendUnavailableError,
    BrokerError,
    ConfigError,
    DeliveryFailed,
    DeliveryTimeoutError,
    InternalError,
    InvalidBatchError,
    InvalidTopicError,
    NotOwnerError,
    PartitionRecoveringError,
    ProducerClosedError,
    ProducerError,
    ProducerFencedError,
    QueueFullError,
    ReadTimeoutError,
    Recovery,
    RequestTimeoutError,
    SequenceDesyncError,
    TransportError,
    UnknownProducerError,
    UsageError,
)
from .producer import Deliveries, Producer, SendManyFuture
from .reader import Message, MessageId, Reader
from .state import SqliteCheckpoint

__version__ = "0.1.0"


def connect(url: str, config: BrokerConfig | None = None, **options: _Any) -> BrokerAPI:
    """Open a broker over the backend a URL names.

    URLs: ``memory://[name]`` (in-process, with fault injection), ``sqlite:///file.db`` (the
    embedded durable default), ``kafka://host:port`` and ``pulsar://host:port``: an in-process
    broker over that backend, ``options`` go to the backend adapter. ``idem://host:port``
    (``idems://`` over TLS): a broker server (``idempotent broker``), through a
    :class:`~idempotent.client.RemoteBroker`; ``options`` are its options (``token``,
    ``timeout``, ``cafile``, ...) and ``config`` must be None. ``idem://h1:p1,h2:p2``:
    several brokers over one backend, through a :class:`~idempotent.client.ClusterBroker`
    that routes each partition to its owner.

    Raises:
        ConfigError: unknown scheme, bad URL, or the backend's client library is missing.
        BackendUnavailableError: the backend could not be opened.
        BrokerConnectionError: the broker server could not be reached.
        AuthenticationError: the broker server refused the token.
    """
    if url.startswith(("idem://", "idems://")):
        from .client import ClusterBroker, RemoteBroker

        if config is not None:
            raise ConfigError("a BrokerConfig applies to in-process brokers; configure the broker server instead")
        if "," in url:  # a list of brokers sharing one backend (docs/clustering.md)
            return ClusterBroker(url, **options)
        return RemoteBroker(url, **options)
    from adapters import open_backend

    return Broker(open_backend(url, **options), config)


__all__ = [
    "AsyncProducer",
    "BackendUnavailableError",
    "Broker",
    "BrokerAPI",
    "BrokerConfig",
    "BrokerError",
    "CheckerConfig",
    "ConfigError",
    "Deliveries",
    "DeliveryFailed",
    "DeliveryFuture",
    "DeliveryStatus",
    "DeliveryTimeoutError",
    "DuplicateFilter",
    "DuplicateVerdict",
    "InternalError",
    "InvalidBatchError",
    "InvalidTopicError",
    "Lease",
    "Message",
    "MessageId",
    "NotOwnerError",
    "Outcome",
    "PartitionRecoveringError",
    "PartitionStats",
    "Policy",
    "ProduceRequest",
    "ProduceResult",
    "Producer",
    "ProducerClosedError",
    "ProducerError",
    "ProducerFencedError",
    "ProducerSession",
    "QueueFullError",
    "ReadTimeoutError",
    "Reader",
    "Record",
    "RecordMetadata",
    "Recovery",
    "RequestTimeoutError",
    "SendManyFuture",
    "SequenceDesyncError",
    "SqliteCheckpoint",
    "StoredRecord",
    "TopicPartition",
    "TransportError",
    "UnknownProducerError",
    "UsageError",
    "__version__",
    "connect",
]
