"""pulsar-client's ``MessageId``, and how topic names map onto the project's."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, ClassVar

import idempotent.consumer.reader as _reader
from idempotent.core.topics import canonical_topic

from ...errors import InvalidTopicError
from ._errors import InvalidMessage, InvalidTopicName, OperationNotSupported


def _native_base() -> Any:
    """pulsar-client's ``MessageId`` class, or ``object`` without pulsar-client: drop-in ids
    are pulsar-client ids too, so pulsar-client's consumers and readers take them (``seek``,
    ``acknowledge``)."""
    try:
        import pulsar
    except ImportError:  # pragma: no cover - without the extra
        return object
    return pulsar.MessageId


class MessageId(_native_base()):  # type: ignore[misc]
    """Where a message is stored: its partition and offset.

    Pulsar's accessors are kept: ``ledger_id()`` is 0, ``entry_id()`` the offset,
    ``batch_index()`` -1; a duplicate whose original offset is no longer known is
    ``(-1,-1,-1,-1)`` as in Pulsar. Ids order by partition, then offset, and
    ``serialize()`` / ``MessageId.deserialize()`` round-trip. Extension: ``offset()``.
    """

    _FORMAT = ">qq"
    _KINDS: ClassVar[dict[int, str]] = {-2: "earliest", -3: "latest"}

    #: the first message of a topic, as a reader's start (pulsar-client's ``MessageId.earliest``)
    earliest: ClassVar[MessageId]
    #: the next message stored after the reader opened (``MessageId.latest``)
    latest: ClassVar[MessageId]

    def __new__(
        cls,
        partition: int = -1,
        offset: int = -1,
        entry_id: int | None = None,
        batch_index: int | None = None,
        *,
        ledger_id: int | None = None,
    ) -> Any:
        """``MessageId(partition, offset)``; with ``ledger_id``, ``entry_id`` or
        ``batch_index`` (pulsar-client's ``MessageId(partition, ledger_id, entry_id,
        batch_index)``), pulsar-client's own id of that position."""
        if ledger_id is not None or entry_id is not None or batch_index is not None:
            native = _native_message_id()
            if native is not None:
                return native(
                    partition,
                    offset if ledger_id is None else ledger_id,
                    -1 if entry_id is None else entry_id,
                    -1 if batch_index is None else batch_index,
                )
        return object.__new__(cls)

    def __init__(
        self,
        partition: int = -1,
        offset: int = -1,
        entry_id: int | None = None,
        batch_index: int | None = None,
        *,
        ledger_id: int | None = None,
    ) -> None:
        self._partition = partition
        self._offset = offset
        self._kind: str | None = None

    @staticmethod
    def wrap(message_id: Any) -> MessageId:
        """The drop-in id for ``message_id``: an id of this module (returned as is) or an
        :class:`idempotent.MessageId` (from :class:`idempotent.Reader`).

        Raises:
            TypeError: another kind of id (pulsar-client's own ids name ledgers, not offsets).
        """
        if isinstance(message_id, MessageId):
            return message_id
        if isinstance(message_id, _reader.MessageId):
            return MessageId(message_id.partition, message_id.offset)
        native = _native_message_id()
        if native is not None and isinstance(message_id, native._msg_id_type):
            return native.wrap(message_id)  # type: ignore[no-any-return]  # a Pulsar URL's id
        if native is not None and isinstance(message_id, native):
            return message_id  # type: ignore[no-any-return]
        raise TypeError(f"MessageId.wrap: expected a MessageId, not {type(message_id).__name__}")

    @property
    def _msg_id(self) -> Any:
        """pulsar-client's extension id of this one (what its consumers and readers take)."""
        import _pulsar

        if self._kind is not None:
            return _pulsar.MessageId.earliest if self._kind == "earliest" else _pulsar.MessageId.latest
        return _pulsar.MessageId(self._partition, self.ledger_id(), self._offset, -1)

    def ledger_id(self) -> int:
        """0, or -1 for an unknown position."""
        return -1 if self._offset < 0 else 0

    def entry_id(self) -> int:
        """The offset in the partition (-1 when unknown)."""
        return self._offset

    def batch_index(self) -> int:
        """Always -1."""
        return -1

    def partition(self) -> int:
        """The partition (-1 when unknown)."""
        return self._partition

    def offset(self) -> int:
        """Extension: the offset in the partition (-1 when unknown)."""
        return self._offset

    def serialize(self) -> bytes:
        """Sixteen bytes: partition and offset, big-endian (earliest and latest have their own)."""
        if self._kind is not None:
            partition = next(code for code, kind in self._KINDS.items() if kind == self._kind)
            return struct.pack(self._FORMAT, partition, -1)
        return struct.pack(self._FORMAT, self._partition, self._offset)

    @staticmethod
    def deserialize(data: bytes, topic: str | None = None) -> MessageId:
        """The id :meth:`serialize` produced; on a Pulsar URL, pulsar-client's serialized ids
        (``topic`` as pulsar-client's: for multi-topic consumers) give pulsar-client's ids.

        Raises:
            InvalidMessage: not a serialized id.
        """
        native = _native_message_id()
        if native is not None and (topic is not None or len(data) != struct.calcsize(MessageId._FORMAT)):
            try:
                return native.deserialize(data, topic=topic)  # type: ignore[no-any-return]
            except Exception as exc:
                raise InvalidMessage(f"not a serialized MessageId: {data!r}") from exc
        try:
            partition, offset = struct.unpack(MessageId._FORMAT, data)
        except (struct.error, TypeError) as exc:
            raise InvalidMessage(f"not a serialized MessageId: {data!r}") from exc
        kind = MessageId._KINDS.get(partition)
        if kind is not None:
            return MessageId.earliest if kind == "earliest" else MessageId.latest
        return MessageId(partition, offset)

    def _key(self) -> tuple[int, int]:
        if self._kind is not None:  # earliest before every id, latest after
            return (-(2**63), 0) if self._kind == "earliest" else (2**63, 0)
        return self._partition, self._offset

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MessageId) and self._key() == other._key()

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, MessageId):
            return NotImplemented
        return self._key() < other._key()

    def __le__(self, other: object) -> bool:
        if not isinstance(other, MessageId):
            return NotImplemented
        return self._key() <= other._key()

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, MessageId):
            return NotImplemented
        return self._key() > other._key()

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, MessageId):
            return NotImplemented
        return self._key() >= other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        return f"({self.ledger_id()},{self._offset},{self._partition},-1)"

    def __repr__(self) -> str:
        if self._kind is not None:
            return f"MessageId.{self._kind}"
        return f"MessageId(partition={self._partition}, offset={self._offset})"


