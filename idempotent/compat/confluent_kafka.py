"""A drop-in for confluent-kafka's ``Producer``: exactly-once publishing by changing one import.

::

    from idempotent.compat import confluent_kafka   # instead of: import confluent_kafka

    producer = confluent_kafka.Producer({"bootstrap.servers": "kafka:9092", "transactional.id": "orders"})
    producer.produce("orders", value=b"...", key=b"customer-7", on_delivery=report)
    producer.poll(0)
    producer.flush()

Records go into the Kafka cluster ``bootstrap.servers`` names, with the application's
connection settings (``security.protocol``, ``sasl.*``, ``ssl.*``...), through a producer of
this project that checks and writes its own records (no broker server; any number of processes
write one topic at once, each exactly once). ``idempotent.broker.url`` (or the environment
variable ``IDEMPOTENT_BROKER_URL``) sends them anywhere else a broker URL names
(``sqlite:///file.db``, ``idem://host:port``, ``pulsar://...``). ``transactional.id`` names
the producer: a restarted instance fences the older one and continues its sequences.

As with librdkafka, the constructor never waits for the cluster, and delivery reports
(``on_delivery(err, msg)``) are served only from :meth:`Producer.poll` and
:meth:`Producer.flush`, in the calling thread; :meth:`Producer.produce` raises ``BufferError``
when ``queue.buffering.max.messages`` messages (or ``queue.buffering.max.kbytes``) wait for
their report. Errors are :class:`KafkaError` objects with librdkafka's codes and names, plus
the message's :class:`MessageStatus` (persisted, not persisted, possibly persisted).

Extensions: ``produce(..., sequence=N)`` and ``Producer.last_sequence(topic, partition)`` (a
restarted application's resends are recognised as duplicates, as PIP-6's sequence ids are),
``msg.status()``, ``msg.sequence()``, ``msg.duplicate()``. ``aio.AIOProducer`` is the drop-in's
asyncio producer (``_kafka_aio``). Every other name of confluent-kafka (``Consumer``,
``AdminClient``, ``TopicPartition``, the other submodules ...) is passed through from the
installed module; ``KafkaException`` is confluent-kafka's own class. See
``docs/migration.md`` for every setting and method.

The implementation lives in ``_kafka_config`` (settings), ``_kafka_errors``, ``_kafka_message``,
``_kafka_reports`` (delivery reports), ``_kafka_connect`` (connecting in the background),
``_kafka_producer`` and ``_kafka_consumer`` (the passed-through consumers' ``consume()``).
"""

from __future__ import annotations

from typing import Any

from . import _shared
from ._kafka_config import ENV_BROKER_URL
from ._kafka_consumer import route_consumer_attribute
from ._kafka_errors import KafkaError, KafkaException, MessageStatus, kafka_error_for
from ._kafka_message import (
    OFFSET_INVALID,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    Message,
)
from ._kafka_producer import Producer, SerializingProducer
from ._partitioners import consistent, fnv1a, murmur2

__all__ = [
    "ENV_BROKER_URL",
    "OFFSET_BEGINNING",
    "OFFSET_END",
    "OFFSET_INVALID",
    "OFFSET_STORED",
    "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_LOG_APPEND_TIME",
    "TIMESTAMP_NOT_AVAILABLE",
    "KafkaError",
    "KafkaException",
    "Message",
    "MessageStatus",
    "Producer",
    "SerializingProducer",
    "consistent",
    "fnv1a",
    "kafka_error_for",
    "libversion",
    "murmur2",
    "version",
]

OFFSET_BEGINNING = -2
OFFSET_END = -1
OFFSET_STORED = -1000

_NATIVE = "confluent_kafka"

# ``import idempotent.compat.confluent_kafka.admin`` (and every other submodule) is the native one
__path__: list[str] = []
_shared.pass_through_submodules(
    __name__,
    _NATIVE,
    route_consumer_attribute,
    own={"aio": "idempotent.compat._kafka_aio", "aio.producer": "idempotent.compat._kafka_aio"},
)


def __getattr__(name: str) -> Any:
    """The rest of confluent-kafka (``Consumer``, ``AdminClient``, ``TopicPartition``,
    ``admin``, ``serialization``, ...), passed through from the installed module. Its client
    classes log into Python logging unless given a ``logger`` (see
    :func:`idempotent.runtime.native_logs.route_kafka_attribute`), and its consumers' ``consume()``
    stops for Ctrl-C (see :mod:`idempotent.compat._kafka_consumer`)."""
    return _shared.native_attribute(__name__, _NATIVE, name, route_consumer_attribute)


def version() -> str:
    """This drop-in's version string (confluent-kafka's ``version()`` is its own)."""
    from .. import __version__

    return __version__


def libversion() -> tuple[str, int]:
    """``(version string, version int)`` as librdkafka's ``rd_kafka_version()`` shapes them
    (``0xMMmmrrpp``); these are this drop-in's."""
    text = version()
    major, minor, patch = (int(x) for x in text.split(".")[:3])
    return text, major << 24 | minor << 16 | patch << 8 | 0xFF
