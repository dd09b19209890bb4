"""The effectively-once Reader: read a topic from a position you stored yourself.

A :class:`Reader` reads a topic through the broker surface (:class:`~idempotent.api.BrokerAPI`),
so it works on every backend. It keeps no state on the broker: the application stores the
:class:`MessageId` of the last message it processed (ideally in the same transaction as the
effects of processing, see :mod:`idempotent.consumer.state`) and starts the next Reader after it.

Order: within a partition, messages come in offset order. A Reader over several partitions
serves them in turn, one message at a time (partition 0, 1, ..., then 0 again), skipping
partitions that have nothing to read at their turn (nothing fetched, and nothing new or
waiting for their next poll); it keeps one position per partition.

Offsets are not dense on every backend (Pulsar offsets encode ledger, entry and batch index;
Kafka transaction markers take offsets), so a position is a lower bound: the Reader reads
from it and takes what comes.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, Literal

import attrs

from idempotent.api import BrokerAPI
from idempotent.core.records import Headers, StoredRecord
from idempotent.core.topics import canonical_topic
from idempotent.errors import ConfigError, InvalidTopicError, ProducerClosedError, ReadTimeoutError

#: First byte of a serialized :class:`MessageId` (bump it when the encoding changes).
MESSAGE_ID_VERSION = 1

Start = Literal["earliest", "latest"]


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _read_uvarint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 7 * 19:  # at most 20 bytes: 140 bits
            raise ConfigError("not a serialized MessageId: truncated or overlong number")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _non_negative(_instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"MessageId.{attribute.name} must be a non-negative int, got {value!r}")


def _stored_name(topic: str) -> str | None:
    """The stored name of a MessageId's topic, None when it is not a valid spelling."""
    try:
        return canonical_topic(topic)
    except InvalidTopicError:
        return None


def _topic_name(_instance: object, _attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"MessageId.topic must be a non-empty str, got {value!r}")


@attrs.frozen(order=True)
class MessageId:
    """Where a message is stored: topic, partition and offset.

    Hashable, and totally ordered by ``(topic, partition, offset)``: within a partition that
    is the log order; across partitions or topics the order is only a stable convention, not
    a statement about which message was written first.

    ``serialize()`` gives a stable, versioned encoding::

        version (1 byte, = 1) | partition (unsigned LEB128) | offset (unsigned LEB128) | topic (UTF-8, rest)

    Raises:
        ConfigError: a negative partition or offset, or an empty topic.
    """

    topic: str = attrs.field(validator=_topic_name)
    partition: int = attrs.field(validator=_non_negative)
    offset: int = attrs.field(validator=_non_negative)

    def serialize(self) -> bytes:
        """The bytes :meth:`deserialize` turns back into an equal id."""
        return (
            bytes([MESSAGE_ID_VERSION]) + _uvarint(self.partition) + _uvarint(self.offset) + self.topic.encode("utf-8")
        )

    @classmethod
    def deserialize(cls, data: bytes) -> MessageId:
        """The id that ``serialize()`` encoded as ``data``.

        Raises:
            ConfigError: ``data`` is not a serialized MessageId (wrong version, truncated, bad UTF-8).
        """
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ConfigError(f"a serialized MessageId is bytes, not {type(data).__name__}")
        data = bytes(data)
        if not data or data[0] != MESSAGE_ID_VERSION:
            version = data[0] if data else None
            raise ConfigError(f"not a serialized MessageId: version {version!r}, expected {MESSAGE_ID_VERSION}")
        partition, pos = _read_uvarint(data, 1)
        offset, pos = _read_uvarint(data, pos)
        try:
            topic = data[pos:].decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError("not a serialized MessageId: topic is not UTF-8") from None
        return cls(topic, partition, offset)

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"


