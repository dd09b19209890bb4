"""A deterministic, fault-injecting link between producer sequencers and a broker model.

:class:`LossyLink` is a pure discrete-event simulation: no threads, no sockets, no real
clock. It connects one or more :class:`~idempotent._sequencer.ProducerSequencer` instances to
an in-memory broker model built on :class:`~idempotent._checker.PartitionChecker` (one checker
and one list-backed log per topic-partition; an offset is an index into that list).

Every request (producer to broker) and every response (broker to producer) travels through a
lossy channel where a seeded :class:`random.Random` (or an explicit script of
:class:`Fate` values) decides whether the message is delivered, dropped, duplicated, delayed
(which reorders it behind later messages) or replaced by a retriable transport error. The
broker model can also hold an accepted batch "in flight" (pushed into the checker but not yet
written and committed) for a while, so that resends arriving in between are answered
IN_FLIGHT, and can fence or forget a producer at a given time.

Simulated time is a float. The link plays the role of the producer shell: after every
delivered message it calls ``handle_timeout``, ``batches_to_send`` and ``next_event`` on every
sequencer, and when nothing is in transit it advances time to the earliest of the next message
arrival, the next broker write and every sequencer's ``next_deadline``.

Typical use::

    link = LossyLink(seed=7, requests=Faults(drop=0.1), responses=Faults(duplicate=0.1))
    p = link.add_producer(max_in_flight=5, linger=0.002)
    for i in range(100):
        link.send(p, "orders", i % 3, at=i * 0.001)
    link.run()
    link.verify()  # the exactly-once invariants; raises LinkViolation
"""

from __future__ import annotations

import enum
import heapq
import itertools
import random
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import attrs

from .._checker import CheckerConfig, PartitionChecker, Ticket, make_header
from .._outcomes import DeliveryStatus, Outcome, ProduceResult
from .._records import Record
from .._sequence import next_sequence, sequence_at
from .._sequencer import BatchDelivered, BatchFailed, Event, ProducerSequencer
from .._types import TopicPartition
from ..errors import (
    BackendUnavailableError,
    ConfigError,
    InvalidBatchError,
    ProducerError,
    RequestTimeoutError,
)

