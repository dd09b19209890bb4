"""A deterministic, fault-injecting link between producer sequencers and a broker.

:class:`LossyLink` is a pure discrete-event simulation: no threads, no sockets, no real
clock. It connects one or more :class:`~idempotent.core.sequencer.ProducerSequencer` instances to
a :class:`~idempotent.testing.simulated_broker.SimulatedBroker`: the broker's real core (the
producer registry and one :class:`~idempotent.core.partition.PartitionCore` per partition) over
in-memory lists, with one list-backed log per topic-partition (an offset is an index into that
list). Admission, sequence checks, eviction, the policies, the deduplication switch, snapshots
and recovery are all the shipped code's.

Every request (producer to broker) and every response (broker to producer) travels through a
lossy channel where a seeded :class:`random.Random` (or an explicit script of
:class:`Fate` values) decides whether the message is delivered, dropped, duplicated, delayed
(which reorders it behind later messages) or replaced by a retriable transport error. The
broker can hold an accepted batch "in flight" (appended by the core but not yet written) for a
while, so that resends arriving in between are answered IN_FLIGHT; its storage can fail
(:class:`~idempotent.testing.simulated_broker.StorageFaults`); it can fence or forget a
producer, change a topic's policy or deduplication switch, and crash and restart at given
times (the lists survive, the rest is rebuilt from the newest snapshot and the log).

Simulated time is a float. The link plays the role of the producer shell: after every
delivered message it calls ``handle_timeout``, ``batches_to_send`` and ``next_event`` on every
sequencer, and when nothing is in transit it advances time to the earliest of the next message
arrival, the next broker write and every sequencer's ``next_deadline``.

Typical use::

    link = LossyLink(seed=7, requests=Faults(drop=0.1), responses=Faults(duplicate=0.1))
    p = link.add_producer(max_in_flight=5, linger=0.002)
    for i in range(100):
        link.send(p, "orders", i % 3, at=i * 0.001)
    link.crash(at=0.05, downtime=0.01)
    link.run()
    link.verify()  # the exactly-once invariants; raises LinkViolation
"""

from __future__ import annotations

import enum
import heapq
import itertools
import random
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import attrs

from idempotent.core.checker import CheckerConfig, Policy
from idempotent.core.outcomes import DeliveryStatus, ProduceResult
from idempotent.core.records import BatchHeader, Record
from idempotent.core.sequence import next_sequence, sequence_at
from idempotent.core.sequencer import BatchDelivered, BatchFailed, Event, ProducerSequencer
from idempotent.core.types import DEFAULT_MAX_IN_FLIGHT, Epoch, ProducerId, Sequence, TopicPartition

from ..errors import (
    BackendUnavailableError,
    ConfigError,
    DeliveryTimeoutError,
    ProducerError,
    RequestTimeoutError,
)
from .link_values import (
    DeadlineSpinError,
    Fate,
    Faults,
    LinkStats,
    LinkStuckError,
    LinkViolation,
    Message,
    MessageEvent,
    Request,
    Response,
)
from .simulated_broker import LogEntry, SimulatedBroker, SimulatedStorage, StorageFaults

__all__ = [
    "DeadlineSpinError",
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
    "StorageFaults",
]


class _Kind(enum.Enum):
    ADD = 0
    REQUEST = 1
    RESPONSE = 2
    WRITE = 3
    ADMIN = 4


@attrs.frozen
class _Admin:
    """A scheduled administrative event: on a producer, a topic's settings, or the broker."""

    action: str
    producer: int | None = None
    topic: str = ""
    policy: Policy | None = None
    deduplication: bool | None = None
    downtime: float = 0.0