@attrs.frozen
class Message:
    """One message as a :class:`Reader` returns it.

    ``producer_id``, ``producer_epoch`` and ``sequence`` are the identity the record was
    written under (-1 for records written with deduplication disabled); ``timestamp`` is
    the broker's append time in seconds since the epoch.
    """

    topic: str
    partition: int
    offset: int
    value: bytes | None
    key: bytes | None
    headers: Headers
    timestamp: float
    producer_id: int
    producer_epoch: int
    sequence: int

    @property
    def message_id(self) -> MessageId:
        """Where this message is stored; store it to resume after this message."""
        return MessageId(self.topic, self.partition, self.offset)

    @property
    def properties(self) -> dict[str, bytes]:
        """The headers as a dict (for a repeated name, the last value wins)."""
        return dict(self.headers)

    @classmethod
    def from_stored(cls, topic: str, partition: int, record: StoredRecord) -> Message:
        """A message from a record read from ``topic[partition]``."""
        return cls(
            topic,
            partition,
            record.offset,
            record.value,
            record.key,
            record.headers,
            record.timestamp,
            record.producer_id,
            record.producer_epoch,
            record.sequence,
        )


@attrs.define
class _PollState:
    """The pure polling schedule of one partition: when to ask the broker again."""

    min_wait: float
    max_wait: float
    wait: float = 0.0
    next_poll: float = 0.0

    def due(self, now: float) -> bool:
        return now >= self.next_poll

    def found(self) -> None:
        self.wait = 0.0
        self.next_poll = 0.0

    def empty(self, now: float) -> None:
        self.wait = min(self.max_wait, max(self.min_wait, self.wait * 2))
        self.next_poll = now + self.wait


@attrs.define
class _Partition:
    partition: int
    position: int
    poll: _PollState
    buffer: deque[Message] = attrs.field(factory=deque)
    #: the last read returned ``max_records``: more is probably stored
    more: bool = False