def _native_message_id() -> Any:
    """pulsar-client's ``MessageId`` class (with ``_msg_id_type``, its extension's), or None
    when pulsar-client is not installed."""
    try:
        import _pulsar
        import pulsar
    except ImportError:  # pragma: no cover - without the extra
        return None
    native = pulsar.MessageId
    native._msg_id_type = _pulsar.MessageId
    return native


def native_message_ids(partitioned: bool) -> Callable[[int, int | None], Any]:
    """The function from a stored record's partition and offset to its pulsar-client id:
    ledger, entry and batch index from the offset, partition -1 on a topic that is not
    ``partitioned``; ``(-1,-1,-1,-1)`` for an unknown position (None or negative: a duplicate
    out of the checker's window). Made once per producer, so that the per-record step of
    ``send_async``'s callback resolves nothing but the offset."""
    import _pulsar

    new = _pulsar.MessageId

    def message_id(partition: int, offset: int | None) -> Any:
        if offset is None or offset < 0:
            return new(-1, -1, -1, -1)
        return new(partition if partitioned else -1, offset >> 40, (offset >> 20) & 0xFFFFF, offset & 0xFFFFF)

    return message_id


def _special(kind: str) -> MessageId:
    message_id = MessageId()
    message_id._kind = kind
    return message_id


MessageId.earliest = _special("earliest")
MessageId.latest = _special("latest")


def _message_id(partition: int, offset: int | None) -> MessageId:
    """The drop-in's own id of a stored record (``(-1, -1)`` when its offset is unknown)."""
    if offset is None:
        return MessageId(-1, -1)
    return MessageId(partition, offset)


def topic_name(topic: str) -> tuple[str, str]:
    """``(full Pulsar name, idempotent topic)`` for a Pulsar topic name.

    Raises:
        InvalidTopicName: not a persistent topic name this module can map.
        OperationNotSupported: a ``non-persistent://`` topic or a single partition of a
            partitioned topic.
    """
    if not isinstance(topic, str) or not topic:
        raise InvalidTopicName(f"invalid topic name {topic!r}")
    rest = topic
    if "://" in topic:
        scheme, _, rest = topic.partition("://")
        if scheme == "non-persistent":
            raise OperationNotSupported(f"{topic!r}: non-persistent topics are not supported (records are stored)")
        if scheme != "persistent":
            raise InvalidTopicName(f"invalid topic name {topic!r}")
    parts = rest.split("/")
    if len(parts) == 1:
        parts = ["public", "default", parts[0]]
    if len(parts) != 3 or not all(parts):
        raise InvalidTopicName(f"invalid topic name {topic!r}: use name, tenant/namespace/name or persistent://...")
    if "-partition-" in parts[2]:
        raise OperationNotSupported(
            f"{topic!r}: producing to one partition of a partitioned topic is not supported; use the topic name"
        )
    full = "persistent://" + "/".join(parts)
    try:
        return full, canonical_topic(full)  # the project's one naming rule
    except InvalidTopicError as exc:
        raise InvalidTopicName(f"invalid topic name {topic!r}: {exc.message}") from None