__all__ = [
    "Fate",
    "Faults",
    "LinkStats",
    "LinkStuckError",
    "LinkViolation",
    "LogEntry",
    "LossyLink",
    "Message",
    "MessageEvent",
    "Request",
    "Response",
    "SimulatedBroker",
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


def _probability(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{attribute.name} must be a probability in 0..1, got {value}")


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

    drop: float = attrs.field(default=0.0, validator=_probability)
    duplicate: float = attrs.field(default=0.0, validator=_probability)
    delay: float = attrs.field(default=0.0, validator=_probability)
    error: float = attrs.field(default=0.0, validator=_probability)
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
    called; ``value`` is unique across the link and identifies the record in the logs.
    """

    producer: int
    index: int
    topic_partition: TopicPartition
    value: bytes
    at: float

    @property
    def order(self) -> tuple[float, int]:
        """Sort key of the order in which the producer's ``add`` is called (by time ``at``,
        then by ``index``): the send order that the log must preserve per partition."""
        return (self.at, self.index)


@attrs.frozen
class MessageEvent:
    """How a message ended, as the producer reported it.

    Attributes:
        status: PERSISTED for a :class:`~idempotent._sequencer.BatchDelivered`, else the
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
class LogEntry:
    """One record in a partition's log; ``value`` identifies the :class:`Message`."""

    offset: int
    producer_id: int
    producer_epoch: int
    sequence: int
    value: bytes | None
    preloaded: bool = False


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


class LinkViolation(AssertionError):
    """An exactly-once invariant does not hold after :meth:`LossyLink.run`."""


class LinkStuckError(RuntimeError):
    """The simulation cannot make progress, or exceeded its step or time budget."""


class DeadlineSpinError(LinkStuckError):
    """A sequencer's ``next_deadline`` is not in the future right after it was polled.

    A real shell would wake up immediately, find nothing to do, and spin.
    """


@attrs.define(eq=False)
class _Write:
    request: Request
    ticket: Ticket
    ready_at: float


class SimulatedBroker:
    """In-memory broker model: a registry of producer epochs, and per topic-partition a
    :class:`PartitionChecker` and a list as the log.

    An accepted batch is pushed into the checker at once and written (appended to the log and
    committed with its offset) when its write completes, in push order per partition.
    """

    def __init__(self, checker_config: CheckerConfig | None = None) -> None:
        self.checker_config = checker_config
        self.checkers: dict[TopicPartition, PartitionChecker] = {}
        self.logs: dict[TopicPartition, list[LogEntry]] = {}
        #: producer id -> current epoch; a producer missing here is unknown to the broker.
        self.epochs: dict[int, int] = {}
        self._writes: dict[TopicPartition, deque[_Write]] = {}

    def checker(self, tp: TopicPartition) -> PartitionChecker:
        """The checker of a partition (created empty on first use)."""
        checker = self.checkers.get(tp)
        if checker is None:
            checker = self.checkers[tp] = PartitionChecker(self.checker_config)
            self.logs[tp] = []
        return checker

    def log(self, tp: TopicPartition) -> list[LogEntry]:
        """The log of a partition (empty if never written)."""
        self.checker(tp)
        return self.logs[tp]

    def register(self, producer_id: int, producer_epoch: int) -> None:
        """Admit a producer (as ``init_producer`` would)."""
        self.epochs[producer_id] = producer_epoch

    def fence(self, producer_id: int) -> None:
        """Bump a producer's epoch, as a newer instance's ``init_producer`` would."""
        self.epochs[producer_id] = self.epochs.get(producer_id, 0) + 1

    def forget(self, producer_id: int) -> None:
        """Drop a producer from the registry: its requests get UNKNOWN_PRODUCER."""
        self.epochs.pop(producer_id, None)

    def preload(self, tp: TopicPartition, producer_id: int, producer_epoch: int, last_sequence: int) -> None:
        """Write one record as if an earlier instance of the producer had stored it with
        sequence ``last_sequence`` (so a resumed producer continues at the next one)."""
        checker = self.checker(tp)
        header = make_header(producer_id, producer_epoch, last_sequence, 1)
        ticket = checker.push(header, 0.0)
        log = self.logs[tp]
        offset = len(log)
        log.append(LogEntry(offset, producer_id, producer_epoch, last_sequence, None, preloaded=True))
        checker.commit(ticket, offset)

    def receive(self, request: Request, now: float, ready_at: float) -> ProduceResult | ProducerError | None:
        """Classify a request. Returns the answer, or None when the batch was accepted and is
        being written (the answer comes from :meth:`complete_writes`)."""
        epoch = self.epochs.get(request.producer_id)
        if epoch is None:
            return ProduceResult(Outcome.UNKNOWN_PRODUCER)
        if request.producer_epoch < epoch:
            return ProduceResult(Outcome.FENCED, producer_epoch=epoch)
        tp = request.topic_partition
        checker = self.checker(tp)
        header = make_header(
            request.producer_id,
            request.producer_epoch,
            request.base_sequence,
            len(request.records),
            request.previous_sequence,
        )
        try:
            result = checker.check(header)
        except InvalidBatchError as exc:
            return exc
        if result.outcome is not Outcome.ACCEPTED:
            return result
        ticket = checker.push(header, now)
        queue = self._writes.setdefault(tp, deque())
        if queue:
            ready_at = max(ready_at, queue[-1].ready_at)
        queue.append(_Write(request, ticket, ready_at))
        return None

    def next_write_at(self) -> float | None:
        """When the next pending write completes, or None."""
        heads = [q[0].ready_at for q in self._writes.values() if q]
        return min(heads) if heads else None

    def pending_writes(self) -> int:
        """Accepted batches not yet written."""
        return sum(len(q) for q in self._writes.values())

    def complete_writes(self, now: float) -> list[Response]:
        """Write every batch whose write is due (in push order per partition); return the
        ACCEPTED answers."""
        out: list[Response] = []
        for tp, queue in self._writes.items():
            while queue and queue[0].ready_at <= now:
                write = queue.popleft()
                request = write.request
                log = self.logs[tp]
                offset = len(log)
                for i, record in enumerate(request.records):
                    log.append(
                        LogEntry(
                            offset + i,
                            request.producer_id,
                            request.producer_epoch,
                            sequence_at(request.base_sequence, i),
                            record.value,
                        )
                    )
                self.checkers[tp].commit(write.ticket, offset)
                out.append(Response(request, ProduceResult(Outcome.ACCEPTED, base_offset=offset)))
        return out


class _Kind(enum.Enum):
    ADD = 0
    REQUEST = 1
    RESPONSE = 2
    WRITE = 3
    ADMIN = 4


@attrs.define(eq=False)
class _Slot:
    index: int
    sequencer: ProducerSequencer
    handles: dict[int, Message] = attrs.field(factory=dict)
    messages: list[Message] = attrs.field(factory=list)


_HeapItem = tuple[float, int, _Kind, Any]


class LossyLink:
    """Seeded simulation of producers talking to a broker over a faulty link.

    Args:
        seed: seeds the link's :class:`random.Random`; equal seeds and inputs give equal runs.
        requests: faults of the producer-to-broker direction.
        responses: faults of the broker-to-producer direction.
        latency: base one-way delay of every message, in simulated seconds.
        write_delay: an accepted batch is written (and answered) up to this long after it was
            pushed; resends arriving meanwhile are answered IN_FLIGHT.
        retry_backoff: ``retry_at - now`` passed with every answer (the shell's backoff).
        script: explicit fates for the first messages sent (both directions, in order of
            transmission); the random faults decide once it is exhausted.
        checker_config: configuration of every partition checker.
        strict_deadlines: raise :class:`DeadlineSpinError` when a sequencer's
            ``next_deadline`` is not in the future right after being polled; when False
            such spins are counted in ``stats.spins`` and time advances by ``spin_step``.
        spin_step: see ``strict_deadlines``.
        max_steps: budget of processed messages before :class:`LinkStuckError`.
        max_time: budget of simulated time before :class:`LinkStuckError`.
    """

    def __init__(
        self,
        seed: int,
        *,
        requests: Faults | None = None,
        responses: Faults | None = None,
        latency: float = 0.001,
        write_delay: float = 0.0,
        retry_backoff: float = 0.01,
        script: Iterable[Fate] | None = None,
        checker_config: CheckerConfig | None = None,
        strict_deadlines: bool = True,
        spin_step: float = 0.001,
        max_steps: int = 2_000_000,
        max_time: float = 1e6,
    ) -> None:
        if latency < 0 or write_delay < 0 or retry_backoff < 0 or spin_step <= 0:
            raise ConfigError("latency, write_delay and retry_backoff must be >= 0, spin_step > 0")
        self.rng = random.Random(seed)
        self.request_faults = requests or Faults()
        self.response_faults = responses or Faults()
        self.latency = latency
        self.write_delay = write_delay
        self.retry_backoff = retry_backoff
        self.strict_deadlines = strict_deadlines
        self.spin_step = spin_step
        self.max_steps = max_steps
        self.max_time = max_time
        self.broker = SimulatedBroker(checker_config)
        self.stats = LinkStats()
        self.now = 0.0
        #: every message's events, in the order they happened (one each, if all is well).
        self.events: dict[Message, list[MessageEvent]] = {}
        #: how many copies of each (producer, batch id, attempt) reached the broker.
        self.deliveries: dict[tuple[int, int, int], int] = {}
        self._script: Iterator[Fate] = iter(script if script is not None else ())
        self._slots: list[_Slot] = []
        self._heap: list[_HeapItem] = []
        self._counter = itertools.count()

    # -- set-up ----------------------------------------------------------------------------

    def add_producer(
        self,
        *,
        producer_epoch: int = 0,
        last_sequences: Mapping[TopicPartition, int] | None = None,
        **options: Any,
    ) -> int:
        """Create a sequencer with a fresh producer id, admit it at the broker and return its
        index. ``options`` are passed to :class:`ProducerSequencer`.

        With ``last_sequences`` the producer is a resumed named producer: the broker is
        preloaded with one record per partition at that sequence, written by the producer's
        previous epoch, and the sequencer continues after it.
        """
        index = len(self._slots)
        producer_id = 1000 + index
        for tp, last in (last_sequences or {}).items():
            self.broker.preload(TopicPartition(*tp), producer_id, max(0, producer_epoch - 1), last)
        self.broker.register(producer_id, producer_epoch)
        sequencer = ProducerSequencer(producer_id, producer_epoch, last_sequences, **options)
        self._slots.append(_Slot(index, sequencer))
        return index

    def sequencer(self, producer: int) -> ProducerSequencer:
        """The sequencer of a producer index."""
        return self._slots[producer].sequencer

    @property
    def producers(self) -> list[ProducerSequencer]:
        """Every sequencer, by producer index."""
        return [slot.sequencer for slot in self._slots]

    def send(
        self,
        producer: int,
        topic: str,
        partition: int,
        *,
        at: float | None = None,
        value: bytes | None = None,
    ) -> Message:
        """Schedule a record to be added to a producer at simulated time ``at`` (default: now).

        ``value`` defaults to a unique ``p<producer>-m<index>``; a given value must be unique.
        """
        slot = self._slots[producer]
        index = len(slot.messages)
        when = self.now if at is None else at
        message = Message(
            producer,
            index,
            TopicPartition(topic, partition),
            value if value is not None else f"p{producer}-m{index}".encode(),
            when,
        )
        slot.messages.append(message)
        self.events[message] = []
        self._push(when, _Kind.ADD, message)
        return message

    def flush(self, producer: int, *, at: float | None = None) -> None:
        """Schedule ``flush()`` on a producer's sequencer (seal open batches at once)."""
        self._push(self.now if at is None else at, _Kind.ADMIN, ("flush", producer))

    def fence(self, producer: int, *, at: float) -> None:
        """Schedule the broker to bump the producer's epoch (a newer instance appeared)."""
        self._push(at, _Kind.ADMIN, ("fence", producer))

    def forget(self, producer: int, *, at: float) -> None:
        """Schedule the broker to forget the producer (UNKNOWN_PRODUCER from then on)."""
        self._push(at, _Kind.ADMIN, ("forget", producer))

    def close(self, producer: int, *, at: float) -> None:
        """Schedule ``close()`` on a producer's sequencer (fail what is unfinished)."""
        self._push(at, _Kind.ADMIN, ("close", producer))

    # -- results ---------------------------------------------------------------------------

    @property
    def messages(self) -> list[Message]:
        """Every message sent, by producer then index."""
        return [m for slot in self._slots for m in slot.messages]

    @property
    def logs(self) -> dict[TopicPartition, list[LogEntry]]:
        """Every partition's log."""
        return self.broker.logs

    def outcome(self, message: Message) -> MessageEvent:
        """The single event of a message.

        Raises:
            LinkViolation: the message has no event or more than one.
        """
        events = self.events[message]
        if len(events) != 1:
            raise LinkViolation(f"{message} has {len(events)} events: {events}")
        return events[0]

    def failure(self, producer: int) -> ProducerError | None:
        """The error that failed a producer, or None."""
        return self._slots[producer].sequencer.failure

    # -- running ---------------------------------------------------------------------------

    def _push(self, when: float, kind: _Kind, payload: object) -> None:
        heapq.heappush(self._heap, (when, next(self._counter), kind, payload))

    def _fate(self, faults: Faults) -> Fate:
        fate = next(self._script, None)
        return fate if fate is not None else faults.choose(self.rng)

    def _transmit(self, kind: _Kind, payload: Request | Response, faults: Faults) -> None:
        fate = self._fate(faults)
        arrive = self.now + self.latency
        if fate is Fate.DROP:
            self.stats.dropped += 1
            return
        if fate is Fate.ERROR:
            self.stats.errors += 1
            request = payload if isinstance(payload, Request) else payload.request
            error: ProducerError = (
                BackendUnavailableError("injected: request not sent")
                if kind is _Kind.REQUEST
                else RequestTimeoutError("injected: answer lost")
            )
            self._push(arrive, _Kind.RESPONSE, Response(request, error=error))
            return
        if fate is Fate.DELAY:
            self.stats.delayed += 1
            self._push(arrive + self.rng.uniform(0.0, faults.max_delay), kind, payload)
            return
        self._push(arrive, kind, payload)
        if fate is Fate.DUPLICATE:
            self.stats.duplicated += 1
            self._push(arrive + self.rng.uniform(0.0, faults.max_delay), kind, payload)

    def _admin(self, action: str, producer: int) -> None:
        slot = self._slots[producer]
        if action == "flush":
            slot.sequencer.flush()
        elif action == "close":
            slot.sequencer.close()
        elif action == "fence":
            self.broker.fence(slot.sequencer.producer_id)
        elif action == "forget":
            self.broker.forget(slot.sequencer.producer_id)
        else:  # pragma: no cover - internal
            raise ValueError(action)

    def _add(self, message: Message) -> None:
        slot = self._slots[message.producer]
        tp = message.topic_partition
        try:
            handle = slot.sequencer.add(tp.topic, tp.partition, Record(message.value), self.now)
        except ProducerError as exc:
            self._record(
                message,
                MessageEvent(DeliveryStatus.NOT_PERSISTED, error=exc, rejected=True, at=self.now),
            )
            return
        slot.handles[handle] = message

    def _record(self, message: Message, event: MessageEvent) -> None:
        self.events[message].append(event)
        key = "rejected" if event.rejected else event.status.value
        self.stats.outcomes[key] = self.stats.outcomes.get(key, 0) + 1

    def _receive(self, request: Request) -> None:
        key = (request.producer, request.batch_id, request.attempt)
        self.deliveries[key] = self.deliveries.get(key, 0) + 1
        ready_at = self.now + (self.rng.uniform(0.0, self.write_delay) if self.write_delay else 0.0)
        answer = self.broker.receive(request, self.now, ready_at)
        if answer is None:
            if ready_at <= self.now:
                self._complete_writes()
            else:
                self._push(ready_at, _Kind.WRITE, request.topic_partition)
            return
        response = Response(request, error=answer) if isinstance(answer, ProducerError) else Response(request, answer)
        self._answer(response)

    def _answer(self, response: Response) -> None:
        self.stats.responses += 1
        if response.result is not None:
            name = response.result.outcome.value
            self.stats.outcomes[name] = self.stats.outcomes.get(name, 0) + 1
        self._transmit(_Kind.RESPONSE, response, self.response_faults)

    def _complete_writes(self) -> None:
        for response in self.broker.complete_writes(self.now):
            self._answer(response)

    def _deliver(self, response: Response) -> None:
        request = response.request
        sequencer = self._slots[request.producer].sequencer
        retry_at = self.now + self.retry_backoff
        if response.result is not None:
            sequencer.handle_result(request.batch_id, request.attempt, response.result, self.now, retry_at)
        else:
            assert response.error is not None
            sequencer.handle_error(request.batch_id, request.attempt, response.error, self.now, retry_at)

    def _poll(self, slot: _Slot) -> None:
        sequencer = slot.sequencer
        sequencer.handle_timeout(self.now)
        for batch in sequencer.batches_to_send(self.now):
            self.stats.requests += 1
            request = Request(
                slot.index,
                batch.batch_id,
                batch.attempt,
                batch.topic_partition,
                sequencer.producer_id,
                sequencer.producer_epoch,
                batch.base_sequence,
                tuple(batch.records),
                batch.previous_sequence,
            )
            self._transmit(_Kind.REQUEST, request, self.request_faults)
        while (event := sequencer.next_event()) is not None:
            self._events_of(slot, event)
        deadline = sequencer.next_deadline()
        if deadline is not None and deadline <= self.now:
            self.stats.spins += 1
            if self.strict_deadlines:
                raise DeadlineSpinError(
                    f"producer {slot.index}: next_deadline() = {deadline} <= now = {self.now} "
                    "right after handle_timeout and batches_to_send"
                )

    def _events_of(self, slot: _Slot, event: Event) -> None:
        batch = event.batch
        for i, handle in enumerate(batch.handles):
            assert isinstance(handle, int)
            message = slot.handles[handle]
            sequence = None if batch.attempt == 0 else sequence_at(batch.base_sequence, i)
            if isinstance(event, BatchDelivered):
                offset = None if event.base_offset is None else event.base_offset + i
                self._record(
                    message,
                    MessageEvent(
                        DeliveryStatus.PERSISTED,
                        offset,
                        sequence,
                        event.duplicate,
                        at=self.now,
                        batch_id=batch.batch_id,
                        attempt=batch.attempt,
                    ),
                )
            else:
                assert isinstance(event, BatchFailed)
                self._record(
                    message,
                    MessageEvent(
                        event.status,
                        None,
                        sequence,
                        error=event.error,
                        at=self.now,
                        batch_id=batch.batch_id,
                        attempt=batch.attempt,
                    ),
                )

    def _poll_all(self) -> None:
        for slot in self._slots:
            self._poll(slot)

    def _next_time(self) -> float | None:
        times = [self._heap[0][0]] if self._heap else []
        for slot in self._slots:
            deadline = slot.sequencer.next_deadline()
            if deadline is not None:
                times.append(max(deadline, self.now + self.spin_step) if deadline <= self.now else deadline)
        return min(times) if times else None

    def _finished(self) -> bool:
        # scheduled fences, closes etc. cannot change how messages ended once all have ended
        return all(slot.sequencer.unfinished == 0 for slot in self._slots) and all(
            item[2] is _Kind.ADMIN for item in self._heap
        )

    def run(self) -> LossyLink:
        """Run until every message has ended and nothing is left in transit or being written.

        Returns:
            The link itself, for chaining.

        Raises:
            LinkStuckError: no progress is possible while messages are unfinished, or the
                step or time budget ran out.
            DeadlineSpinError: see ``strict_deadlines``.
        """
        self._poll_all()
        while not self._finished():
            when = self._next_time()
            if when is None:
                unfinished = {s.index: s.sequencer.unfinished for s in self._slots}
                raise LinkStuckError(f"stuck at t={self.now}: unfinished {unfinished}, nothing scheduled")
            if when > self.max_time:
                raise LinkStuckError(f"simulated time budget {self.max_time} s exceeded")
            self.now = max(self.now, when)
            while self._heap and self._heap[0][0] <= self.now:
                _, _, kind, payload = heapq.heappop(self._heap)
                self.stats.steps += 1
                if self.stats.steps > self.max_steps:
                    raise LinkStuckError(f"step budget {self.max_steps} exceeded at t={self.now}")
                # like a shell woken by the input: poll the producer whose state it changed
                if kind is _Kind.ADD:
                    self._add(payload)
                    self._poll(self._slots[payload.producer])
                elif kind is _Kind.REQUEST:
                    self._receive(payload)
                elif kind is _Kind.RESPONSE:
                    self._deliver(payload)
                    self._poll(self._slots[payload.request.producer])
                elif kind is _Kind.WRITE:
                    self._complete_writes()
                else:
                    self._admin(*payload)
                    self._poll(self._slots[payload[1]])
            self._poll_all()  # and every producer whose deadline may have come
        return self

    # -- invariants ------------------------------------------------------------------------

    def refused_duplicates(self, message: Message) -> bool:
        """True when an attempt of the message's batch reached the broker more than once (the
        link duplicated the request), so a refusal of one copy says nothing about the other."""
        events = self.events[message]
        if len(events) != 1 or events[0].attempt == 0:
            return False
        return any(
            self.deliveries.get((message.producer, events[0].batch_id, attempt), 0) > 1
            for attempt in range(1, events[0].attempt + 1)
        )

    def violations(self, *, allow_duplicated_refusals: bool = False) -> list[str]:
        """Every broken exactly-once invariant, in words (empty when all hold):

        * every message has exactly one event;
        * no record appears twice in the logs, and every logged record is a sent message
          (or a preloaded one);
        * per producer and partition, the logged records are in send order with consecutive
          sequences;
        * a PERSISTED message is in its partition's log exactly once, at the offset reported;
        * a NOT_PERSISTED message is in no log;
        * a producer that did not fail delivered every message it accepted.

        The sequencer reports a batch NOT_PERSISTED when the broker refused its only attempt,
        which presumes that one attempt reaches the broker at most once. With
        ``allow_duplicated_refusals`` a NOT_PERSISTED message in the log is tolerated when
        the link delivered an attempt of its batch twice (see :meth:`refused_duplicates`).
        """
        problems: list[str] = []
        by_value = {m.value: m for m in self.messages}
        found: dict[bytes, list[tuple[TopicPartition, LogEntry]]] = {}
        runs: dict[tuple[TopicPartition, int], list[LogEntry]] = {}
        for tp, log in self.logs.items():
            for position, entry in enumerate(log):
                if entry.offset != position:
                    problems.append(f"{tp}: entry at index {position} has offset {entry.offset}")
                runs.setdefault((tp, entry.producer_id), []).append(entry)
                if entry.preloaded:
                    continue
                if entry.value not in by_value:
                    problems.append(f"{tp}@{entry.offset}: unknown record {entry.value!r}")
                    continue
                found.setdefault(entry.value, []).append((tp, entry))
        for value, places in found.items():
            if len(places) > 1:
                where = [(str(tp), e.offset) for tp, e in places]
                problems.append(f"{value!r} is logged {len(places)} times: {where}")
            for tp, _entry in places:
                message = by_value[value]
                if tp != message.topic_partition:
                    problems.append(f"{value!r} sent to {message.topic_partition} but logged on {tp}")
        for (tp, producer_id), entries in runs.items():
            for before, after in itertools.pairwise(entries):
                if after.sequence != next_sequence(before.sequence):
                    problems.append(
                        f"{tp} producer {producer_id}: sequence {after.sequence} at offset "
                        f"{after.offset} follows {before.sequence}"
                    )
                first = by_value.get(before.value or b"")
                second = by_value.get(after.value or b"")
                if first is not None and second is not None and second.order <= first.order:
                    problems.append(f"{tp} producer {producer_id}: {after.value!r} logged after {before.value!r}")
        for message in self.messages:
            events = self.events[message]
            if len(events) != 1:
                problems.append(f"{message.value!r}: {len(events)} events {events}")
                continue
            event = events[0]
            places = found.get(message.value, [])
            if event.status is DeliveryStatus.PERSISTED:
                if len(places) != 1:
                    problems.append(f"{message.value!r} PERSISTED but logged {len(places)} times")
                elif event.offset is not None and places[0][1].offset != event.offset:
                    problems.append(
                        f"{message.value!r} PERSISTED at reported offset {event.offset} "
                        f"(duplicate={event.duplicate}) but logged at {places[0][1].offset}"
                    )
                elif event.sequence is not None and places[0][1].sequence != event.sequence:
                    problems.append(
                        f"{message.value!r} reported sequence {event.sequence}, logged {places[0][1].sequence}"
                    )
            elif (
                event.status is DeliveryStatus.NOT_PERSISTED
                and places
                and not (allow_duplicated_refusals and self.refused_duplicates(message))
            ):
                problems.append(
                    f"{message.value!r} ended NOT_PERSISTED ({event.error!r}) but is logged at "
                    f"{[(str(tp), e.offset) for tp, e in places]}"
                )
            if self.failure(message.producer) is None and event.status is not DeliveryStatus.PERSISTED:
                problems.append(f"{message.value!r} ended {event.status.value} although its producer did not fail")
        return problems

    def verify(self, *, allow_duplicated_refusals: bool = False) -> None:
        """Raise :class:`LinkViolation` listing every broken invariant (see :meth:`violations`)."""
        problems = self.violations(allow_duplicated_refusals=allow_duplicated_refusals)
        if problems:
            shown = "\n  ".join(problems[:20])
            more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
            raise LinkViolation(f"{len(problems)} exactly-once violations:\n  {shown}{more}")
