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

import typing as _typing

from idempotent.connection import connect
from idempotent.core.outcomes import DeliveryStatus, Outcome, ProduceResult, RecordMetadata
from idempotent.core.records import Record, StoredRecord
from idempotent.core.request import ProduceRequest
from idempotent.core.types import TopicPartition
from idempotent.core.values import PartitionStats, ProducerSession
from idempotent.producer.delivery import DeliveryFuture
from idempotent.producer.producer import Deliveries, Producer, SendManyFuture

from .api import BrokerAPI
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

if _typing.TYPE_CHECKING:
    from idempotent.broker.broker import Broker, BrokerConfig
    from idempotent.consumer.dedup import DuplicateFilter, DuplicateVerdict
    from idempotent.consumer.reader import Message, MessageId, Reader
    from idempotent.consumer.state import SqliteCheckpoint
    from idempotent.core.checker import CheckerConfig, Policy
    from idempotent.core.ownership import Lease
    from idempotent.producer.aio import AsyncProducer

#: public names imported on first use, each with its module: a producer needs none of them,
#: and they bring asyncio, the in-process broker and its checker, the reader and SQLite state
_LAZY = {
    "AsyncProducer": "producer.aio",
    "Broker": "broker.broker",
    "BrokerConfig": "broker.broker",
    "CheckerConfig": "core.checker",
    "DuplicateFilter": "consumer.dedup",
    "DuplicateVerdict": "consumer.dedup",
    "Lease": "core.ownership",
    "Message": "consumer.reader",
    "MessageId": "consumer.reader",
    "Policy": "core.checker",
    "Reader": "consumer.reader",
    "SqliteCheckpoint": "consumer.state",
}


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__version__ = "0.1.0"


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
