"""The consumers the confluent-kafka drop-in passes through: a ``consume()`` Ctrl-C stops, and
the messages as the application wrote them.

confluent-kafka's ``Consumer.consume()`` waits inside librdkafka for its whole timeout (for
ever with the default ``timeout=-1``), so a ``KeyboardInterrupt`` only arrives when it returns;
its ``poll()`` already wakes up for signals. The drop-in's consumer classes (``Consumer`` and
its subclasses in confluent-kafka, each already routed into Python logging by
:func:`idempotent.runtime.native_logs.route_kafka_attribute`) wait in slices of
:data:`CONSUME_SLICE` seconds instead, so the interpreter runs its signal handlers between
slices. What ``consume()`` returns is unchanged: up to ``num_messages`` messages, as soon as
that many arrived or the timeout passed.

The messages ``poll()`` and ``consume()`` return carry only the headers the application set:
the identity headers the project adds to the first record of each batch (``idem.pid``,
``idem.epoch``, ``idem.seq``, ``idem.count``, ``idem.timed``; see
:mod:`idempotent.adapters.kafka.heads`) are taken off, so a message produced through the
drop-in reads back through the drop-in as the application wrote it (``headers()`` is None when
it set none). Consumers of confluent-kafka itself, and other Kafka clients, still see them.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from idempotent.runtime.native_logs import named_as, route_kafka_attribute

#: the longest ``consume()`` waits in librdkafka before the interpreter can act on a signal
CONSUME_SLICE = 0.2

#: the headers the project's Kafka backend adds to a batch's first record (the same set as
#: :data:`idempotent.adapters.kafka.heads.IDENTITY_HEADERS`, which a test compares; that module
#: is not imported here so that a consumer does not load the backend)
IDENTITY_HEADERS = frozenset({"idem.pid", "idem.epoch", "idem.seq", "idem.count", "idem.timed"})


def without_identity(message: Any) -> Any:
    """``message`` (a confluent-kafka ``Message`` or None) with the project's identity headers
    taken off, in place: its ``headers()`` are then the ones the application set, None when
    it set none. A message without them is returned untouched."""
    if message is not None:
        headers = message.headers()
        if headers and any(name in IDENTITY_HEADERS for name, _ in headers):
            message.set_headers([header for header in headers if header[0] not in IDENTITY_HEADERS] or None)
    return message


@functools.cache
def _native_class(name: str) -> type | None:
    """confluent-kafka's client class ``name`` (``Consumer``, ``Producer``), or None when it
    is not installed."""
    try:
        from confluent_kafka import cimpl
    except ImportError:
        return None
    kind: type = getattr(cimpl, name)
    return kind


@functools.cache
def wakeable_consumer_class(native: Any) -> type:
    """A subclass of the consumer class ``native`` whose ``consume()`` waits in slices and
    whose ``poll()`` and ``consume()`` return messages without the project's identity headers
    (see the module docstring); the same class for the same ``native``. Its instances are
    instances of ``native``."""

    class Wakeable(native):  # type: ignore[misc]
        __doc__ = native.__doc__

        def consume(self, num_messages: int = 1, timeout: float | None = -1) -> list[Any]:
            """As confluent-kafka's ``Consumer.consume``; a signal (Ctrl-C) interrupts the wait
            within :data:`CONSUME_SLICE` seconds.

            Raises:
                KeyboardInterrupt: (or what the signal's handler raises) while waiting; the
                    messages read so far in this call are dropped, as confluent-kafka does.
                KafkaException, ValueError, RuntimeError: as confluent-kafka raises them (a
                    closed consumer, ``num_messages`` out of range).
            """
            if timeout is None:
                timeout = -1
            if num_messages < 1 or 0 <= timeout <= CONSUME_SLICE:
                out: list[Any] = super().consume(num_messages, timeout)
            else:
                deadline = None if timeout < 0 else time.monotonic() + timeout
                out = []
                while True:
                    wait = (
                        CONSUME_SLICE if deadline is None else max(0.0, min(CONSUME_SLICE, deadline - time.monotonic()))
                    )
                    out += super().consume(num_messages - len(out), wait)
                    if len(out) >= num_messages or (deadline is not None and time.monotonic() >= deadline):
                        break
            for message in out:
                without_identity(message)
            return out

        def poll(self, *args: Any, **kwargs: Any) -> Any:
            """As confluent-kafka's ``Consumer.poll``, the message without the project's
            identity headers (see the module docstring).

            Raises:
                KafkaException, RuntimeError, ...: as confluent-kafka raises them.
            """
            return without_identity(super().poll(*args, **kwargs))

    return named_as(Wakeable, native)


def route_consumer_attribute(value: Any) -> Any:
    """What the confluent-kafka drop-in passes through for a native name: as
    :func:`~idempotent.runtime.native_logs.route_kafka_attribute` does, and a consumer class (a subclass
    of confluent-kafka's ``Consumer``) also as its :func:`wakeable_consumer_class`."""
    routed: Any = route_kafka_attribute(value)
    producer = _native_class("Producer")
    if producer is not None and isinstance(routed, type) and issubclass(routed, producer):
        # a native producer reached through a submodule (cimpl.Producer, avro.AvroProducer,
        # serializing_producer.SerializingProducer): no exactly-once, said once
        from ._shared import warn_passed_through

        warn_passed_through(
            "idempotent.compat.confluent_kafka", f"{routed.__module__}.{routed.__name__}", "confluent-kafka"
        )
    consumer = _native_class("Consumer")
    if consumer is not None and isinstance(routed, type) and issubclass(routed, consumer):
        native: Any = routed
        return wakeable_consumer_class(native)
    return routed
