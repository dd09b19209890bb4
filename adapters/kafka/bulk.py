"""Records into librdkafka in bulk, without a Python object or a delivery report per record.

confluent-kafka's ``produce_batch`` takes a dict per record and gives every record a state
object whose delivery report takes the interpreter lock on librdkafka's thread, once per
record, callback or not. The Kafka writers need neither for the records between a batch's
head and its last record: one transaction stores them all or none, and the reports of the
head and the last record prove the batch's offsets consecutive.

:class:`BulkProducer` hands such records to the same librdkafka handle the
``confluent_kafka.Producer`` owns, through librdkafka's own ``rd_kafka_produce_batch``. The
message array is filled a column at a time (pointers and lengths of the values and keys as
arrays, written into the array's strided fields in one assignment each), so no Python code
runs per record; librdkafka copies each payload (``RD_KAFKA_MSG_F_COPY``) before the call
returns. A message without a state object (``_private`` NULL) gets no delivery report in
Python: confluent-kafka's report callback returns at once for it, without the lock.

The handle is found in the producer object (the first field after the object header) and
used only when librdkafka confirms it, by answering the producer object itself as the
handle's opaque (confluent-kafka sets it so). Any other layout, interpreter or library gives
:func:`attach` None, and the writers use ``produce_batch`` as before.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from array import array
from collections.abc import Sequence
from itertools import repeat
from operator import add
from typing import Any

from idempotent.core.records import RecordColumns

_LOG = logging.getLogger("idempotent.adapters.kafka")

#: ``rd_kafka_message_t`` on a 64-bit platform, in 8-byte words: err, rkt, partition, payload,
#: len, key, key_len, offset, _private
_WORDS = 9
_PAYLOAD, _LEN, _KEY, _KEY_LEN = 3, 4, 5, 6
_MSG_F_COPY = 0x2
#: where a ``bytes`` object's data starts, from the object's address (CPython)
_BYTES_DATA = sys.getsizeof(b"") - 1
_ONLY_BYTES = frozenset({bytes})
#: set to ``0`` to always use confluent-kafka's ``produce_batch`` (a fallback kept tested)
DISABLE_ENV = "IDEMPOTENT_KAFKA_BULK"


class _Library:
    """librdkafka's entry points, resolved through confluent-kafka's own extension (so the
    very library it is linked with)."""

    def __init__(self) -> None:
        from confluent_kafka import cimpl

        lib = ctypes.CDLL(cimpl.__file__)
        self.opaque = lib.rd_kafka_opaque
        self.opaque.argtypes = [ctypes.c_void_p]
        self.opaque.restype = ctypes.c_void_p
        self.topic_new = lib.rd_kafka_topic_new
        self.topic_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        self.topic_new.restype = ctypes.c_void_p
        self.topic_destroy = lib.rd_kafka_topic_destroy
        self.topic_destroy.argtypes = [ctypes.c_void_p]
        self.topic_destroy.restype = None
        self.produce_batch = lib.rd_kafka_produce_batch
        self.produce_batch.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        self.produce_batch.restype = ctypes.c_int
        self.err2name = lib.rd_kafka_err2name
        self.err2name.argtypes = [ctypes.c_int]
        self.err2name.restype = ctypes.c_char_p


_library: _Library | None = None
_unavailable = False


def _load() -> _Library | None:
    global _library, _unavailable
    if _library is None and not _unavailable:
        if sys.implementation.name != "cpython" or ctypes.sizeof(ctypes.c_void_p) != 8 or _BYTES_DATA != 32:
            _unavailable = True
            _LOG.info("kafka: records go through produce_batch (not 64-bit CPython)")
            return None
        try:
            _library = _Library()
        except (ImportError, OSError, AttributeError) as exc:
            _unavailable = True
            _LOG.info("kafka: records go through produce_batch (%s)", exc)
    return _library


class BulkProducer:
    """Bulk calls into one ``confluent_kafka.Producer``'s librdkafka handle; see the module.

    Not thread-safe beyond what librdkafka's own produce call is: the writers use one from
    their writing thread.
    """

    __slots__ = ("_handle", "_lib", "_producer")

    def __init__(self, lib: _Library, producer: Any, handle: int) -> None:
        self._lib = lib
        self._producer = producer  # the handle lives as long as the producer object
        self._handle = handle

    def produce(
        self, topic: str, partition: int, values: list[bytes], keys: list[bytes] | None
    ) -> tuple[int, str] | None:
        """Queue ``values`` (with ``keys``, as many, or none) to ``topic[partition]`` in
        order, stamped with the time of the call, without delivery reports.

        Returns:
            How many were queued (a prefix), and the name of librdkafka's error for the
            first one that was not (``""`` when all were), such as ``_QUEUE_FULL``; None,
            with nothing queued, when a value or key is not exactly ``bytes`` (None
            included): only those are passed by address (use ``produce_batch``).
        """
        if not _ONLY_BYTES.issuperset(map(type, values)) or (
            keys is not None and not _ONLY_BYTES.issuperset(map(type, keys))
        ):
            return None
        count = len(values)
        if not count:
            return 0, ""
        messages = bytearray(8 * _WORDS * count)
        words = memoryview(messages).cast("Q")
        words[_LEN::_WORDS] = array("Q", map(len, values))
        words[_PAYLOAD::_WORDS] = array("Q", map(add, map(id, values), repeat(_BYTES_DATA)))
        if keys is not None:
            words[_KEY_LEN::_WORDS] = array("Q", map(len, keys))
            words[_KEY::_WORDS] = array("Q", map(add, map(id, keys), repeat(_BYTES_DATA)))
        lib = self._lib
        topic_handle = lib.topic_new(self._handle, topic.encode(), None)
        if not topic_handle:
            return 0, "_UNKNOWN_TOPIC"
        try:
            address = ctypes.addressof(ctypes.c_char.from_buffer(messages))
            queued = int(lib.produce_batch(topic_handle, partition, _MSG_F_COPY, address, count))
        finally:
            lib.topic_destroy(topic_handle)
        # the payloads were copied; the columns may go
        if queued == count:
            return queued, ""
        errors = words[::_WORDS].tolist()  # each word's low half is the message's error code
        prefix = next(index for index, error in enumerate(errors) if error)
        code = errors[prefix] & 0xFFFFFFFF
        code = code - (1 << 32) if code >= 1 << 31 else code
        name = lib.err2name(code)
        return prefix, _refusal(name.decode() if name else str(code), prefix != queued)


def _refusal(name: str, out_of_order: bool) -> str:
    return f"{name}, with later records queued out of order" if out_of_order else name


class BulkWriter:
    """Bulk calls into one ``confluent_kafka.Producer``: through :class:`BulkProducer` when
    :func:`attach` confirms its handle, else through ``produce_batch`` (a dict and a state
    object per record). A value or key that is None goes through ``produce_batch`` too.

    Args:
        producer: the ``confluent_kafka.Producer`` (the writer's own: one thread uses it).
    """

    __slots__ = ("_direct", "producer")

    def __init__(self, producer: Any) -> None:
        self.producer = producer
        self._direct = attach(producer)

    def produce(self, topic: str, partition: int, values: list[Any], keys: list[Any] | None) -> tuple[int, str]:
        """Queue ``values`` (bytes or None; with ``keys``, as many, or none) to
        ``topic[partition]`` in order, stamped with the time of the call, with no delivery
        report each (a failure of any fails the transaction's commit).

        Returns:
            How many were queued before the first that was not, and the name of librdkafka's
            error for that one (``""`` when all were queued). ``"_QUEUE_FULL"`` alone means
            every record after it was refused too (the caller may queue them again once the
            queue drains); any other text, that nothing of the transaction may be committed.
        """
        if self._direct is not None:
            answer = self._direct.produce(topic, partition, values, keys)
            if answer is not None:  # None: a value or key that is not bytes goes the other way
                return answer
        messages = (
            [{"value": v} for v in values]
            if keys is None
            else [{"value": v, "key": k} for v, k in zip(values, keys, strict=True)]
        )
        queued = self.producer.produce_batch(topic, messages, partition=partition)
        if queued == len(messages):
            return queued, ""
        errors = [message.get("_error") for message in messages]
        prefix = next(index for index, error in enumerate(errors) if error is not None)
        error: Any = errors[prefix]
        name = str(error.name()) if hasattr(error, "name") else str(error)
        return prefix, _refusal(name, prefix != queued)


def writer_for(current: BulkWriter | None, producer: Any) -> BulkWriter:
    """``current`` when it writes through ``producer``, else a new :class:`BulkWriter` for it
    (a writer's transactional producer may have been replaced since)."""
    return current if current is not None and current.producer is producer else BulkWriter(producer)


def bulk_columns(records: Sequence[Any]) -> tuple[list[Any], list[Any] | None] | None:
    """The values and keys (None: no record has a key) of records without headers or a
    time of their own, as a bulk call takes them; None when any record has either."""
    if type(records) is RecordColumns:
        if records.timestamps is not None and any(t is not None for t in records.timestamps):
            return None
        return records.values, records.keys
    if any(record.headers or record.timestamp is not None for record in records):
        return None
    keys = [record.key for record in records]
    return [record.value for record in records], None if keys.count(None) == len(keys) else keys


def attach(producer: Any) -> BulkProducer | None:
    """A :class:`BulkProducer` for ``producer`` (a ``confluent_kafka.Producer``), or None
    when its librdkafka handle cannot be confirmed (then use ``produce_batch``)."""
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return None
    lib = _load()
    if lib is None:
        return None
    from confluent_kafka import cimpl

    if not isinstance(producer, cimpl.Producer):  # only its layout is known
        return None
    handle = ctypes.c_void_p.from_address(id(producer) + 2 * ctypes.sizeof(ctypes.c_void_p)).value
    if not handle or lib.opaque(handle) != id(producer):
        _LOG.info("kafka: the producer's librdkafka handle is not where expected; records go through produce_batch")
        return None
    return BulkProducer(lib, producer, handle)


__all__ = ["DISABLE_ENV", "BulkProducer", "BulkWriter", "attach", "bulk_columns", "writer_for"]
