"""The values of the deterministic link (:mod:`idempotent.testing.links`): the faults of its
channel, the messages a test sends and how each ended, the requests and answers on the wire,
its counters and its errors."""

from __future__ import annotations

import enum
import random

import attrs

from idempotent.core.outcomes import DeliveryStatus, ProduceResult
from idempotent.core.records import Record
from idempotent.core.types import TopicPartition

from ..errors import ConfigError, ProducerError
from .simulated_broker import BrokerStats, validate_probability

__all__ = [
    "DeadlineSpinError",
    "Fate",
    "Faults",
    "LinkStats",
    "LinkStuckError",
    "LinkViolation",
    "Message",
    "MessageEvent",
    "Request",
    "Response",
]


class Fate(enum.Enum):
    """What the channel does with one message."""

    #: delivered after the base latency.
    DELIVER = "deliver"
    #: lost.
    DROP = "drop"
    #: delivered twice: once on time and once after an extra random delay.
    DUPLICATE = "duplicate"
    #: delivered once, after an extra random delay (so later messages may overtake it).
    DELAY = "delay"
    #: not delivered; the producer gets a retriable transport error instead. For a request
    #: the broker never sees it; for a response the broker did process the request.
    ERROR = "error"


@attrs.frozen
class Faults:
    """Per-message fault probabilities of one direction of the link.

    The probabilities are exclusive alternatives and must add up to at most 1; the remainder
    is the probability of a normal delivery.

    Attributes:
        drop: the message is lost.
        duplicate: the message is delivered twice.
        delay: the message is delivered late (up to ``max_delay`` after the base latency).
        error: the producer gets a retriable transport error instead of the message.
        max_delay: the largest extra delay of a delayed or duplicated copy, in seconds.
    """

    drop: float = attrs.field(default=0.0, validator=validate_probability)
    duplicate: float = attrs.field(default=0.0, validator=validate_probability)
    delay: float = attrs.field(default=0.0, validator=validate_probability)
    error: float = attrs.field(default=0.0, validator=validate_probability)
    max_delay: float = 0.05

    def __attrs_post_init__(self) -> None:
        if self.drop + self.duplicate + self.delay + self.error > 1.0 + 1e-12:
            raise ConfigError("drop + duplicate + delay + error must be at most 1")
        if self.max_delay < 0:
            raise ConfigError(f"max_delay must be >= 0, got {self.max_delay}")

    def choose(self, rng: random.Random) -> Fate:
        """Draw one fate from ``rng``."""
        r = rng.random()
        for fate, p in (
            (Fate.DROP, self.drop),
            (Fate.DUPLICATE, self.duplicate),
            (Fate.DELAY, self.delay),
            (Fate.ERROR, self.error),
        ):
            if r < p:
                return fate
            r -= p
        return Fate.DELIVER


@attrs.frozen
class Message:
    """One record a test asked a producer to send.

    ``index`` numbers the messages of one producer in the order :meth:`LossyLink.send` was
    called; ``value`` is unique across the link and identifies the record in the logs;
    ``sequence`` is the application's sequence of the record, None when the producer numbers
    it.
    """

    producer: int
    index: int
    topic_partition: TopicPartition
    value: bytes
    at: float
    sequence: int | None = None

    @property
    def order(self) -> tuple[float, int]:
        """Sort key of the order in which the producer's ``add`` is called (by time ``at``,
        then by ``index``): the send order that the log must preserve per partition."""
        return (self.at, self.index)


@attrs.frozen
class MessageEvent:
    """How a message ended, as the producer reported it.

    Attributes:
        status: PERSISTED for a :class:`~idempotent.core.sequencer.BatchDelivered`, else the
            failure's status.
        offset: the offset reported for the record (PERSISTED only; None when unknown).
        sequence: the record's sequence, when it got one.
        duplicate: the broker answered DUPLICATE for the batch.
        error: the error of a failed message.
        rejected: ``add`` raised (the producer had already failed); the message never
            entered the producer.
        at: simulated time of the event.
        batch_id: the batch that carried the message (-1 when rejected).
        attempt: the batch's last attempt (0: never sent).
    """

    status: DeliveryStatus
    offset: int | None = None
    sequence: int | None = None
    duplicate: bool = False
    error: ProducerError | None = None
    rejected: bool = False
    at: float = 0.0
    batch_id: int = -1
    attempt: int = 0


@attrs.frozen
class Request:
    """A produce request as it travels to the broker (a snapshot of one transmission)."""

    producer: int
    batch_id: int
    attempt: int
    topic_partition: TopicPartition
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: tuple[Record, ...]
    previous_sequence: int | None = None


@attrs.frozen
class Response:
    """The broker's answer to a :class:`Request`: a result, or a transport error."""

    request: Request
    result: ProduceResult | None = None
    error: ProducerError | None = None


@attrs.define
class LinkStats:
    """Counters of what happened on the link."""

    requests: int = 0
    responses: int = 0
    dropped: int = 0
    duplicated: int = 0
    delayed: int = 0
    errors: int = 0
    outcomes: dict[str, int] = attrs.field(factory=dict)
    #: polls after which a sequencer's ``next_deadline`` was not in the future.
    spins: int = 0
    #: heap items processed.
    steps: int = 0
    #: what the broker did (recoveries, snapshots, evictions, crashes, storage faults).
    broker: BrokerStats = attrs.field(factory=BrokerStats)


class LinkViolation(AssertionError):
    """An exactly-once invariant does not hold after :meth:`LossyLink.run`."""


class LinkStuckError(RuntimeError):
    """The simulation cannot make progress, or exceeded its step or time budget."""


class DeadlineSpinError(LinkStuckError):
    """A sequencer's ``next_deadline`` is not in the future right after it was polled.

    A real shell would wake up immediately, find nothing to do, and spin.
    """