class Reader:
    """Reads a topic from a given position, message by message, on any backend.

    Args:
        url_or_broker: a broker URL (``sqlite:///file.db``, ``memory://``, ``kafka://...``,
            ``pulsar://...``) or an open broker (:class:`~idempotent.api.BrokerAPI`). A broker
            opened from a URL is closed with the reader.
        topic: the topic to read, in any spelling :func:`idempotent.core.topics.canonical_topic`
            accepts (``orders``, ``persistent://public/default/orders``, ...); messages and
            their ids carry the stored name.
        start: ``"earliest"`` (the default: the oldest stored message), ``"latest"`` (only
            messages stored after the reader opened), a :class:`MessageId` (read the messages
            after it; with ``inclusive=True`` from it), or several MessageIds, one per
            partition (partitions without one start at ``"earliest"``).
        partition: read only this partition; None (the default) reads every partition.
        inclusive: a MessageId ``start`` includes that message itself.
        max_records: how many records one request to the broker fetches at most.
        min_poll_interval, max_poll_interval: while a partition has nothing new, it is polled
            again after a wait that starts at ``min_poll_interval`` seconds and doubles up to
            ``max_poll_interval``; a message resets it.
        create: create the topic (with the broker's default partition count) if it does not exist.
        connect_options: passed to :func:`idempotent.connect` with a URL.

    Multi-partition order: partitions are served in turn, one message at a time, skipping
    those with nothing to read; within a partition, offset order. Not thread-safe.

    Raises:
        ConfigError: bad URL or argument, a start MessageId of another topic or partition.
        InvalidTopicError: unknown topic (and ``create`` False) or partition, or a name that
            is not a valid spelling of a topic.
        BackendUnavailableError: the backend failed while the reader was opened.
    """

    def __init__(
        self,
        url_or_broker: str | BrokerAPI,
        topic: str,
        start: Start | MessageId | Iterable[MessageId] = "earliest",
        *,
        partition: int | None = None,
        inclusive: bool = False,
        max_records: int = 500,
        min_poll_interval: float = 0.005,
        max_poll_interval: float = 0.2,
        create: bool = False,
        **connect_options: Any,
    ) -> None:
        from idempotent.connection import connect

        if not isinstance(max_records, int) or max_records < 1:
            raise ConfigError(f"max_records must be a positive int, got {max_records!r}")
        if not 0 < min_poll_interval <= max_poll_interval:
            raise ConfigError("poll intervals must satisfy 0 < min_poll_interval <= max_poll_interval")
        self._owns_broker = isinstance(url_or_broker, str)
        self._broker = connect(url_or_broker, **connect_options) if isinstance(url_or_broker, str) else url_or_broker
        self._closed = False
        try:
            if not isinstance(self._broker, BrokerAPI):
                raise ConfigError(f"expected a URL or a broker, got {type(url_or_broker).__name__}")
            self._topic = topic = canonical_topic(topic)
            self._max_records = max_records
            count = self._broker.partitions_for(topic, create=create)
            if partition is None:
                numbers = list(range(count))
            elif isinstance(partition, int) and not isinstance(partition, bool) and 0 <= partition < count:
                numbers = [partition]
            else:
                raise ConfigError(f"topic {topic!r} has partitions 0..{count - 1}, not {partition!r}")
            self._parts = {p: _Partition(p, 0, _PollState(min_poll_interval, max_poll_interval)) for p in numbers}
            self._order = numbers
            self._turn = 0
            self._apply_start(start, inclusive)
        except BaseException:
            if self._owns_broker:
                self._broker.close()
            raise

    # -- positions ---------------------------------------------------------------------------

    def _apply_start(self, start: Start | MessageId | Iterable[MessageId], inclusive: bool) -> None:
        if start == "earliest" or start == "latest":
            # learn every end first, so that a failure moves nothing
            ends = {p: self._broker.end_offset(self._topic, p) if start == "latest" else 0 for p in self._parts}
            for p, part in self._parts.items():
                self._seek_part(part, ends[p])
            return
        if isinstance(start, MessageId):
            ids: list[MessageId] = [start]
        elif isinstance(start, str | bytes) or not isinstance(start, Iterable):
            raise ConfigError(f"start must be 'earliest', 'latest', a MessageId or MessageIds, not {start!r}")
        else:
            ids = list(start)
        for message_id in ids:
            self._check_id(message_id)
        for part in self._parts.values():
            self._seek_part(part, 0)
        for message_id in ids:
            self._seek_part(self._parts[message_id.partition], message_id.offset + (0 if inclusive else 1))

    def _check_id(self, message_id: object) -> MessageId:
        if not isinstance(message_id, MessageId):
            raise ConfigError(f"expected a MessageId, got {type(message_id).__name__}")
        if message_id.topic != self._topic and _stored_name(message_id.topic) != self._topic:
            raise ConfigError(f"{message_id} is not in topic {self._topic!r}")
        if message_id.partition not in self._parts:
            raise ConfigError(f"{message_id} is not in a partition this reader reads ({self._order})")
        return message_id

    @staticmethod
    def _seek_part(part: _Partition, position: int) -> None:
        part.position = position
        part.more = False
        part.buffer.clear()
        part.poll.found()

    def seek(self, position: Start | MessageId, *, inclusive: bool = False) -> None:
        """Move the reader: ``"earliest"`` or ``"latest"`` moves every partition; a
        :class:`MessageId` moves its partition to the message after it (or to it, with
        ``inclusive=True``). Messages already fetched for the moved partitions are dropped.

        Raises:
            ConfigError: a MessageId of another topic or partition (nothing moved).
            ProducerClosedError: the reader is closed.
            BackendUnavailableError: ``"latest"`` could not learn the end of a partition.
        """
        self._check_open()
        if isinstance(position, MessageId):
            message_id = self._check_id(position)
            self._seek_part(self._parts[message_id.partition], message_id.offset + (0 if inclusive else 1))
        elif position == "earliest" or position == "latest":
            self._apply_start(position, inclusive)
        else:
            raise ConfigError(f"seek takes 'earliest', 'latest' or a MessageId, not {position!r}")

    def positions(self) -> dict[int, int]:
        """Per partition, the offset from which the next message will be read (a lower
        bound: the next message has this offset or a higher one)."""
        out = {}
        for p, part in self._parts.items():
            out[p] = part.buffer[0].offset if part.buffer else part.position
        return out

    # -- reading -----------------------------------------------------------------------------

    def _fetch(self, part: _Partition) -> bool:
        """Fill the partition's buffer from the broker; False when nothing new is stored."""
        # a full read suggests more is stored: skip the end_offset question then
        if not part.more and self._broker.end_offset(self._topic, part.partition) <= part.position:
            return False
        records = self._broker.read(self._topic, part.partition, part.position, self._max_records)
        part.more = len(records) >= self._max_records
        for record in records:
            if record.offset >= part.position:  # a backend may hand back the start's neighbours
                part.buffer.append(Message.from_stored(self._topic, part.partition, record))
                part.position = record.offset + 1
        return bool(part.buffer)

    def _take(self, now: float, *, force: bool) -> Message | None:
        """The next message in turn: from partitions with fetched messages or due for a
        poll; then, with ``force``, polling the others too. None when none has one now."""
        count = len(self._order)
        polled: set[int] = set()
        for forced in (False, True) if force else (False,):
            for step in range(count):
                index = (self._turn + step) % count
                part = self._parts[self._order[index]]
                if not part.buffer:
                    if part.partition in polled or not (forced or part.poll.due(now)):
                        continue
                    polled.add(part.partition)
                    if not self._fetch(part):
                        part.poll.empty(now)
                        continue
                    part.poll.found()
                self._turn = (index + 1) % count
                return part.buffer.popleft()
        return None

    def read_next(self, timeout: float | None = None) -> Message:
        """The next message, waiting up to ``timeout`` seconds (None: forever) for one.

        Raises:
            ReadTimeoutError: nothing arrived in time; the position is unchanged, call again.
            ProducerClosedError: the reader is closed.
            BackendUnavailableError, InvalidTopicError: a read failed; the position is
                unchanged (messages fetched but not returned are kept), so calling again is safe.
        """
        self._check_open()
        start = time.monotonic()
        deadline = None if timeout is None else start + max(0.0, timeout)
        now = start
        first = True
        while True:
            message = self._take(now, force=first)
            if message is not None:
                return message
            first = False
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise ReadTimeoutError(f"no message in {self._topic!r} within {timeout} s")
            wake = min(part.poll.next_poll for part in self._parts.values())
            if deadline is not None:
                wake = min(wake, deadline)
            time.sleep(max(0.001, wake - now))
            self._check_open()
            now = time.monotonic()

    def has_message_available(self) -> bool:
        """True when a message can be read now without waiting (asks the broker if needed).

        Raises:
            ProducerClosedError: the reader is closed.
            BackendUnavailableError: the backend failed.
        """
        self._check_open()
        for part in self._parts.values():
            if part.buffer:
                return True
        for part in self._parts.values():
            if self._fetch(part):
                part.poll.found()
                return True
        return False

    def __iter__(self) -> Iterator[Message]:
        """Every message available now: iteration ends when no partition has one left
        (it does not wait for new ones; use :meth:`read_next` with a timeout to follow)."""
        while True:
            self._check_open()
            message = self._take(time.monotonic(), force=True)
            if message is None:
                return
            yield message

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def topic(self) -> str:
        """The topic this reader reads."""
        return self._topic

    @property
    def partitions(self) -> list[int]:
        """The partitions this reader reads, in the order it serves them."""
        return list(self._order)

    @property
    def broker(self) -> BrokerAPI:
        """The broker this reader reads from."""
        return self._broker

    def _check_open(self) -> None:
        if self._closed:
            raise ProducerClosedError("reader is closed")

    def close(self) -> None:
        """Close the reader (and the broker, if it opened it from a URL). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_broker:
            self._broker.close()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["MESSAGE_ID_VERSION", "Message", "MessageId", "Reader"]