@attrs.define(eq=False)
class _Slot:
    index: int
    sequencer: ProducerSequencer
    producer_name: str | None
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
        checker_config: configuration of every partition core (window, ``max_producers``,
            ``producer_expiry``, snapshot cadence).
        policy: the broker's default sequence policy (:meth:`configure` sets one per topic).
        deduplication: the broker's default deduplication switch.
        storage: faults of the broker's storage (failed appends and snapshot writes).
        maintenance_interval: simulated seconds between the broker's maintenance steps
            (expiry, capacity, due snapshots); 0 runs none.
        strict_deadlines: raise :class:`DeadlineSpinError` when a sequencer's
            ``next_deadline`` is not in the future right after being polled; when False
            such spins are counted in ``stats.spins`` and time advances by ``spin_step``.
        spin_step: see ``strict_deadlines``.
        max_steps: budget of processed messages before :class:`LinkStuckError`.
        max_time: budget of simulated time before :class:`LinkStuckError`.

    Raises:
        ConfigError: a negative delay or interval, or a non-positive ``spin_step``.
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
        policy: Policy = Policy.STRICT,
        deduplication: bool = True,
        storage: StorageFaults | None = None,
        maintenance_interval: float = 0.0,
        strict_deadlines: bool = True,
        spin_step: float = 0.001,
        max_steps: int = 2_000_000,
        max_time: float = 1e6,
    ) -> None:
        if latency < 0 or write_delay < 0 or retry_backoff < 0 or maintenance_interval < 0 or spin_step <= 0:
            raise ConfigError(
                "latency, write_delay, retry_backoff and maintenance_interval must be >= 0, spin_step > 0"
            )
        self.rng = random.Random(seed)
        self.request_faults = requests or Faults()
        self.response_faults = responses or Faults()
        self.latency = latency
        self.write_delay = write_delay
        self.retry_backoff = retry_backoff
        self.maintenance_interval = maintenance_interval
        self.strict_deadlines = strict_deadlines
        self.spin_step = spin_step
        self.max_steps = max_steps
        self.max_time = max_time
        self.stats = LinkStats()
        #: the broker's durable state: it outlives every crash
        self.storage = SimulatedStorage(policy=policy, deduplication=deduplication)
        self._checker_config = checker_config
        self._storage_faults = storage
        #: the running broker; None while it is down after a crash
        self.broker: SimulatedBroker[Request] | None = self._start_broker()
        self.now = 0.0
        #: every message's events, in the order they happened (one each, if all is well).
        self.events: dict[Message, list[MessageEvent]] = {}
        #: how many copies of each (producer, batch id, attempt) reached the broker.
        self.deliveries: dict[tuple[int, int, int], int] = {}
        self._script: Iterator[Fate] = iter(script if script is not None else ())
        self._slots: list[_Slot] = []
        self._heap: list[_HeapItem] = []
        self._counter = itertools.count()
        self._next_maintenance = maintenance_interval
        #: admin events that came while the broker was down: carried out at its restart
        self._deferred: list[_Admin] = []

    def _start_broker(self) -> SimulatedBroker[Request]:
        return SimulatedBroker(
            self.storage, self._checker_config, faults=self._storage_faults, rng=self.rng, stats=self.stats.broker
        )

    def _up(self) -> SimulatedBroker[Request]:
        broker = self.broker
        if broker is None:
            raise ConfigError("the simulated broker is down")
        return broker

    # -- set-up ----------------------------------------------------------------------------

    def add_producer(
        self,
        *,
        producer_epoch: int = 0,
        last_sequences: Mapping[tuple[str, int], int] | None = None,
        anonymous: bool = False,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        batch_size: int = 1024 * 1024,
        max_batch_records: int = 10_000,
        linger: float = 0.005,
        request_timeout: float = 30.0,
        delivery_timeout: float = 120.0,
    ) -> int:
        """Initialise a producer at the broker, create its sequencer and return its index.

        The producer is named ``p<index>`` (so :meth:`fence` can start a newer instance of
        it) unless ``anonymous``. The other options are :class:`ProducerSequencer`'s.

        With ``producer_epoch`` above 0 the producer is a resumed named producer: the broker
        is preloaded with its record at the epoch before and, with ``last_sequences``, one
        record per partition at that sequence written by that epoch; the init then bumps the
        epoch, and the sequencer continues after the sequences the broker reports.

        Raises:
            ConfigError: the broker is down, ``last_sequences`` without an epoch above 0 or
                for an anonymous producer, or a sequencer option out of range.
        """
        broker = self._up()
        index = len(self._slots)
        name = None if anonymous else f"p{index}"
        if producer_epoch > 0 or last_sequences:
            if name is None or producer_epoch < 1:
                raise ConfigError("a resumed producer (last_sequences) is named and has producer_epoch >= 1")
            resumed = {TopicPartition(*tp): last for tp, last in (last_sequences or {}).items()}
            broker.preload(name, producer_epoch - 1, resumed, self.now)
        record, last = broker.init_producer(name, self.now)
        if record.producer_epoch != producer_epoch:
            raise ConfigError(f"the broker initialised {name} at epoch {record.producer_epoch}, not {producer_epoch}")
        sequencer = ProducerSequencer(
            record.producer_id,
            record.producer_epoch,
            last,
            max_in_flight=max_in_flight,
            batch_size=batch_size,
            max_batch_records=max_batch_records,
            linger=linger,
            request_timeout=request_timeout,
            delivery_timeout=delivery_timeout,
        )
        self._slots.append(_Slot(index, sequencer, name))
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
        sequence: int | None = None,
    ) -> Message:
        """Schedule a record to be added to a producer at simulated time ``at`` (default: now).

        ``value`` defaults to a unique ``p<producer>-m<index>``; a given value must be unique.
        ``sequence`` is the application's sequence for the record (PIP-6 style; see
        :meth:`ProducerSequencer.add`); the records of one producer and partition must then
        be sent with growing sequences.
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
            sequence,
        )
        slot.messages.append(message)
        self.events[message] = []
        self._push(when, _Kind.ADD, message)
        return message

    def flush(self, producer: int, *, at: float | None = None) -> None:
        """Schedule ``flush()`` on a producer's sequencer (seal open batches at once)."""
        self._push(self.now if at is None else at, _Kind.ADMIN, _Admin("flush", producer))

    def fence(self, producer: int, *, at: float) -> None:
        """Schedule a newer instance of a named producer to be initialised at the broker,
        which bumps its epoch and so fences this one.

        Raises:
            ConfigError: the producer is anonymous.
        """
        if self._slots[producer].producer_name is None:
            raise ConfigError("an anonymous producer cannot be fenced: no newer instance can claim its id")
        self._push(at, _Kind.ADMIN, _Admin("fence", producer))

    def forget(self, producer: int, *, at: float) -> None:
        """Schedule the broker to delete the producer's record, as its retention sweep does
        (UNKNOWN_PRODUCER from then on)."""
        self._push(at, _Kind.ADMIN, _Admin("forget", producer))

    def close(self, producer: int, *, at: float) -> None:
        """Schedule ``close()`` on a producer's sequencer (fail what is unfinished)."""
        self._push(at, _Kind.ADMIN, _Admin("close", producer))

    def configure(
        self, topic: str, *, policy: Policy | None = None, deduplication: bool | None = None, at: float = 0.0
    ) -> None:
        """Schedule a change of a topic's sequence policy or deduplication switch (None keeps
        the setting as it is)."""
        self._push(at, _Kind.ADMIN, _Admin("configure", topic=topic, policy=policy, deduplication=deduplication))

    def crash(self, *, at: float, downtime: float = 0.0) -> None:
        """Schedule the broker to crash at ``at`` and restart ``downtime`` later.

        At the crash, of the appends under way a random prefix per partition lands in the
        logs unanswered and the rest is lost; the registry and every partition's state are
        gone. While the broker is down every request fails at once with a retriable
        transport error (the connection is refused) and admin events wait for the restart.
        The restarted broker rebuilds a partition from its newest snapshot and its log at
        its first use.

        Raises:
            ConfigError: ``downtime`` is negative.
        """
        if downtime < 0:
            raise ConfigError(f"downtime must be >= 0, got {downtime}")
        self._push(at, _Kind.ADMIN, _Admin("crash", downtime=downtime))

    # -- results ---------------------------------------------------------------------------

    @property
    def messages(self) -> list[Message]:
        """Every message sent, by producer then index."""
        return [m for slot in self._slots for m in slot.messages]

    @property
    def logs(self) -> dict[TopicPartition, list[LogEntry]]:
        """Every partition's log (the storage's: it outlives crashes)."""
        return self.storage.logs

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

    def _admin(self, admin: _Admin) -> None:
        action = admin.action
        if action == "configure":  # stored settings: changed even while the broker is down
            if admin.policy is not None:
                self.storage.topic_policies[admin.topic] = admin.policy
            if admin.deduplication is not None:
                self.storage.topic_deduplication[admin.topic] = admin.deduplication
            return
        if action == "crash":
            if self.broker is not None:
                self.broker.crash()
                self.broker = None
            self._push(self.now + admin.downtime, _Kind.ADMIN, _Admin("restart"))
            return
        if action == "restart":
            if self.broker is None:
                self.broker = self._start_broker()
                deferred, self._deferred = self._deferred, []
                for waiting in deferred:
                    self._admin(waiting)
            return
        assert admin.producer is not None
        slot = self._slots[admin.producer]
        if action == "flush":
            slot.sequencer.flush()
        elif action == "close":
            slot.sequencer.close()
        elif self.broker is None:  # the broker's own events wait for its restart
            self._deferred.append(admin)
        elif action == "fence":
            self.broker.init_producer(slot.producer_name, self.now, read_sequences=False)
        elif action == "forget":
            self.broker.forget(slot.sequencer.producer_id)
        else:  # pragma: no cover - internal
            raise ValueError(action)

    def _add(self, message: Message) -> None:
        slot = self._slots[message.producer]
        tp = message.topic_partition
        try:
            handle = slot.sequencer.add(tp.topic, tp.partition, Record(message.value), self.now, message.sequence)
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
        broker = self.broker
        if broker is None:  # the connection is refused: the producer learns it at once
            error = BackendUnavailableError("injected: broker down")
            self._push(self.now + self.latency, _Kind.RESPONSE, Response(request, error=error))
            return
        ready_at = self.now + (self.rng.uniform(0.0, self.write_delay) if self.write_delay else 0.0)
        header = BatchHeader(
            ProducerId(request.producer_id),
            Epoch(request.producer_epoch),
            Sequence(request.base_sequence),
            len(request.records),
            request.previous_sequence,
        )
        values = [record.value for record in request.records]
        answer = broker.receive(request, request.topic_partition, header, values, self.now, ready_at)
        if answer is None:
            if ready_at <= self.now:
                self._complete_writes()
            else:
                self._push(ready_at, _Kind.WRITE, request.topic_partition)
            return
        self._answer(_response(request, answer))

    def _answer(self, response: Response) -> None:
        self.stats.responses += 1
        if response.result is not None:
            name = response.result.outcome.value
            self.stats.outcomes[name] = self.stats.outcomes.get(name, 0) + 1
        self._transmit(_Kind.RESPONSE, response, self.response_faults)

    def _complete_writes(self) -> None:
        if self.broker is not None:
            for request, answer in self.broker.complete_writes(self.now):
                self._answer(_response(request, answer))

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
        if times and self.maintenance_interval:  # maintenance alone does not keep a run going
            times.append(self._next_maintenance)
        return min(times) if times else None

    def _maintain(self) -> None:
        if not self.maintenance_interval or self.now < self._next_maintenance:
            return
        if self.broker is not None:
            self.broker.maintain(self.now)
        while self._next_maintenance <= self.now:
            self._next_maintenance += self.maintenance_interval

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
                    self._admin(payload)
                    if payload.producer is not None:
                        self._poll(self._slots[payload.producer])
            self._maintain()
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
          sequences (or, for records sent with a ``sequence``, that sequence, above the one
          before), but where a message sent between two of them timed out;
        * a PERSISTED message is in its partition's log exactly once, at the offset reported;
        * a NOT_PERSISTED message is in no log;
        * a producer that did not fail delivered every message it accepted, but those whose
          delivery timed out (a :class:`DeliveryTimeoutError`: the message alone fails, with
          its status, and the producer goes on);
        * where nothing is being written, the broker's live state is what a recovery from
          its newest snapshot and the log would rebuild (:meth:`recovery_mismatches`).

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
        # messages whose delivery timed out, by producer and partition: each fails alone and
        # its producer goes on, so the numbers of a batch that expired unstored are a hole
        # between the records sent before it and those sent after
        expired: dict[tuple[int, TopicPartition], list[tuple[float, int]]] = {}
        for message in self.messages:
            events = self.events[message]
            if len(events) == 1 and isinstance(events[0].error, DeliveryTimeoutError):
                expired.setdefault((message.producer, message.topic_partition), []).append(message.order)
        for (tp, producer_id), entries in runs.items():
            for before, after in itertools.pairwise(entries):
                first = by_value.get(before.value or b"")
                second = by_value.get(after.value or b"")
                chosen = second.sequence if second is not None else None
                hole = (
                    first is not None
                    and second is not None
                    and any(first.order < o < second.order for o in expired.get((first.producer, tp), ()))
                )
                if chosen is None and after.sequence != next_sequence(before.sequence) and not hole:
                    problems.append(
                        f"{tp} producer {producer_id}: sequence {after.sequence} at offset "
                        f"{after.offset} follows {before.sequence}"
                    )
                if chosen is not None and not after.sequence == chosen > before.sequence:
                    problems.append(
                        f"{tp} producer {producer_id}: {after.value!r} sent with sequence {chosen} is "
                        f"logged with {after.sequence} after {before.sequence}"
                    )
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
            if (
                self.failure(message.producer) is None
                and event.status is not DeliveryStatus.PERSISTED
                and not isinstance(event.error, DeliveryTimeoutError)
            ):
                problems.append(f"{message.value!r} ended {event.status.value} although its producer did not fail")
        problems.extend(self.recovery_mismatches())
        return problems

    def recovery_mismatches(self) -> list[str]:
        """Partitions where the running broker's state differs from what a recovery from
        the stored snapshot and log would build (none while the broker is down)."""
        return [] if self.broker is None else self.broker.recovery_mismatches()

    def verify(self, *, allow_duplicated_refusals: bool = False) -> None:
        """Raise :class:`LinkViolation` listing every broken invariant (see :meth:`violations`)."""
        problems = self.violations(allow_duplicated_refusals=allow_duplicated_refusals)
        if problems:
            shown = "\n  ".join(problems[:20])
            more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
            raise LinkViolation(f"{len(problems)} exactly-once violations:\n  {shown}{more}")


def _response(request: Request, answer: ProduceResult | ProducerError) -> Response:
    if isinstance(answer, ProducerError):
        return Response(request, error=answer)
    return Response(request, answer)
