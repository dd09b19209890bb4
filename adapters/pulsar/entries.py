"""One batch, one entry: a producer's writer on one Pulsar partition topic, and what goes into
and comes back from each entry it writes (for :mod:`idempotent.adapters.pulsar.producer_log`).

A batch's records go into the client's batch container with batching limits no batch reaches
(:data:`BATCHING`), and the flush closes the entry, so a batch is stored atomically with
consecutive batch indexes. The first message carries the batch's identity properties and the
entry's Pulsar sequence id; the others carry only their own key, value and properties.
:func:`entry_offset` reads an entry's answers: its base offset, or why it is not known to be
stored as one entry.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs

from idempotent.adapters.pulsar.errors import map_errors, translate
from idempotent.adapters.pulsar.messages import build_message, encode_record
from idempotent.adapters.pulsar.names import encode_offset
from idempotent.backend import AppendBatch
from idempotent.core.records import RecordColumns
from idempotent.errors import BackendUnavailableError, ProducerError

try:
    import _pulsar
    import pulsar
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("the pulsar backend needs pulsar-client: pip install 'idempotent[pulsar]'") from exc

_LOG = logging.getLogger("idempotent.adapters.pulsar")

#: what a batch may hold (as ``Record.size`` counts) and how many records: one entry, with
#: room for Pulsar's per-message metadata, well below the broker's 5 MiB ``maxMessageSize``
MAX_BATCH_BYTES = 1024 * 1024
MAX_BATCH_RECORDS = 10_000
#: record headers this writer takes as the message's event time (milliseconds, decimal), not
#: as a property: the pulsar-client drop-in's ``event_timestamp``
EVENT_TIME_HEADER = "idem.event_time"
#: likewise, the message's ordering key (``ordering_key``)
ORDERING_KEY_HEADER = "idem.ordering_key"
_OWN_FIELDS = (EVENT_TIME_HEADER, ORDERING_KEY_HEADER)
#: batching limits no batch reaches: our flush closes every entry
BATCHING = {
    "batching_enabled": True,
    "batching_max_messages": 1 << 30,
    "batching_max_allowed_size_in_bytes": 1 << 30,
    "batching_max_publish_delay_ms": 24 * 3600 * 1000,
    "block_if_queue_full": True,
    "max_pending_messages": 1 << 20,
    "send_timeout_millis": 0,
}

#: what the client calls with a message's answer: ``(result, message id)``
Answer = Callable[[Any, Any], None]


def pulsar_producer_name(producer_key: str, named: bool) -> str:
    """The Pulsar producer name of one of our producers on every partition topic (what plain
    consumers see as ``producer_name()``): a named producer's own name."""
    return producer_key if named else f"idempotent-p-{producer_key}"


class EntryWriter:
    """This producer's Pulsar producer on one partition topic."""

    __slots__ = ("data_topic", "end", "next_id", "partition", "producer", "topic", "where")

    def __init__(self, topic: str, partition: int, data_topic: str, producer: Any, next_id: int, end: int) -> None:
        self.topic = topic
        self.partition = partition
        self.data_topic = data_topic
        self.where = f"{topic}[{partition}]"
        self.producer = producer
        #: the Pulsar sequence id of the next entry
        self.next_id = next_id
        #: an offset at or before the next entry of this producer (where a read for it starts)
        self.end = end


class GroupWait:
    """The answers of one group's messages: the first and last of each entry."""

    def __init__(self, count: int) -> None:
        self.cond = threading.Condition()
        self.left = count
        self.answers: dict[int, tuple[Any, Any]] = {}

    def slot(self, key: int) -> Answer:
        def callback(result: Any, message_id: Any) -> None:
            try:  # an exception escaping a pulsar callback terminates the process
                with self.cond:
                    self.answers[key] = (result, message_id)
                    self.left -= 1
                    if self.left <= 0:
                        self.cond.notify_all()
            except BaseException:  # pragma: no cover - defensive
                _LOG.exception("pulsar send callback failed")

        return callback

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.left > 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.cond.wait(remaining)
        return True


