"""The exception tree of idempotent, and how to recover from each error.

Outcomes such as DUPLICATE or OUT_OF_ORDER_SEQUENCE are values (:class:`idempotent.Outcome`);
exceptions are reserved for terminal failures of a call, a batch or a producer.

Every error has two coordinates: *who* is at fault (the branch of the tree) and *what to do*
(``error.recovery``, a :class:`Recovery`)::

    ProducerError                         root of everything raised by idempotent
    ├── UsageError                        local misuse; the object stays usable       FATAL
    │   ├── ConfigError                   bad option or URL                           FATAL
    │   ├── InvalidBatchError             malformed or oversized batch; nothing       FATAL
    │   │   │                             stored, broker state unchanged
    │   │   └── EntryTooLargeError        larger than one backend entry; not stored   FATAL
    │   ├── InvalidRecordError            a key, value or header of the wrong type    FATAL
    │   │                                 (also a TypeError)
    │   ├── InvalidTopicError             bad topic name or partition                 FATAL
    │   ├── QueueFullError                local buffer full; poll or flush first      RETRY
    │   ├── ProducerClosedError           the producer or broker is closed            FATAL
    │   └── LocalProtocolError            this side's request broke the protocol      FATAL
    │                                     (also a ProtocolError)
    ├── BrokerError                       the broker refused                           (varies)
    │   ├── ProducerFencedError           a newer instance took the name over         FATAL
    │   ├── UnknownProducerError          broker lost or never had this producer      RESET_PRODUCER
    │   ├── SequenceDesyncError           broker and producer disagree on sequences   BUMP_EPOCH
    │   ├── PartitionRecoveringError      partition is rebuilding its state           RETRY
    │   ├── NotOwnerError                 another broker owns the partition; follow   RETRY
    │   ├── AuthenticationError           no valid credentials; connection refused    FATAL
    │   └── AuthorizationError            the principal may not do this               FATAL
    ├── TransportError                    I/O failed; outcome unknown                 RETRY
    │   ├── BackendUnavailableError       the storage backend failed or timed out     RETRY
    │   │   └── OwnershipLostError        another broker took the partition over      RETRY
    │   ├── RequestTimeoutError           no answer in time                           RETRY
    │   │   └── ReadTimeoutError          Reader.read_next: no message in time        RETRY
    │   ├── BrokerConnectionError         cannot reach the broker, or connection lost RETRY
    │   ├── DeliveryTimeoutError          a sent batch outlived delivery_timeout      BUMP_EPOCH
    │   └── RemoteProtocolError           the peer sent bytes that break the          FATAL
    │                                     protocol; connection closed (a ProtocolError)
    ├── InternalError                     a bug in idempotent: an unexpected          FATAL
    │   │                                 exception, logged with its traceback
    │   └── IllegalStateTransition        a state machine was asked for a move its    FATAL
    │                                     transition table does not have (a bug)
    ├── CorruptDataError                  stored data (a snapshot, a damaged SQLite   FATAL
    │   │                                 file) cannot be decoded
    │   └── ProducerStateLostError        a named producer's stored state is lost,    FATAL
    │                                     stale or unreadable and the log cannot
    │                                     rebuild it: its restart is refused
    └── DeliveryFailed                    a message's terminal failure, set on its future;
                                          ``status`` says NOT_PERSISTED or POSSIBLY_PERSISTED,
                                          ``__cause__`` holds the error above that caused it

    ProtocolError                         abstract: catches LocalProtocolError and
                                          RemoteProtocolError (h11's split)

Nothing else escapes: a bug anywhere in the library or the adapters becomes an
:class:`InternalError` (FATAL, never retried) after it is logged, and each adapter maps its
client's errors once, at its edge; only what a backend documents as transient is ``RETRY``.
A backend's refusal that stores nothing for certain (:class:`EntryTooLargeError`) is not a
transport error: the batch fails alone, NOT_PERSISTED, and the partition is not rebuilt.

Recovery classes:

* ``RETRY``: send again with the same producer id, epoch and sequences; safe, the broker
  deduplicates. The producer does this itself until its delivery timeout.
* ``BUMP_EPOCH``: re-initialise the same named producer (new epoch, sequences continued from
  the broker's last stored sequence), then resend what was not persisted.
* ``RESET_PRODUCER``: initialise again; an anonymous producer gets a new id, so messages that
  were possibly persisted can no longer be deduplicated.
* ``FATAL``: do not retry; fix the cause (or, for a fenced producer, let the newer instance
  carry on).

All exceptions pickle and unpickle with their fields (they cross Spark's driver/executor
boundary), because their attrs fields are positional.
"""

from __future__ import annotations

import enum
import logging
from typing import ClassVar

import attrs

from idempotent.core.outcomes import DeliveryStatus


class Recovery(enum.Enum):
    """What a caller should do after an error."""

    RETRY = "retry"
    BUMP_EPOCH = "bump_epoch"
    RESET_PRODUCER = "reset_producer"
    FATAL = "fatal"


@attrs.frozen(str=False)
class ProducerError(Exception):
    """Root of the tree. ``message`` says what happened in words."""

    message: str
    recovery: ClassVar[Recovery] = Recovery.FATAL
    code: ClassVar[int] = 1

    def __str__(self) -> str:
        return self.message

    @property
    def retriable(self) -> bool:
        """True when retrying the same request is safe and may succeed."""
        return self.recovery is Recovery.RETRY

    @classmethod
    def for_code(cls, code: int) -> type[ProducerError]:
        """Return the error class registered for a numeric ``code`` (the root if unknown)."""
        return _BY_CODE.get(code, ProducerError)


@attrs.frozen(str=False)
class UsageError(ProducerError):
    """The caller used the API wrongly. Nothing changed; the object stays usable."""

    code: ClassVar[int] = 10


@attrs.frozen(str=False)
class ConfigError(UsageError):
    """An option, URL or argument has a bad value."""

    code: ClassVar[int] = 11


@attrs.frozen(str=False)
class InvalidBatchError(UsageError):
    """The broker refused a malformed batch (bad sequence, size or shape). State unchanged."""

    code: ClassVar[int] = 12


@attrs.frozen(str=False)
class InvalidRecordError(UsageError, TypeError):
    """A record's key, value or a header has the wrong type (``Record(...)`` raises it).
    Also a ``TypeError``, as Python raises for arguments of the wrong type."""

    code: ClassVar[int] = 18


@attrs.frozen(str=False)
class InvalidTopicError(UsageError):
    """A topic name is invalid or a partition does not exist."""

    code: ClassVar[int] = 13


@attrs.frozen(str=False)
class QueueFullError(UsageError):
    """The producer's local buffer is full; flush or wait, then send again."""

    recovery: ClassVar[Recovery] = Recovery.RETRY
    code: ClassVar[int] = 14


@attrs.frozen(str=False)
class ProducerClosedError(UsageError):
    """The producer or broker was closed."""

    code: ClassVar[int] = 15


@attrs.frozen(str=False)
class ProtocolError(ProducerError):
    """Abstract: a frame broke the wire protocol. Catch it to handle both sides; what is
    raised is :class:`LocalProtocolError` or :class:`RemoteProtocolError` (as in h11)."""

    code: ClassVar[int] = 19


@attrs.frozen(str=False)
class LocalProtocolError(UsageError, ProtocolError):
    """This side's request broke the wire protocol (malformed, too large, unknown operation,
    bad argument type or range, unsupported version, not ``hello`` first), as the broker
    server answers it. Nothing changed on the broker; a frame that cannot be parsed at all
    also closes the connection."""

    code: ClassVar[int] = 16


@attrs.frozen(str=False)
class BrokerError(ProducerError):
    """The broker refused a request for a reason on its side."""

    code: ClassVar[int] = 20


@attrs.frozen(str=False)
class ProducerFencedError(BrokerError):
    """A newer instance of this producer (a higher epoch) exists; this instance must stop."""

    producer_id: int = -1
    producer_epoch: int = -1
    code: ClassVar[int] = 21