def send_entry(writer: EntryWriter, batch: AppendBatch, entry_id: int, first: Answer, last: Answer) -> None:
    """Hand one batch to the writer's batch container (sent by the flush as one entry):
    ``first`` gets the answer of its first message, ``last`` that of its last.

    Raises:
        ProducerError: the client refused a message (translated); what the container
            already holds of the batch is in doubt.
    """
    records = batch.records
    count = len(records)
    header = batch.header
    event_time = int(batch.timestamp * 1000)
    identity = {"idem.count": str(count)}
    if header is not None:
        identity.update(
            {
                "idem.pid": str(header.producer_id),
                "idem.epoch": str(header.producer_epoch),
                "idem.seq": str(header.base_sequence),
            }
        )
    send = writer.producer._producer.send_async
    builder = _pulsar.MessageBuilder
    if count == 1:  # one message: its answer is the entry's first and last
        first = _both(first, last)
    with map_errors(f"append to {writer.where}"):
        # A message between the entry's first and last gets no callback (None): the client
        # then runs no Python for it, where a callback would take the interpreter lock once
        # per record, away from the application's thread.
        if type(records) is RecordColumns and records.keys is None:
            # the head carries the identity, the entry's sequence id (the one the broker
            # records) and the batch's time; the others only their value
            for index, value in enumerate(records.values):
                message = builder()
                if value is None:
                    message.set_null_value()
                else:
                    message.content(value)
                if index == 0:
                    for name, text in identity.items():
                        message.property(name, text)
                    message.sequence_id(entry_id)
                    message.event_timestamp(event_time)
                send(message.build(), first if index == 0 else last if index == count - 1 else None)
            return
        for index, record in enumerate(records):
            own_time = event_time
            ordering_key: str | None = None
            headers = record.headers
            if headers and any(name in _OWN_FIELDS for name, _ in headers):
                for name, data in headers:
                    if name == EVENT_TIME_HEADER:
                        own_time = int(data)
                    elif name == ORDERING_KEY_HEADER:
                        ordering_key = data.decode()
                record = attrs.evolve(record, headers=tuple((n, v) for n, v in headers if n not in _OWN_FIELDS))
            encoded = encode_record(record, identity if index == 0 else {}, own_time)
            built = build_message(encoded, entry_id, ordering_key)
            send(built, first if index == 0 else last if index == count - 1 else None)


def entry_offset(
    first: tuple[Any, Any], last: tuple[Any, Any], count: int, what: str
) -> tuple[int | None, ProducerError | None]:
    """What the answers of an entry's first and last message (``(result, message id)``) say:
    its base offset when it is stored as one entry of ``count`` consecutive batch indexes,
    else (None, the error: Pulsar's own, translated; or a retriable one when Pulsar's
    deduplication says an earlier attempt stored it, or when it is not one entry)."""
    bad = next((r for r, _ in (first, last) if r != pulsar.Result.Ok), None)
    if bad is not None:
        return None, translate(bad, what)
    head = first[1]
    if head.ledger_id() < 0:  # Pulsar's dedup: stored by an earlier attempt
        return None, BackendUnavailableError(f"pulsar: {what}: the entry was stored before")
    ledger, entry, index = head.ledger_id(), head.entry_id(), max(head.batch_index(), 0)
    end = last[1]
    if end is not None and (
        end.ledger_id() != ledger or end.entry_id() != entry or max(end.batch_index(), 0) != index + count - 1
    ):
        return None, BackendUnavailableError(
            f"pulsar: {what}: the batch was not stored as one entry with consecutive batch indexes"
        )
    return encode_offset(ledger, entry, index), None


def noop_flush(result: Any) -> None:
    """The answer of a flush or a close nobody waits for."""


def close_entry(producer: Any) -> bool:
    """Close the entry ``producer`` (a ``pulsar.Producer``) is filling, so that it is sent,
    without waiting for its answer: the ``flush_async`` of pulsar-client's extension (not part
    of its public Python API; present in the pinned versions). Where it is missing, the
    blocking ``flush()`` closes the entry and waits until it is answered.

    Returns:
        Whether it returned without waiting (False: the blocking fallback was taken).

    Raises:
        Exception: what the client raises (callers translate it with ``map_errors``).
    """
    flush_async = getattr(producer._producer, "flush_async", None)
    if flush_async is None:
        producer.flush()
        return False
    flush_async(noop_flush)
    return True


def _both(first: Answer, last: Answer) -> Answer:
    def callback(result: Any, message_id: Any) -> None:
        first(result, message_id)
        last(result, message_id)

    return callback