@attrs.frozen(str=False)
class UnknownProducerError(BrokerError):
    """The broker has no state for this producer (never initialised, or evicted)."""

    producer_id: int = -1
    recovery: ClassVar[Recovery] = Recovery.RESET_PRODUCER
    code: ClassVar[int] = 22


@attrs.frozen(str=False)
class SequenceDesyncError(BrokerError):
    """The broker expects a sequence the producer cannot supply (its acknowledged data is
    not where it should be). Re-initialise to continue from the broker's truth."""

    expected_sequence: int = -1
    recovery: ClassVar[Recovery] = Recovery.BUMP_EPOCH
    code: ClassVar[int] = 23


@attrs.frozen(str=False)
class PartitionRecoveringError(BrokerError):
    """The partition is rebuilding its checker state after a failure; retry shortly."""

    recovery: ClassVar[Recovery] = Recovery.RETRY
    code: ClassVar[int] = 24


@attrs.frozen(str=False)
class NotOwnerError(BrokerError):
    """This broker does not own the partition (several brokers over one backend, see
    ``docs/clustering.md``). ``owner`` is the address (``host:port``) of the broker that does
    and ``owner_id`` its broker id, or "" when unknown; send the request there (or ask
    ``metadata``). Nothing was written and no state changed."""

    topic: str = ""
    partition: int = -1
    owner: str = ""
    owner_id: str = ""
    recovery: ClassVar[Recovery] = Recovery.RETRY
    code: ClassVar[int] = 25


@attrs.frozen(str=False)
class AuthenticationError(BrokerError):
    """The broker refused the connection's credentials (missing, invalid or expired token).
    Nothing changed; the connection is closed."""

    code: ClassVar[int] = 26


@attrs.frozen(str=False)
class AuthorizationError(BrokerError):
    """The authenticated principal may not carry out this request. Nothing changed."""

    code: ClassVar[int] = 27


@attrs.frozen(str=False)
class TransportError(ProducerError):
    """An I/O failure: the request may or may not have been carried out."""

    recovery: ClassVar[Recovery] = Recovery.RETRY
    code: ClassVar[int] = 30


@attrs.frozen(str=False)
class BackendUnavailableError(TransportError):
    """The storage backend (SQLite, Kafka, Pulsar) failed or timed out."""

    code: ClassVar[int] = 31


@attrs.frozen(str=False)
class OwnershipLostError(BackendUnavailableError):
    """Another broker took the partition over and fenced this one (Kafka transactional id,
    Pulsar exclusive producer). This broker can no longer write to it; retry through the new
    owner."""

    code: ClassVar[int] = 34


@attrs.frozen(str=False)
class EntryTooLargeError(InvalidBatchError):
    """A batch does not fit into one entry of the backend (Pulsar ``maxMessageSize``). The
    backend stored nothing of it, for certain: the batch fails alone, and neither a retry nor
    a rebuild of the partition would help."""

    code: ClassVar[int] = 35


@attrs.frozen(str=False)
class InternalError(ProducerError):
    """A bug in idempotent or an adapter: an exception nobody expected. It is logged with its
    traceback where it was caught and never retried; the operation's outcome is unknown."""

    code: ClassVar[int] = 2


@attrs.frozen(str=False)
class IllegalStateTransition(InternalError):
    """A core state machine was asked for a move its transition table does not allow (for
    example an outgoing batch sent twice without an answer between, see
    :mod:`idempotent.core.transitions`). A bug in the caller: raised where the move was asked
    for, before anything changed; the object is left in the state it was in, but whatever
    asked for the move is in doubt, so treat it as FATAL."""

    code: ClassVar[int] = 4


@attrs.frozen(str=False)
class CorruptDataError(ProducerError):
    """Stored data cannot be decoded: a checker snapshot of an unknown format or garbled (the
    broker then rebuilds from the log alone, which holds every batch boundary), or a damaged
    backend file (SQLite's SQLITE_CORRUPT or SQLITE_NOTADB; the message names the file and
    how to check it). Retrying cannot repair it."""

    code: ClassVar[int] = 3


@attrs.frozen(str=False)
class ProducerStateLostError(CorruptDataError):
    """A named producer's restart was refused: its stored checker state on a partition it
    wrote is missing, older than the data, or unreadable, and the partition's records within
    the rebuild window do not decide where its sequences end. Starting from an empty state
    would store its resends a second time, so nothing was opened and nothing written. The
    message names the producer, the topic and partition, and what to do (raise the rebuild
    window, or open the producer under a new name). ``producer_name``, ``topic`` and
    ``partition`` say which state."""

    producer_name: str = ""
    topic: str = ""
    partition: int = -1
    code: ClassVar[int] = 5


def internal_error(what: str, exc: BaseException, log: logging.Logger) -> InternalError:
    """Log an unexpected exception with its traceback and return the :class:`InternalError`
    to raise or report instead: the one way a bug enters the tree (never as a retriable
    error). ``what`` says what was being done."""
    log.error("bug while %s: %r", what, exc, exc_info=exc)
    error = InternalError(f"internal error while {what}: {exc!r} (a bug; logged with its traceback)")
    error.__cause__ = exc
    return error


@attrs.frozen(str=False)
class RequestTimeoutError(TransportError):
    """No answer arrived in time."""

    code: ClassVar[int] = 32


@attrs.frozen(str=False)
class ReadTimeoutError(RequestTimeoutError):
    """``Reader.read_next`` found no message within its timeout. Nothing was lost and the
    reader's position is unchanged: call again to keep waiting."""

    code: ClassVar[int] = 38


@attrs.frozen(str=False)
class BrokerConnectionError(TransportError):
    """The broker server could not be reached, or the connection broke while requests were
    outstanding (their outcome is unknown; resending them is safe)."""

    code: ClassVar[int] = 36


@attrs.frozen(str=False)
class DeliveryTimeoutError(TransportError):
    """A batch that was already sent outlived the delivery timeout. Its sequences cannot be
    skipped, so the producer stops; a named producer re-initialises to learn what was stored."""

    recovery: ClassVar[Recovery] = Recovery.BUMP_EPOCH
    code: ClassVar[int] = 33


@attrs.frozen(str=False)
class RemoteProtocolError(TransportError, ProtocolError):
    """The peer sent bytes that break the wire protocol (a malformed or oversized frame, an
    answer that is not one, a server that does not speak it). The connection is closed; the
    outcome of requests outstanding on it is unknown."""

    recovery: ClassVar[Recovery] = Recovery.FATAL
    code: ClassVar[int] = 17


@attrs.frozen(str=False)
class DeliveryFailed(ProducerError):
    """A message's terminal failure, set as the exception of its future.

    ``status`` is NOT_PERSISTED (safe to send again as new data) or POSSIBLY_PERSISTED
    (may be in the log; sending again may duplicate unless the same producer name resumes).
    ``__cause__`` is the error that ended the batch, and ``recovery`` is copied from it.
    ``topic``, ``partition`` and ``sequence`` say which record it was, so a caller can
    resolve a POSSIBLY_PERSISTED record by reading the partition.
    """

    status: DeliveryStatus = DeliveryStatus.NOT_PERSISTED
    cause_recovery: Recovery = Recovery.FATAL
    topic: str = ""
    partition: int = -1
    #: the record's sequence, or -1 when it was never assigned one (never sent)
    sequence: int = -1
    code: ClassVar[int] = 40

    @property
    def recovery(self) -> Recovery:  # type: ignore[override]
        return self.cause_recovery


def _subclasses(cls: type[ProducerError]) -> list[type[ProducerError]]:
    out = [cls]
    for sub in cls.__subclasses__():
        out.extend(_subclasses(sub))
    return out


_BY_CODE: dict[int, type[ProducerError]] = {c.code: c for c in _subclasses(ProducerError)}
