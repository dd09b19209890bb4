"""Adversarial unit tests of the client-side :class:`ProducerSequencer`.

One test (or a small table) per rule of the module docstring's table, driven where it
matters through the real broker-side :class:`PartitionChecker`, so that "the checker must
accept it" is checked and not assumed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotent.core.checker import PartitionChecker, Policy, Ticket, make_header
from idempotent.core.outcomes import DeliveryStatus, Outcome, ProduceResult
from idempotent.core.records import BatchHeader, Record, StoredBatch
from idempotent.core.sequence import sequence_at
from idempotent.core.sequencer import (
    BatchDelivered,
    BatchFailed,
    Event,
    OutgoingBatch,
    ProducerSequencer,
)
from idempotent.core.types import MAX_SEQUENCE, NO_SEQUENCE, Epoch, ProducerId, Sequence, TopicPartition
from idempotent.errors import (
    AuthorizationError,
    BackendUnavailableError,
    ConfigError,
    DeliveryTimeoutError,
    InvalidBatchError,
    ProducerClosedError,
    ProducerError,
    ProducerFencedError,
    SequenceDesyncError,
    UnknownProducerError,
    UsageError,
)

PID = 7
STEPS = 10_000  # the random walk below stops as soon as everything has ended
TP = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)


def rec(i: int | str) -> Record:
    return Record(f"v{i}".encode())


def make(**options: object) -> ProducerSequencer:
    defaults: dict[str, object] = {
        "linger": 0.0,
        "request_timeout": 1.0,
        "delivery_timeout": 100.0,
        "max_in_flight": 5,
    }
    defaults.update(options)
    last = defaults.pop("last_sequences", None)
    return ProducerSequencer(PID, 0, last, **defaults)  # type: ignore[arg-type]


def drain(seq: ProducerSequencer) -> list[Event]:
    out: list[Event] = []
    while (event := seq.next_event()) is not None:
        out.append(event)
    return out


def add_batches(seq: ProducerSequencer, count: int, *, tp: TopicPartition = TP, now: float = 0.0) -> None:
    """Add ``count`` one-record batches (``max_batch_records=1`` makes every record a batch)."""
    for i in range(count):
        seq.add(tp.topic, tp.partition, rec(i), now)


class Handles:
    """Checks that every handle gets exactly one event."""

    def __init__(self) -> None:
        self.handles: set[int] = set()
        self.seen: dict[int, Event] = {}

    def add(self, seq: ProducerSequencer, tp: TopicPartition, record: Record, now: float) -> int:
        handle = seq.add(tp.topic, tp.partition, record, now)
        assert handle not in self.handles
        self.handles.add(handle)
        return handle

    def take(self, events: Iterable[Event]) -> list[Event]:
        events = list(events)
        for event in events:
            for handle in event.batch.handles:
                assert handle in self.handles, f"event for unknown handle {handle}"
                assert handle not in self.seen, f"second event for handle {handle}: {event}"
                self.seen[handle] = event
        return events

    def all_ended(self) -> bool:
        return set(self.seen) == self.handles


class Partition:
    """The broker side of one partition: a real checker and a log of (sequence, value)."""

    def __init__(self, producer_id: int = PID, epoch: int = 0) -> None:
        self.checker = PartitionChecker()
        self.log: list[tuple[int, bytes | None]] = []
        self.producer_id = producer_id
        self.epoch = epoch

    def preload(self, last_sequence: int) -> None:
        """As if an earlier instance had stored one record with ``last_sequence``."""
        self.checker.apply(
            StoredBatch(0, ProducerId(self.producer_id), Epoch(self.epoch), Sequence(last_sequence), 1, 0.0)
        )
        self.log.append((last_sequence, None))

    def header(self, batch: OutgoingBatch, epoch: int | None = None) -> BatchHeader:
        return make_header(
            self.producer_id, self.epoch if epoch is None else epoch, batch.base_sequence, len(batch.records)
        )

    def push(self, batch: OutgoingBatch) -> tuple[ProduceResult, Ticket | None]:
        """Check and, if accepted, push without committing. Returns (result, ticket or None)."""
        header = self.header(batch)
        result = self.checker.check(header)
        if result.outcome is not Outcome.ACCEPTED:
            return result, None
        return result, self.checker.push(header, 0.0)

    def commit(self, batch: OutgoingBatch, ticket: Ticket | None) -> ProduceResult:
        assert ticket is not None
        offset = len(self.log)
        for i, record in enumerate(batch.records):
            self.log.append(((batch.base_sequence + i) % 2**31, record.value))
        self.checker.commit(ticket, offset)
        return ProduceResult(Outcome.ACCEPTED, base_offset=offset)

    def produce(self, batch: OutgoingBatch) -> ProduceResult:
        """Check, push and commit at once (the normal case)."""
        result, ticket = self.push(batch)
        if ticket is None:
            return result
        return self.commit(batch, ticket)


def answer(
    seq: ProducerSequencer, batch: OutgoingBatch, result: ProduceResult, now: float = 0.0, retry_at: float | None = None
) -> None:
    seq.handle_result(batch.batch_id, batch.attempt, result, now, now + 0.5 if retry_at is None else retry_at)


# -- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"max_in_flight": 0},
        {"max_in_flight": 1001},
        {"batch_size": 0},
        {"max_batch_records": 0},
        {"max_batch_records": 1_000_001},
        {"linger": -0.1},
        {"request_timeout": 0},
        {"delivery_timeout": 0},
    ],
)
def test_bad_options_are_config_errors(options: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        make(**options)


# -- ACCEPTED / DUPLICATE ----------------------------------------------------------------------


def test_accepted_completes_with_offset_and_advances_acknowledged() -> None:
    seq = make()
    for i in range(3):
        seq.add("t", 0, rec(i), 0.0)
    [batch] = seq.batches_to_send(0.0)
    assert (batch.base_sequence, batch.attempt, len(batch.records)) == (0, 1, 3)
    assert seq.in_flight("t", 0) == 1
    answer(seq, batch, ProduceResult(Outcome.ACCEPTED, base_offset=10))
    [event] = drain(seq)
    assert isinstance(event, BatchDelivered)
    assert (event.base_offset, event.duplicate, event.batch) == (10, False, batch)
    assert seq.last_acknowledged("t", 0) == 2
    assert seq.next_sequence("t", 0) == 3
    assert seq.in_flight("t", 0) == 0
    assert seq.unfinished == 0
    assert seq.next_deadline() is None


@pytest.mark.parametrize("offset", [42, None])
def test_duplicate_completes_with_the_original_offset_or_none(offset: int | None) -> None:
    seq = make()
    seq.add("t", 0, rec(0), 0.0)
    [batch] = seq.batches_to_send(0.0)
    answer(seq, batch, ProduceResult(Outcome.DUPLICATE, base_offset=offset))
    [event] = drain(seq)
    assert isinstance(event, BatchDelivered)
    assert (event.base_offset, event.duplicate) == (offset, True)
    assert seq.last_acknowledged("t", 0) == 0


def test_acknowledgements_out_of_order_keep_the_highest() -> None:
    seq = make(max_batch_records=1)
    add_batches(seq, 3)
    a, b, c = seq.batches_to_send(0.0)
    answer(seq, c, ProduceResult(Outcome.DUPLICATE, base_offset=2))
    answer(seq, a, ProduceResult(Outcome.ACCEPTED, base_offset=0))
    assert seq.last_acknowledged("t", 0) == 2
    answer(seq, b, ProduceResult(Outcome.ACCEPTED, base_offset=1))
    assert seq.last_acknowledged("t", 0) == 2
    assert [e.batch for e in drain(seq)] == [c, a, b]


# -- OUT_OF_ORDER_SEQUENCE ---------------------------------------------------------------------


def test_out_of_order_resends_the_gap_and_later_batches_in_order_with_same_sequences() -> None:
    """A is lost; B and C are refused with expected = A: after A's request times out, A, B
    and C are resent in sequence order with their sequences unchanged, and all land."""
    seq = make(max_batch_records=1, request_timeout=1.0)
    part = Partition()
    add_batches(seq, 3)
    a, b, c = seq.batches_to_send(0.0)
    assert [x.base_sequence for x in (a, b, c)] == [0, 1, 2]
    # A's request is lost; B and C reach the broker.
    rb, rc = part.produce(b), part.produce(c)
    assert rb == rc == ProduceResult(Outcome.OUT_OF_ORDER_SEQUENCE, expected_sequence=0)
    answer(seq, b, rb, now=0.1)
    answer(seq, c, rc, now=0.1)
    assert drain(seq) == []
    # nothing is resent while A's answer is outstanding, and nothing new is sent either
    seq.add("t", 0, rec("new"), 0.1)
    assert seq.batches_to_send(0.5) == []
    assert seq.next_deadline() == pytest.approx(1.0)  # A's request timeout
    seq.handle_timeout(0.99)
    assert seq.batches_to_send(0.99) == []
    seq.handle_timeout(1.0)
    resent = seq.batches_to_send(1.0)
    # the resends first, in sequence order and unchanged; then the new batch, behind them
    assert resent[:3] == [a, b, c]
    assert [(x.base_sequence, x.attempt) for x in resent] == [(0, 2), (1, 2), (2, 2), (3, 1)]
    for x in resent:
        answer(seq, x, part.produce(x), now=1.1)
    assert [e.batch for e in drain(seq)] == resent
    assert [s for s, _ in part.log] == [0, 1, 2, 3]
    assert seq.unfinished == 0


def test_out_of_order_waits_for_the_earlier_answer_then_resends() -> None:
    """A arrives late but is accepted: B, refused before, is resent once A is answered."""
    seq = make(max_batch_records=1)
    part = Partition()
    add_batches(seq, 2)
    a, b = seq.batches_to_send(0.0)
    answer(seq, b, part.produce(b), now=0.01)  # OOO, expected 0
    assert seq.batches_to_send(0.02) == []
    answer(seq, a, part.produce(a), now=0.03)
    [b2] = seq.batches_to_send(0.03)
    assert b2 is b and (b.base_sequence, b.attempt) == (1, 2)
    answer(seq, b, part.produce(b), now=0.04)
    assert [type(e) for e in drain(seq)] == [BatchDelivered, BatchDelivered]
    assert [s for s, _ in part.log] == [0, 1]


def test_out_of_order_answer_overtaken_by_the_earlier_acknowledgement_is_not_a_desync() -> None:
    """Reordered answers: B is refused (expected A) while A is still on its way; A arrives,
    is accepted, and A's acknowledgement reaches the producer *before* B's refusal. B's
    refusal is stale (the gap it reports is already filled), so B must be resent, not fail
    the producer with SequenceDesyncError."""
    seq = make(max_batch_records=1)
    part = Partition()
    add_batches(seq, 2)
    a, b = seq.batches_to_send(0.0)
    refusal = part.produce(b)  # B overtook A on the way to the broker
    assert refusal == ProduceResult(Outcome.OUT_OF_ORDER_SEQUENCE, expected_sequence=0)
    answer(seq, a, part.produce(a), now=0.01)  # A's ACK overtakes B's refusal on the way back
    answer(seq, b, refusal, now=0.02)
    assert seq.failure is None, seq.failure
    [b2] = seq.batches_to_send(0.02)
    assert b2 is b and b.base_sequence == 1
    answer(seq, b, part.produce(b), now=0.03)
    assert [type(e) for e in drain(seq)] == [BatchDelivered, BatchDelivered]
    assert seq.unfinished == 0


def test_out_of_order_for_a_sequence_acknowledged_before_sending_is_a_desync() -> None:
    """The broker lost acknowledged data: after A's ACK, B (sent after it) is refused with
    expected = A. That is a real desync (the stale-answer allowance must not hide it)."""
    seq = make(max_batch_records=1)
    add_batches(seq, 1)
    [a] = seq.batches_to_send(0.0)
    answer(seq, a, ProduceResult(Outcome.ACCEPTED, base_offset=0))
    seq.add("t", 0, rec(1), 0.0)
    [b] = seq.batches_to_send(0.1)
    answer(seq, b, ProduceResult(Outcome.OUT_OF_ORDER_SEQUENCE, expected_sequence=0), now=0.2)
    assert isinstance(seq.failure, SequenceDesyncError)
    assert seq.failure.expected_sequence == 0


@pytest.mark.parametrize("expected", [None, 5, 1_000, MAX_SEQUENCE])
def test_out_of_order_with_an_unknown_expected_sequence_fails_everything(expected: int | None) -> None:
    seq = make(max_batch_records=1, max_in_flight=2)
    handles = Handles()
    for i in range(3):
        handles.add(seq, TP, rec(i), 0.0)
    handles.add(seq, TP1, rec("other"), 0.0)
    sent = seq.batches_to_send(0.0)
    assert [(x.partition, x.base_sequence) for x in sent] == [(0, 0), (0, 1), (1, 0)]
    first = sent[1]
    answer(seq, first, ProduceResult(Outcome.OUT_OF_ORDER_SEQUENCE, expected_sequence=expected))
    assert isinstance(seq.failure, SequenceDesyncError)
    assert seq.failure.expected_sequence == (-1 if expected is None else expected)
    events = handles.take(drain(seq))
    assert handles.all_ended()
    assert all(isinstance(e, BatchFailed) and e.error is seq.failure for e in events)
    status = {e.batch.batch_id: e.status for e in events if isinstance(e, BatchFailed)}
    # sent and not answered: possibly persisted; never sent (queued): not persisted
    assert status[sent[0].batch_id] is DeliveryStatus.POSSIBLY_PERSISTED
    assert status[sent[2].batch_id] is DeliveryStatus.POSSIBLY_PERSISTED
    queued = [e for e in events if e.batch.attempt == 0]
    assert len(queued) == 1 and queued[0].status is DeliveryStatus.NOT_PERSISTED  # type: ignore[union-attr]
    assert seq.unfinished == 0 and seq.next_deadline() is None
    assert seq.batches_to_send(10.0) == []
    with pytest.raises(SequenceDesyncError):
        seq.add("t", 0, rec("late"), 1.0)


# -- IN_FLIGHT and retriable errors ------------------------------------------------------------


def test_in_flight_resends_at_retry_at_and_not_before() -> None:
    seq = make()
    part = Partition()
    seq.add("t", 0, rec(0), 0.0)
    [a] = seq.batches_to_send(0.0)
    first, ticket = part.push(a)  # accepted, not yet durable
    assert first.outcome is Outcome.ACCEPTED
    # the first answer is lost; the request times out and the resend finds the batch in flight
    seq.handle_timeout(1.0)
    [again] = seq.batches_to_send(1.0)
    assert again is a and a.attempt == 2
    in_flight = part.produce(a)
    assert in_flight.outcome is Outcome.IN_FLIGHT
    answer(seq, a, in_flight, now=1.1, retry_at=1.6)
    assert seq.next_deadline() == pytest.approx(1.6)
    for t in (1.1, 1.3, 1.5999):
        seq.handle_timeout(t)
        assert seq.batches_to_send(t) == []
    part.commit(a, ticket)
    seq.handle_timeout(1.6)
    [third] = seq.batches_to_send(1.6)
    assert third is a and a.attempt == 3 and a.base_sequence == 0
    dup = part.produce(a)
    assert dup == ProduceResult(Outcome.DUPLICATE, base_offset=0)
    answer(seq, a, dup, now=1.7)
    [event] = drain(seq)
    assert isinstance(event, BatchDelivered) and event.duplicate and event.base_offset == 0
    assert len(part.log) == 1


def test_retriable_error_resends_at_retry_at() -> None:
    seq = make()
    seq.add("t", 0, rec(0), 0.0)
    [a] = seq.batches_to_send(0.0)
    seq.handle_error(a.batch_id, 1, BackendUnavailableError("down"), 0.1, 0.3)
    assert seq.batches_to_send(0.2) == []
    assert seq.next_deadline() == pytest.approx(0.3)
    assert seq.batches_to_send(0.3) == [a]
    assert a.attempt == 2 and seq.failure is None


def test_fatal_error_fails_everything_and_the_refused_batch_is_not_persisted() -> None:
    seq = make(max_batch_records=1)
    seq.add("t", 0, rec(0), 0.0)
    seq.add("t", 0, rec(1), 0.0)
    a, b = seq.batches_to_send(0.0)
    error = AuthorizationError("no")
    seq.handle_error(a.batch_id, 1, error, 0.1, 0.3)
    status = {e.batch.batch_id: e.status for e in drain(seq) if isinstance(e, BatchFailed)}
    assert status == {a.batch_id: DeliveryStatus.NOT_PERSISTED, b.batch_id: DeliveryStatus.POSSIBLY_PERSISTED}
    assert seq.failure is error


def test_a_refused_batch_fails_alone_and_gives_its_sequences_back() -> None:
    """InvalidBatchError: the broker stored nothing of the batch. It ends NOT_PERSISTED, the
    producer keeps working and the next batch takes over its sequences."""
    seq = make(max_batch_records=1, max_in_flight=1)
    part = Partition()
    seq.add("t", 0, rec("big"), 0.0)
    seq.add("t", 0, rec("next"), 0.0)
    [a] = seq.batches_to_send(0.0)
    error = InvalidBatchError("a record of 9437184 bytes exceeds max_record_bytes=8388608")
    seq.handle_error(a.batch_id, 1, error, 0.1, 0.3)
    [event] = drain(seq)
    assert isinstance(event, BatchFailed) and event.error is error
    assert event.status is DeliveryStatus.NOT_PERSISTED and seq.failure is None
    [b] = seq.batches_to_send(0.2)
    assert b.base_sequence == 0
    answer(seq, b, part.produce(b))
    assert [type(e) for e in drain(seq)] == [BatchDelivered] and part.log == [(0, b"vnext")]


def test_batches_in_flight_behind_a_refused_one_are_renumbered() -> None:
    seq = make(max_batch_records=1, max_in_flight=3)
    part = Partition()
    for value in ("big", "b", "c"):
        seq.add("t", 0, rec(value), 0.0)
    a, b, c = seq.batches_to_send(0.0)
    seq.handle_error(a.batch_id, 1, InvalidBatchError("too large"), 0.1, 0.3)
    for x in (b, c):  # strict: refused behind the hole the refused batch left
        assert part.produce(x) == ProduceResult(Outcome.OUT_OF_ORDER_SEQUENCE, expected_sequence=0)
        answer(seq, x, ProduceResult(Outcome.OUT_OF_ORDER_SEQUENCE, expected_sequence=0), now=0.2)
    assert seq.failure is None
    resent = seq.batches_to_send(0.3)
    assert [(x.base_sequence, x.attempt) for x in resent] == [(0, 2), (1, 2)]
    for x in resent:
        answer(seq, x, part.produce(x), now=0.4)
    assert part.log == [(0, b"vb"), (1, b"vc")]
    assert [e.status if isinstance(e, BatchFailed) else "ok" for e in drain(seq)] == [
        DeliveryStatus.NOT_PERSISTED,
        "ok",
        "ok",
    ]


# -- FENCED / UNKNOWN_PRODUCER -----------------------------------------------------------------


@pytest.mark.parametrize("resent", [False, True])
@pytest.mark.parametrize(
    ("result", "error_type"),
    [
        (ProduceResult(Outcome.FENCED, producer_epoch=3), ProducerFencedError),
        (ProduceResult(Outcome.UNKNOWN_PRODUCER), UnknownProducerError),
    ],
)
def test_fatal_outcomes_fail_every_unfinished_message_with_the_right_status(
    result: ProduceResult, error_type: type[ProducerError], resent: bool
) -> None:
    """Never sent, or every attempt refused: NOT_PERSISTED. An attempt without a definite
    answer (awaited, timed out, IN_FLIGHT): POSSIBLY_PERSISTED."""
    seq = make(max_batch_records=1, max_in_flight=2, linger=10.0)
    handles = Handles()
    hs = [handles.add(seq, TP, rec(i), 0.0) for i in range(3)]  # a, b in flight, e queued
    handles.add(seq, TP1, rec("p1"), 0.0)
    seq.flush()
    sent = seq.batches_to_send(0.0)
    seq.end_flush()
    hs.append(handles.add(seq, TP, rec("open"), 0.0))  # f: open, lingering
    assert [(x.partition, x.base_sequence) for x in sent] == [(0, 0), (0, 1), (1, 0)]
    a, b, c = sent
    answer(seq, c, ProduceResult(Outcome.ACCEPTED, base_offset=0))  # done before the failure
    if resent:
        seq.handle_timeout(1.0)
        assert seq.batches_to_send(1.0) == [a, b] and a.attempt == b.attempt == 2
    else:
        answer(seq, b, ProduceResult(Outcome.IN_FLIGHT), now=0.5, retry_at=5.0)  # b: RESEND
    answer(seq, a, result, now=1.1)
    assert isinstance(seq.failure, error_type)
    if error_type is ProducerFencedError:
        assert seq.failure.producer_epoch == 0  # type: ignore[attr-defined]
        assert "epoch 3" in str(seq.failure)
    events = handles.take(drain(seq))
    assert handles.all_ended() and seq.unfinished == 0
    status = {h: e.status for e in events if isinstance(e, BatchFailed) for h in e.batch.handles}
    delivered = [h for e in events if isinstance(e, BatchDelivered) for h in e.batch.handles]
    assert delivered == c.handles
    # a's only attempt was refused; resent, its first attempt timed out without an answer
    refused = DeliveryStatus.POSSIBLY_PERSISTED if resent else DeliveryStatus.NOT_PERSISTED
    assert status[a.handles[0]] is refused
    assert status[b.handles[0]] is DeliveryStatus.POSSIBLY_PERSISTED
    assert status[hs[2]] is DeliveryStatus.NOT_PERSISTED  # queued
    assert status[hs[3]] is DeliveryStatus.NOT_PERSISTED  # open
    assert all(e.error is seq.failure for e in events if isinstance(e, BatchFailed))
    with pytest.raises(error_type):
        seq.add("t", 0, rec("x"), 2.0)
    assert seq.batches_to_send(2.0) == [] and seq.next_deadline() is None


@pytest.mark.parametrize("outcome", [Outcome.FENCED, Outcome.UNKNOWN_PRODUCER])
def test_a_definite_refusal_is_not_persisted_unless_an_earlier_attempt_is_in_doubt(outcome: Outcome) -> None:
    """FENCED and UNKNOWN_PRODUCER store nothing: the refused attempt's batch is NOT_PERSISTED.
    When an earlier attempt timed out without an answer, that one may be stored: POSSIBLY."""
    seq = make()
    seq.add("t", 0, rec(0), 0.0)
    [a] = seq.batches_to_send(0.0)
    answer(seq, a, ProduceResult(outcome, producer_epoch=1), now=0.1)
    [event] = drain(seq)
    assert isinstance(event, BatchFailed) and event.status is DeliveryStatus.NOT_PERSISTED
    seq = make(request_timeout=1.0)
    seq.add("t", 0, rec(0), 0.0)
    [a] = seq.batches_to_send(0.0)
    seq.handle_timeout(1.0)  # attempt 1 unanswered: it may still be stored
    assert seq.batches_to_send(1.0) == [a]
    answer(seq, a, ProduceResult(outcome, producer_epoch=1), now=1.1)
    [event] = drain(seq)
    assert isinstance(event, BatchFailed) and event.status is DeliveryStatus.POSSIBLY_PERSISTED


def test_close_fails_every_unfinished_message_once() -> None:
    seq = make(max_batch_records=1, max_in_flight=1, linger=5.0)
    handles = Handles()
    for i in range(3):
        handles.add(seq, TP, rec(i), 0.0)
    [a] = seq.batches_to_send(6.0)
    handles.add(seq, TP, rec("open"), 6.0)
    seq.close()
    events = handles.take(drain(seq))
    assert handles.all_ended()
    assert all(isinstance(e, BatchFailed) and isinstance(e.error, ProducerClosedError) for e in events)
    by_batch = {e.batch.batch_id: e.status for e in events if isinstance(e, BatchFailed)}
    assert by_batch.pop(a.batch_id) is DeliveryStatus.POSSIBLY_PERSISTED
    assert set(by_batch.values()) == {DeliveryStatus.NOT_PERSISTED}
    seq.close()  # idempotent
    assert drain(seq) == []


# -- timeouts ----------------------------------------------------------------------------------


def test_request_timeout_resends_with_the_same_sequence() -> None:
    seq = make(request_timeout=2.0)
    part = Partition()
    seq.add("t", 0, rec(0), 0.0)
    [a] = seq.batches_to_send(0.5)
    assert seq.next_deadline() == pytest.approx(2.5)
    seq.handle_timeout(2.49)
    assert seq.batches_to_send(2.49) == []
    seq.handle_timeout(2.5)
    [again] = seq.batches_to_send(2.5)
    assert again is a and (a.attempt, a.base_sequence) == (2, 0)
    answer(seq, a, part.produce(a), now=2.6)
    [event] = drain(seq)
    assert isinstance(event, BatchDelivered) and event.base_offset == 0


def test_delivery_timeout_of_a_batch_never_sent_fails_only_it() -> None:
    seq = make(delivery_timeout=10.0, linger=0.0)
    handles = Handles()
    queued = handles.add(seq, TP, rec(0), 0.0)
    seq.flush()
    handles.add(seq, TP1, rec(1), 5.0)
    seq.handle_timeout(9.99)
    assert drain(seq) == []
    seq.handle_timeout(10.0)  # only the batch of TP is older than the delivery timeout
    [event] = handles.take(drain(seq))
    assert isinstance(event, BatchFailed)
    assert event.batch.handles == [queued]
    assert isinstance(event.error, DeliveryTimeoutError)
    assert event.status is DeliveryStatus.NOT_PERSISTED
    assert seq.failure is None and seq.unfinished == 1
    [b] = seq.batches_to_send(10.0)
    assert b.partition == 1 and b.base_sequence == 0
    # the expired batch used no sequence: the next batch of TP starts at 0
    seq.add("t", 0, rec(2), 10.0)
    [c] = seq.batches_to_send(10.0)
    assert c.partition == 0 and c.base_sequence == 0


def test_delivery_timeout_of_an_open_batch_fails_only_it() -> None:
    seq = make(delivery_timeout=1.0, linger=5.0)
    seq.add("t", 0, rec(0), 0.0)
    assert seq.next_deadline() == pytest.approx(1.0)
    seq.handle_timeout(1.0)
    [event] = drain(seq)
    assert isinstance(event, BatchFailed) and event.status is DeliveryStatus.NOT_PERSISTED
    assert seq.failure is None and seq.unfinished == 0 and seq.next_deadline() is None


@pytest.mark.parametrize("in_order", [True, False])
@pytest.mark.parametrize("stored", [False, True])
def test_delivery_timeout_of_a_sent_batch_fails_it_and_the_producer_goes_on(stored: bool, in_order: bool) -> None:
    seq = make(max_batch_records=1, max_in_flight=1, delivery_timeout=10.0, request_timeout=3.0, in_order=in_order)
    part = Partition()
    handles = Handles()
    for i in range(2):
        handles.add(seq, TP, rec(i), 0.0)
    [a] = seq.batches_to_send(0.0)
    if stored:  # the broker stored it; every answer was lost
        part.produce(a)
    for t in (3.0, 6.0, 9.0):  # keeps timing out and being resent
        seq.handle_timeout(t)
        assert seq.batches_to_send(t) == [a]
    assert seq.next_deadline() == pytest.approx(10.0)
    seq.handle_timeout(10.0)
    assert seq.failure is None  # an outage past the delivery timeout is not the producer's end
    events = handles.take(drain(seq))
    assert handles.all_ended()
    assert all(isinstance(e, BatchFailed) and isinstance(e.error, DeliveryTimeoutError) for e in events)
    status = {e.batch.batch_id: e.status for e in events if isinstance(e, BatchFailed)}
    assert status.pop(a.batch_id) is DeliveryStatus.POSSIBLY_PERSISTED
    assert list(status.values()) == [DeliveryStatus.NOT_PERSISTED]
    assert seq.unfinished == 0
    # the broker is back: the next record is sent after the expired batch's sequence, naming
    # no predecessor (the expired batch may or may not be stored)
    seq.add("t", 0, rec(2), 11.0)
    [c] = seq.batches_to_send(11.0)
    assert c.base_sequence == a.base_sequence + 1 and c.previous_sequence is None
    answer(seq, c, part.produce(c), now=11.1)
    if not stored and in_order:  # the broker asks for the expired batch's sequence: nothing of it is stored
        assert drain(seq) == [] and seq.failure is None
        [c] = seq.batches_to_send(11.2)
        assert c.base_sequence == a.base_sequence
        answer(seq, c, part.produce(c), now=11.3)
    [event] = drain(seq)
    if not stored and not in_order:
        # a broker whose link may reorder attempts: a late copy of the expired attempt could
        # still land in that hole, which only a new epoch could fence, so the producer fails
        # and the record it refused is NOT_PERSISTED
        assert isinstance(seq.failure, SequenceDesyncError) and seq.failure.expected_sequence == a.base_sequence
        assert isinstance(event, BatchFailed) and event.status is DeliveryStatus.NOT_PERSISTED
        assert part.log == []
        return
    assert isinstance(event, BatchDelivered) and not event.duplicate
    assert [value for _, value in part.log] == ([rec(0).value] if stored else []) + [rec(2).value]


@pytest.mark.parametrize("in_order", [True, False])
def test_batches_expired_in_flight_of_which_the_broker_stored_the_first_are_followed_from_the_second(
    in_order: bool,
) -> None:
    """The broker stored the first of two expired batches and asks for the second's sequence.
    A broker that checks attempts in order: the next batch is numbered into that hole. One
    whose link may reorder them: not (a late copy of the second's attempt could land there),
    the producer fails with the broker's expected sequence."""
    seq = make(max_batch_records=1, max_in_flight=2, delivery_timeout=10.0, request_timeout=3.0, in_order=in_order)
    part = Partition()
    handles = Handles()
    for i in range(2):
        handles.add(seq, TP, rec(i), 0.0)
    a, b = seq.batches_to_send(0.0)
    part.produce(a)  # stored, its answer lost; b never reached the broker
    seq.handle_timeout(10.0)
    events = handles.take(drain(seq))
    assert seq.failure is None and handles.all_ended()
    assert {e.status for e in events if isinstance(e, BatchFailed)} == {DeliveryStatus.POSSIBLY_PERSISTED}
    seq.add("t", 0, rec(2), 11.0)
    [c] = seq.batches_to_send(11.0)
    answer(seq, c, part.produce(c), now=11.1)  # OUT_OF_ORDER_SEQUENCE: the broker expects b's sequence
    if not in_order:
        [event] = drain(seq)
        assert isinstance(seq.failure, SequenceDesyncError) and seq.failure.expected_sequence == b.base_sequence
        assert isinstance(event, BatchFailed) and event.status is DeliveryStatus.NOT_PERSISTED
        assert [value for _, value in part.log] == [rec(0).value]
        return
    assert drain(seq) == [] and seq.failure is None
    [c] = seq.batches_to_send(11.2)
    assert c.base_sequence == b.base_sequence
    answer(seq, c, part.produce(c), now=11.3)
    [event] = drain(seq)
    assert isinstance(event, BatchDelivered) and not event.duplicate
    assert [value for _, value in part.log] == [rec(0).value, rec(2).value]


def test_a_batch_sent_unanswered_behind_an_expired_one_is_never_numbered_again() -> None:
    """The broker asks for an expired batch's sequence (nothing of it is stored) while the batch
    behind it was sent without an answer. That batch is not numbered again: a copy of an earlier
    attempt may still reach the broker under the old sequence after the renumbered resend is
    stored, and be taken as the next sequence (a duplicate reported persisted). The producer
    fails instead, the batch POSSIBLY_PERSISTED; a new instance continues from the broker's
    last sequence."""
    seq = make(max_batch_records=1, max_in_flight=2, delivery_timeout=10.0, request_timeout=3.0)
    part = Partition()
    handles = Handles()
    handles.add(seq, TP, rec(0), 0.0)
    [a] = seq.batches_to_send(0.0)
    handles.add(seq, TP, rec(1), 5.0)
    [b] = seq.batches_to_send(5.0)
    stale = part.header(b)  # b's first attempt, still on its way under sequence 1
    seq.handle_timeout(8.0)
    assert [x.batch_id for x in seq.batches_to_send(8.0)] == [a.batch_id, b.batch_id]  # resent
    seq.handle_timeout(10.0)  # a expires unanswered; b, sent at 5, has 5 s left
    [expired] = handles.take(drain(seq))
    assert isinstance(expired, BatchFailed) and expired.status is DeliveryStatus.POSSIBLY_PERSISTED
    answer(seq, b, part.produce(b), now=10.5)  # OUT_OF_ORDER_SEQUENCE: the broker expects a's 0
    assert seq.failure is None and seq.batches_to_send(10.5) == [b]  # resent, naming no predecessor
    answer(seq, b, part.produce(b), now=10.6)  # the broker still expects 0
    assert isinstance(seq.failure, SequenceDesyncError) and seq.failure.expected_sequence == 0
    [failed] = handles.take(drain(seq))
    assert isinstance(failed, BatchFailed) and failed.status is DeliveryStatus.POSSIBLY_PERSISTED
    assert seq.batches_to_send(10.6) == [] and handles.all_ended() and part.log == []
    # what renumbering would have risked: b again at 0, then the stale attempt at 1 is the next
    renumbered = make_header(PID, 0, 0, 1)
    part.checker.commit(part.checker.push(renumbered, 0.0), 0)
    assert part.checker.check(stale).outcome is Outcome.ACCEPTED


# -- stale answers -----------------------------------------------------------------------------


def test_stale_answers_are_ignored() -> None:
    seq = make(request_timeout=1.0)
    handles = Handles()
    handles.add(seq, TP, rec(0), 0.0)
    [a] = seq.batches_to_send(0.0)
    seq.handle_timeout(1.0)
    assert seq.batches_to_send(1.0) == [a] and a.attempt == 2
    # answers to attempt 1 that do not say "stored" are stale now
    for result in (
        ProduceResult(Outcome.IN_FLIGHT),
        ProduceResult(Outcome.FENCED, producer_epoch=1),
        ProduceResult(Outcome.OUT_OF_ORDER_SEQUENCE, expected_sequence=99),
        ProduceResult(Outcome.UNKNOWN_PRODUCER),
    ):
        seq.handle_result(a.batch_id, 1, result, 1.1, 1.2)
    seq.handle_error(a.batch_id, 1, InvalidBatchError("x"), 1.1, 1.2)
    seq.handle_result(12345, 1, ProduceResult(Outcome.FENCED), 1.1, 1.2)  # unknown batch
    assert drain(seq) == [] and seq.failure is None
    seq.handle_result(a.batch_id, 2, ProduceResult(Outcome.DUPLICATE, base_offset=0), 1.2, 1.3)
    handles.take(drain(seq))
    # the answer to a finished batch, again (a duplicated response), is ignored too
    seq.handle_result(a.batch_id, 2, ProduceResult(Outcome.ACCEPTED, base_offset=0), 1.3, 1.4)
    seq.handle_result(a.batch_id, 2, ProduceResult(Outcome.FENCED), 1.3, 1.4)
    assert handles.take(drain(seq)) == [] and seq.failure is None and handles.all_ended()


def test_stale_stored_answer_is_taken() -> None:
    """An old attempt's ACCEPTED is still true: the batch completes instead of being resent
    forever when request_timeout is shorter than the round trip."""
    seq = make(request_timeout=1.0)
    handles = Handles()
    handles.add(seq, TP, rec(0), 0.0)
    [a] = seq.batches_to_send(0.0)
    seq.handle_timeout(1.0)
    assert seq.batches_to_send(1.0) == [a] and a.attempt == 2
    seq.handle_result(a.batch_id, 1, ProduceResult(Outcome.ACCEPTED, base_offset=7), 1.1, 1.2)
    [event] = handles.take(drain(seq))
    assert isinstance(event, BatchDelivered) and event.base_offset == 7 and handles.all_ended()
    seq.handle_result(a.batch_id, 2, ProduceResult(Outcome.DUPLICATE, base_offset=7), 1.2, 1.3)
    assert drain(seq) == [] and seq.failure is None


def test_answer_to_an_attempt_being_resent_is_ignored() -> None:
    """Once an attempt timed out (RESEND) its late answer is ignored; the resend decides."""
    seq = make(max_batch_records=1, request_timeout=1.0)
    add_batches(seq, 2)
    a, _ = seq.batches_to_send(0.0)
    seq.handle_timeout(1.0)  # both RESEND now
    answer(seq, a, ProduceResult(Outcome.FENCED, producer_epoch=1), now=1.0)
    assert seq.failure is None and drain(seq) == []


# -- batching ----------------------------------------------------------------------------------


def test_linger_holds_a_batch_until_it_expires() -> None:
    seq = make(linger=0.5)
    seq.add("t", 0, rec(0), 1.0)
    seq.add("t", 0, rec(1), 1.2)
    assert seq.next_deadline() == pytest.approx(1.5)
    assert seq.batches_to_send(1.49) == []
    [a] = seq.batches_to_send(1.5)
    assert len(a.records) == 2


def test_flush_seals_at_once_until_end_flush() -> None:
    seq = make(linger=10.0)
    seq.add("t", 0, rec(0), 0.0)
    seq.flush()
    assert seq.next_deadline() == pytest.approx(0.0)
    [a] = seq.batches_to_send(0.0)
    seq.add("t", 0, rec(1), 0.1)
    [b] = seq.batches_to_send(0.1)
    assert b.base_sequence == 1
    seq.end_flush()
    seq.add("t", 0, rec(2), 0.2)
    assert seq.batches_to_send(0.3) == []
    assert a.records == [rec(0)]


@pytest.mark.parametrize("count", [1, 2, 3, 7, 10])
def test_max_batch_records_splits_batches(count: int) -> None:
    seq = make(max_batch_records=3, linger=1.0)
    for i in range(count):
        seq.add("t", 0, rec(i), 0.0)
    seq.flush()
    batches = seq.batches_to_send(0.0)
    sizes = [len(b.records) for b in batches]
    # at most max_in_flight (5) batches leave at once
    assert sum(sizes) == count and all(s <= 3 for s in sizes)
    assert [b.base_sequence for b in batches] == [sum(sizes[:i]) for i in range(len(sizes))]
    assert [r for b in batches for r in b.records] == [rec(i) for i in range(count)]


def test_batch_size_seals_before_overflowing() -> None:
    one = rec(0).size
    seq = make(batch_size=2 * one + 1, linger=1.0)
    for i in range(5):
        seq.add("t", 0, rec(i), 0.0)
    seq.flush()
    batches = seq.batches_to_send(0.0)
    assert [len(b.records) for b in batches] == [2, 2, 1]
    assert all(b.size <= 2 * one + 1 for b in batches)


def test_oversized_record_gets_its_own_batch() -> None:
    big = Record(b"x" * 1000)
    seq = make(batch_size=100, linger=1.0)
    seq.add("t", 0, rec(0), 0.0)
    seq.add("t", 0, big, 0.0)
    seq.add("t", 0, rec(1), 0.0)
    seq.flush()
    assert [b.records for b in seq.batches_to_send(0.0)] == [[rec(0)], [big], [rec(1)]]


@pytest.mark.parametrize(
    ("options", "records"),
    [
        ({"max_batch_records": 3}, [rec(i) for i in range(3)]),
        ({"batch_size": 3 * rec(0).size}, [rec(i) for i in range(3)]),
    ],
)
def test_a_full_batch_is_sent_without_waiting_for_linger(options: dict[str, object], records: list[Record]) -> None:
    """The docstring: a batch is sealed when it is full (bytes or records) *or* when linger
    has passed. A full batch must not wait out the linger."""
    seq = make(linger=5.0, **options)
    for r in records:
        seq.add("t", 0, r, 0.0)
    [a] = seq.batches_to_send(0.0)
    assert a.records == records
    assert seq.next_deadline() == pytest.approx(1.0)  # its request timeout


# -- next_deadline -----------------------------------------------------------------------------


def test_next_deadline_is_none_when_idle_and_tracks_the_earliest() -> None:
    seq = make(linger=0.2, request_timeout=1.0, delivery_timeout=3.0)
    assert seq.next_deadline() is None
    seq.add("t", 0, rec(0), 0.0)
    assert seq.next_deadline() == pytest.approx(0.2)
    [a] = seq.batches_to_send(0.2)
    assert seq.next_deadline() == pytest.approx(1.2)
    seq.add("t", 1, rec(1), 0.5)
    assert seq.next_deadline() == pytest.approx(0.7)
    seq.handle_timeout(1.2)
    [a2, b] = seq.batches_to_send(1.2)
    assert a2 is a and b.partition == 1
    assert seq.next_deadline() == pytest.approx(2.2)  # both request timeouts (sent at 1.2)


def test_next_deadline_is_in_the_future_while_resends_wait_for_an_earlier_answer() -> None:
    """B is refused (OOO, expected A) while A's answer is outstanding. Nothing can be sent
    until A is answered or times out, so the next deadline must be A's request timeout, not
    B's (past) ``not_before``: a shell sleeping until next_deadline() would otherwise spin."""
    seq = make(max_batch_records=1, request_timeout=30.0)
    add_batches(seq, 2)
    _, b = seq.batches_to_send(0.0)
    answer(seq, b, ProduceResult(Outcome.OUT_OF_ORDER_SEQUENCE, expected_sequence=0), now=0.01)
    seq.handle_timeout(0.02)
    assert seq.batches_to_send(0.02) == []
    deadline = seq.next_deadline()
    assert deadline is not None and deadline > 0.02
    assert deadline == pytest.approx(30.0)


def test_next_deadline_waits_for_the_first_resend_in_sequence_order() -> None:
    """Resends go out in sequence order from the first one; a later batch's earlier
    ``not_before`` cannot make anything happen sooner."""
    seq = make(max_batch_records=1)
    add_batches(seq, 2)
    a, b = seq.batches_to_send(0.0)
    answer(seq, a, ProduceResult(Outcome.IN_FLIGHT), now=0.1, retry_at=2.0)
    answer(seq, b, ProduceResult(Outcome.IN_FLIGHT), now=0.1, retry_at=0.5)
    seq.handle_timeout(0.5)
    assert seq.batches_to_send(0.5) == []
    deadline = seq.next_deadline()
    assert deadline is not None and deadline > 0.5
    assert seq.batches_to_send(2.0) == [a, b]


def test_new_batches_follow_the_resends_in_the_same_call() -> None:
    """Once every resend of a partition is out, its queued batches may go too (behind them):
    otherwise they wait for the next call, which ``next_deadline`` does not announce."""
    seq = make(max_batch_records=1, max_in_flight=2)
    add_batches(seq, 1)
    [a] = seq.batches_to_send(0.0)
    answer(seq, a, ProduceResult(Outcome.IN_FLIGHT), now=0.1, retry_at=0.2)
    seq.add("t", 0, rec("b"), 0.1)
    assert seq.batches_to_send(0.1) == []  # queued behind the pending resend
    sent = seq.batches_to_send(0.2)
    assert [(x.base_sequence, x.attempt) for x in sent] == [(0, 2), (1, 1)]
    assert sent[0] is a


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_next_deadline_never_lies(data: st.DataObject) -> None:
    """Random interleavings: after a poll at ``now`` the next deadline is in the future,
    and polling strictly before it changes nothing."""
    seq = make(
        max_batch_records=data.draw(st.integers(1, 3)),
        max_in_flight=data.draw(st.integers(1, 3)),
        linger=data.draw(st.sampled_from([0.0, 0.05, 0.3])),
        request_timeout=0.5,
        delivery_timeout=data.draw(st.sampled_from([2.0, 50.0])),
    )
    part = {TP: Partition(), TP1: Partition()}
    now = 0.0
    awaiting: list[tuple[OutgoingBatch, int]] = []
    for _ in range(data.draw(st.integers(1, 40))):
        action = data.draw(st.sampled_from(["add", "answer", "lose", "advance", "in_flight"]))
        if action == "add" and seq.failure is None:
            tp = data.draw(st.sampled_from([TP, TP1]))
            seq.add(tp.topic, tp.partition, rec(str(now)), now)
        elif action in ("answer", "lose", "in_flight") and awaiting:
            batch, attempt = awaiting.pop(data.draw(st.integers(0, len(awaiting) - 1)))
            if action == "answer" and batch.attempt == attempt:
                seq.handle_result(batch.batch_id, attempt, part[batch.topic_partition].produce(batch), now, now + 0.1)
            elif action == "in_flight":
                seq.handle_result(batch.batch_id, attempt, ProduceResult(Outcome.IN_FLIGHT), now, now + 0.2)
        elif action == "advance":
            now += data.draw(st.sampled_from([0.01, 0.1, 0.5, 1.0]))
        seq.handle_timeout(now)
        awaiting += [(b, b.attempt) for b in seq.batches_to_send(now)]
        drain(seq)
        deadline = seq.next_deadline()
        assert deadline is None or deadline > now, (deadline, now)
        probe = now if deadline is None else now + (deadline - now) / 2
        if deadline is not None and probe < deadline:  # (floats: the midpoint may round up)
            before = [(b.batch_id, b.attempt, b.state) for b in seq._batches.values()]
            seq.handle_timeout(probe)
            assert seq.batches_to_send(probe) == []
            assert drain(seq) == []
            assert [(b.batch_id, b.attempt, b.state) for b in seq._batches.values()] == before


# -- max_in_flight -----------------------------------------------------------------------------


@pytest.mark.parametrize("max_in_flight", [1, 2, 5])
def test_max_in_flight_is_respected_per_partition(max_in_flight: int) -> None:
    seq = make(max_batch_records=1, max_in_flight=max_in_flight)
    part = Partition()
    add_batches(seq, 8)
    add_batches(seq, 3, tp=TP1)
    sent = seq.batches_to_send(0.0)
    assert sum(b.partition == 0 for b in sent) == max_in_flight
    assert sum(b.partition == 1 for b in sent) == min(3, max_in_flight)
    assert seq.in_flight("t", 0) == max_in_flight
    assert seq.batches_to_send(0.1) == []
    done = 0
    t0 = [b for b in sent if b.partition == 0]
    while t0:
        answer(seq, t0[0], part.produce(t0[0]))
        done += 1
        t0 = t0[1:] + [b for b in seq.batches_to_send(0.2) if b.partition == 0]
        assert seq.in_flight("t", 0) <= max_in_flight
    assert done == 8 and [s for s, _ in part.log] == list(range(8))


# -- sequences ---------------------------------------------------------------------------------


def test_resumed_named_producer_continues_after_the_last_sequence() -> None:
    seq = make(last_sequences={TP: 41}, max_batch_records=2)
    part = Partition(epoch=0)
    part.preload(41)
    assert seq.next_sequence("t", 0) == 42
    assert seq.last_acknowledged("t", 0) == 41
    assert seq.next_sequence("t", 1) == 0 and seq.last_acknowledged("t", 1) == NO_SEQUENCE
    for i in range(3):
        seq.add("t", 0, rec(i), 0.0)
    a, b = seq.batches_to_send(0.0)
    assert (a.base_sequence, b.base_sequence) == (42, 44)
    for x in (a, b):
        assert part.produce(x).outcome is Outcome.ACCEPTED
    assert [s for s, _ in part.log] == [41, 42, 43, 44]


def test_last_sequences_accepts_plain_tuples() -> None:
    seq = make(last_sequences={("t", 0): 9})
    assert seq.next_sequence("t", 0) == 10


@pytest.mark.parametrize("batch_records", [1, 2, 3, 5])
def test_sequences_wrap_from_max_to_zero_and_the_checker_accepts(batch_records: int) -> None:
    start = 2**31 - 3
    seq = make(last_sequences={TP: start}, max_batch_records=batch_records, max_in_flight=2)
    part = Partition()
    part.preload(start)
    assert seq.next_sequence("t", 0) == 2**31 - 2
    for i in range(12):
        seq.add("t", 0, rec(i), 0.0)
    delivered = 0
    while delivered < 12:
        for batch in seq.batches_to_send(0.0):
            result = part.produce(batch)
            assert result.outcome is Outcome.ACCEPTED, (batch.base_sequence, result)
            answer(seq, batch, result)
        delivered = sum(len(e.batch.records) for e in drain(seq) if isinstance(e, BatchDelivered)) + delivered
    sequences = [s for s, _ in part.log]
    assert sequences == [start, 2**31 - 2, 2**31 - 1, *range(10)]
    assert seq.last_acknowledged("t", 0) == 9
    assert seq.next_sequence("t", 0) == 10


def test_resends_across_the_wrap_keep_their_sequences() -> None:
    start = 2**31 - 2
    seq = make(last_sequences={TP: start}, max_batch_records=2, request_timeout=1.0)
    part = Partition()
    part.preload(start)
    for i in range(4):
        seq.add("t", 0, rec(i), 0.0)
    a, b = seq.batches_to_send(0.0)
    assert (a.base_sequence, b.base_sequence) == (2**31 - 1, 1)
    rb = part.produce(b)  # a is lost
    assert rb == ProduceResult(Outcome.OUT_OF_ORDER_SEQUENCE, expected_sequence=2**31 - 1)
    answer(seq, b, rb)
    seq.handle_timeout(1.0)
    assert seq.batches_to_send(1.0) == [a, b]
    for x in (a, b):
        answer(seq, x, part.produce(x), now=1.0)
    assert [type(e) for e in drain(seq)] == [BatchDelivered, BatchDelivered]
    assert [s for s, _ in part.log] == [start, 2**31 - 1, 0, 1, 2]
    assert seq.last_acknowledged("t", 0) == 2


# -- random adversarial schedules against the real checker --------------------------------------


@pytest.mark.parametrize("policy", [Policy.STRICT, Policy.MONOTONIC])
@pytest.mark.parametrize("seed", range(40))
def test_random_schedules_every_handle_gets_exactly_one_event(seed: int, policy: Policy) -> None:
    """Random add / send / lose / duplicate / reorder / delay-commit schedules on two
    partitions against real checkers; each handle ends exactly once and logs hold every
    delivered record exactly once, in order, at the reported offset. Under ``monotonic``
    (gaps allowed) that holds because every batch names its predecessor: a reordered or lost
    request is never overtaken and then taken for a duplicate."""
    rng = random.Random(seed)
    seq = make(
        max_batch_records=rng.choice([1, 2, 4]),
        max_in_flight=rng.choice([1, 2, 5]),
        linger=rng.choice([0.0, 0.01]),
        request_timeout=0.2,
        delivery_timeout=1000.0,
    )
    parts = {TP: Partition(), TP1: Partition()}
    handles = Handles()
    values: dict[int, bytes] = {}
    wire: list[tuple[OutgoingBatch, int, tuple[Record, ...], int, int | None]] = []  # requests in transit
    replies: list[tuple[OutgoingBatch, int, ProduceResult]] = []
    pending: list[tuple[TopicPartition, OutgoingBatch, tuple[Record, ...], int, object]] = []
    now = 0.0
    for step in range(STEPS):
        if step < 60 and rng.random() < 0.5:
            tp = rng.choice([TP, TP1])
            value = f"s{step}".encode()
            h = handles.add(seq, tp, Record(value), now)
            values[h] = value
        choice = rng.random()
        if wire and choice < 0.4:
            batch, attempt, records, base, previous = wire.pop(rng.randrange(len(wire)))
            if rng.random() < 0.15:
                wire.append((batch, attempt, records, base, previous))  # duplicated on the way
            part = parts[batch.topic_partition]
            header = make_header(PID, 0, base, len(records), previous)
            result = part.checker.check(header, policy=policy)
            if result.outcome is Outcome.ACCEPTED:
                pending.append((batch.topic_partition, batch, records, attempt, part.checker.push(header, now)))
            elif rng.random() > 0.15:  # else the answer is lost
                replies.append((batch, attempt, result))
        elif pending and choice < 0.55:
            # commit the oldest pushed write of a random partition (writes are FIFO)
            tp = rng.choice([p[0] for p in pending])
            i = next(k for k, p in enumerate(pending) if p[0] == tp)
            tp, batch, records, attempt, ticket = pending.pop(i)
            part = parts[tp]
            offset = len(part.log)
            part.log.extend(((batch.base_sequence + j) % 2**31, r.value) for j, r in enumerate(records))
            part.checker.commit(ticket, offset)  # type: ignore[arg-type]
            if rng.random() > 0.15:
                replies.append((batch, attempt, ProduceResult(Outcome.ACCEPTED, base_offset=offset)))
        elif replies and choice < 0.8:
            batch, attempt, result = replies.pop(rng.randrange(len(replies)))
            seq.handle_result(batch.batch_id, attempt, result, now, now + 0.05)
        else:
            now += rng.choice([0.001, 0.01, 0.1])
        seq.handle_timeout(now)
        for batch in seq.batches_to_send(now):
            if rng.random() > 0.15:  # else the request is lost
                wire.append((batch, batch.attempt, tuple(batch.records), batch.base_sequence, batch.previous_sequence))
        handles.take(drain(seq))
        if step > 60 and seq.unfinished == 0 and not wire and not pending:
            break
    assert seq.failure is None, seq.failure
    assert handles.all_ended(), (seq.unfinished, len(wire), len(pending))
    logged: dict[bytes, int] = {}
    for part in parts.values():
        for offset, (_, stored) in enumerate(part.log):
            assert stored is not None and stored not in logged, f"{stored!r} logged twice"
            logged[stored] = offset
        sequences = [s for s, _ in part.log]
        assert sequences == list(range(len(sequences)))
    for h, event in handles.seen.items():
        assert isinstance(event, BatchDelivered)
        i = event.batch.handles.index(h)
        assert values[h] in logged
        if event.base_offset is not None:
            assert logged[values[h]] == event.base_offset + i


# -- application-chosen sequences ----------------------------------------------------------------


def test_explicit_consecutive_sequences_share_a_batch_and_a_jump_starts_a_new_one() -> None:
    seq = make()
    for s in (0, 1, 2, 10, 11, 40):
        seq.add("t", 0, rec(s), 0.0, s)
    batches = seq.batches_to_send(0.0)
    assert [(b.base_sequence, len(b.records)) for b in batches] == [(0, 3), (10, 2), (40, 1)]
    assert seq.next_sequence("t", 0) == 41
    seq.add("t", 0, rec("implicit"), 0.0)
    [implicit] = seq.batches_to_send(0.0)
    assert implicit.base_sequence == 41


def test_implicit_records_follow_an_explicit_batch_in_a_batch_of_their_own() -> None:
    seq = make()
    seq.add("t", 0, rec(0), 0.0, 100)
    seq.add("t", 0, rec(1), 0.0)
    explicit, implicit = seq.batches_to_send(0.0)
    assert [(b.base_sequence, len(b.records), b.explicit) for b in (explicit, implicit)] == [
        (100, 1, True),
        (101, 1, False),
    ]


@pytest.mark.parametrize("policy", [Policy.STRICT, Policy.MONOTONIC])
def test_a_record_without_sequence_after_an_explicit_resend_is_stored(policy: Policy) -> None:
    """Regression: a record sent without a sequence joined the open batch of an explicit
    resend of stored data, was numbered right after it (a stored sequence), and was dropped
    as a duplicate."""
    seq = make(last_sequences={TP: 9})
    part = PolicyPartition(policy)
    part.preload(0, 10)
    seq.add("t", 0, rec("again"), 0.0, 3)
    seq.add("t", 0, rec("new"), 0.0)
    events = deliver(seq, part)
    assert [(e.batch.base_sequence, e.duplicate) for e in events if isinstance(e, BatchDelivered)] == [
        (3, True),
        (10, False),
    ]
    assert part.log[-1] == (10, b"vnew")


def test_explicit_sequence_zero_and_max_are_valid_and_bad_ones_are_usage_errors() -> None:
    seq = make()
    seq.add("t", 0, rec(0), 0.0, 0)
    seq.add("t", 1, rec(0), 0.0, MAX_SEQUENCE)
    seq.add("t", 2, rec(0), 0.0, 2**63 - 1)  # 64-bit application sequences (monotonic policy)
    for bad in (-1, 2**63, True, 1.0, "3"):
        with pytest.raises(UsageError):
            seq.add("t", 0, rec(0), 0.0, bad)  # type: ignore[arg-type]
    assert seq.unfinished == 3
    assert {(b.partition, b.base_sequence) for b in seq.batches_to_send(0.0)} == {
        (0, 0),
        (1, MAX_SEQUENCE),
        (2, 2**63 - 1),
    }


def test_explicit_batch_ends_at_the_end_of_the_ring_and_resumes_at_2_to_the_31() -> None:
    seq = make()
    for s in range(MAX_SEQUENCE - 1, MAX_SEQUENCE + 3):
        seq.add("t", 0, rec(s), 0.0, s)
    seq.flush()
    [first] = seq.batches_to_send(0.0)  # a jump from 0 that a wrap could also explain: sent alone
    assert (first.base_sequence, len(first.records)) == (MAX_SEQUENCE - 1, 2)
    answer(seq, first, ProduceResult(Outcome.ACCEPTED, base_offset=0))
    [second] = seq.batches_to_send(0.0)
    assert (second.base_sequence, len(second.records)) == (MAX_SEQUENCE + 1, 2)


def test_explicit_batch_behind_the_stored_sequence_does_not_move_next_back() -> None:
    seq = make(last_sequences={TP: 9})
    for s in (3, 4):
        seq.add("t", 0, rec(s), 0.0, s)
    [old] = seq.batches_to_send(0.0)
    assert (old.base_sequence, len(old.records)) == (3, 2)
    assert seq.next_sequence("t", 0) == 10
    answer(seq, old, ProduceResult(Outcome.DUPLICATE, base_offset=None))
    [event] = drain(seq)
    assert isinstance(event, BatchDelivered) and event.duplicate
    assert seq.last_acknowledged("t", 0) == 9


def test_explicit_batch_never_straddles_the_acknowledged_sequence() -> None:
    seq = make(last_sequences={TP: 5})
    for s in range(3, 9):
        seq.add("t", 0, rec(s), 0.0, s)
    batches = seq.batches_to_send(0.0)
    assert [(b.base_sequence, len(b.records)) for b in batches] == [(3, 3), (6, 3)]


def test_explicit_jump_refused_under_strict_fails_the_producer_with_desync() -> None:
    seq = make()
    seq.add("t", 0, rec(0), 0.0, 5)
    [batch] = seq.batches_to_send(0.0)
    answer(seq, batch, ProduceResult(Outcome.OUT_OF_ORDER_SEQUENCE, expected_sequence=0))
    [event] = drain(seq)
    assert isinstance(event, BatchFailed) and isinstance(event.error, SequenceDesyncError)
    assert isinstance(seq.failure, SequenceDesyncError)


def test_explicit_batch_overlapping_a_batch_in_flight_is_cut_at_its_end() -> None:
    seq = make(max_in_flight=5)
    for s in range(5):
        seq.add("t", 0, rec(s), 0.0, s)
    [first] = seq.batches_to_send(0.0)
    assert (first.base_sequence, len(first.records)) == (0, 5)
    for s in range(3, 7):
        seq.add("t", 0, rec(f"again{s}"), 0.0, s)
    batches = seq.batches_to_send(0.0)
    assert [(b.base_sequence, len(b.records)) for b in batches] == [(3, 2), (5, 2)]
    assert seq.next_sequence("t", 0) == 7
    assert seq.unfinished == 9


def test_open_batch_keeps_growing_while_the_window_is_full() -> None:
    """Like Kafka's accumulator: a batch is closed when it can leave, so a partition waiting
    for answers sends one full batch next instead of one small batch per linger period."""
    seq = make(max_in_flight=1, linger=0.005)
    seq.add("t", 0, rec(0), 0.0)
    [first] = seq.batches_to_send(0.01)
    for i in range(1, 6):
        now = 0.1 * i
        seq.add("t", 0, rec(i), now)
        assert seq.batches_to_send(now + 0.05) == []  # window full: nothing sealed, nothing sent
        deadline = seq.next_deadline()
        assert deadline is not None and deadline > now + 0.05  # and no busy wake-up meanwhile
    answer(seq, first, ProduceResult(Outcome.ACCEPTED, 0), now=1.0)
    [second] = seq.batches_to_send(1.0)
    assert [r.value for r in second.records] == [f"v{i}".encode() for i in range(1, 6)]
    assert second.base_sequence == 1


# -- the ring or the 64-bit line: what only the policy can tell --------------------------------

#: where the ring and the 64-bit line part ways (2**30: half a ring; 2**31: past the ring)
BOUNDARIES = (2**30 - 1, 2**30, 2**30 + 1, 2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1)


class PolicyPartition:
    """A partition under ``policy``: a real checker that writes every accepted batch at once,
    checking the predecessor each attempt named; a log of (sequence, value)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.checker = PartitionChecker()
        self.log: list[tuple[int, bytes | None]] = []

    def preload(self, base: int, count: int) -> None:
        """As if an earlier instance had stored ``count`` records from ``base`` on, in one batch."""
        batch = StoredBatch(len(self.log), ProducerId(PID), Epoch(0), Sequence(base), count, 0.0)
        self.checker.apply(batch)
        self.log.extend((sequence_at(base, i), None) for i in range(count))

    def produce(self, batch: OutgoingBatch) -> ProduceResult:
        """The answer to the batch's latest attempt. Raises InvalidBatchError as the broker does."""
        header = make_header(PID, 0, batch.base_sequence, len(batch.records), batch.previous_at_send)
        result = self.checker.check(header, policy=self.policy)
        if result.outcome is not Outcome.ACCEPTED:
            return result
        offset = len(self.log)
        self.checker.commit(self.checker.push(header, 0.0), offset)
        self.log.extend((sequence_at(batch.base_sequence, i), r.value) for i, r in enumerate(batch.records))
        return ProduceResult(Outcome.ACCEPTED, base_offset=offset)


def deliver(
    seq: ProducerSequencer, part: PolicyPartition, lose: Callable[[OutgoingBatch], bool] = lambda _: False
) -> list[Event]:
    """Send until every record has ended, answering each request at once (unless ``lose``
    drops the answer of an attempt the broker handled: the request then times out)."""
    events: list[Event] = []
    now = 0.0
    for _ in range(200):
        batches = seq.batches_to_send(now)
        if not batches:
            if not seq.unfinished:
                break
            now += 2.0  # past the request timeout
            seq.handle_timeout(now)
        for batch in batches:
            try:
                result = part.produce(batch)
            except InvalidBatchError as exc:
                seq.handle_error(batch.batch_id, batch.attempt, exc, now, now)
                continue
            if not lose(batch):
                answer(seq, batch, result, now=now, retry_at=now)
        events += drain(seq)
    assert not seq.unfinished
    return events


def outcomes(events: list[Event]) -> dict[object, tuple[int, bool] | ProducerError]:
    """Each handle's (sequence, duplicate), or the error that failed it."""
    ended: dict[object, tuple[int, bool] | ProducerError] = {}
    for event in events:
        for i, handle in enumerate(event.batch.handles):
            if isinstance(event, BatchDelivered):
                ended[handle] = (sequence_at(event.batch.base_sequence, i), event.duplicate)
            else:
                ended[handle] = event.error
    return ended


@pytest.mark.parametrize("jump", [2**30 - 1, 2**30, 2**30 + 1, 1_500_000_000, 2**31 - 3, 2**31, 2**32, 2**62])
def test_monotonic_records_without_sequence_follow_a_large_jump(jump: int) -> None:
    """Regression: under the monotonic policy a record sent without a sequence after an
    explicit jump of 2**30 or more (below 2**31) was numbered on the int32 ring, behind the
    jump, and answered DUPLICATE: reported delivered, never stored. The same after a resend
    of a sequence far behind the jump."""
    seq = make()
    part = PolicyPartition(Policy.MONOTONIC)
    ended: dict[object, tuple[int, bool] | ProducerError] = {}
    sent = []
    for sequence in (0, jump, None, 0, None):  # each sent and answered before the next is added
        sent.append(seq.add("t", 0, rec(f"{sequence}"), 0.0, sequence))
        ended.update(outcomes(deliver(seq, part)))
    assert [ended[h] for h in sent] == [(0, False), (jump, False), (jump + 1, False), (0, True), (jump + 2, False)]
    assert [s for s, _ in part.log] == [0, jump, jump + 1, jump + 2]
    assert seq.last_acknowledged("t", 0) == jump + 2 and seq.failure is None


def test_strict_keeps_the_ring_for_a_producer_resumed_after_a_wrap() -> None:
    """The ring stays under strict: a resend of sequences stored before the wrap is behind the
    partition's sequence 6 (a plain comparison would put it 2**31 ahead), so the records
    without a sequence after it go on at 6, and an explicit 7 continues."""
    seq = make(last_sequences={TP: 5})
    part = PolicyPartition(Policy.STRICT)
    part.preload(2**31 - 10, 10)
    part.preload(0, 6)
    ended: dict[object, tuple[int, bool] | ProducerError] = {}
    sent = []
    for sequence in (2**31 - 5, None, 7, None):  # each sent and answered before the next is added
        sent.append(seq.add("t", 0, rec(f"{sequence}"), 0.0, sequence))
        ended.update(outcomes(deliver(seq, part)))
    assert [ended[h] for h in sent] == [(2**31 - 5, True), (6, False), (7, False), (8, False)]
    assert [s for s, _ in part.log[16:]] == [6, 7, 8]
    assert seq.last_acknowledged("t", 0) == 8 and seq.failure is None


def test_a_batch_only_the_policy_can_place_goes_alone_and_its_answer_places_it() -> None:
    seq = make(max_batch_records=1, max_in_flight=5)
    add_batches(seq, 3)
    a, b, c = seq.batches_to_send(0.0)
    seq.add("t", 0, rec("jump"), 0.0, 1_500_000_000)
    seq.add("t", 0, rec("after"), 0.0)
    assert seq.batches_to_send(0.0) == []  # it waits for the batches before it
    for i, x in enumerate((a, b, c)):
        answer(seq, x, ProduceResult(Outcome.ACCEPTED, base_offset=i))
    [jump] = seq.batches_to_send(0.0)
    assert jump.base_sequence == 1_500_000_000
    assert seq.batches_to_send(0.0) == []  # nothing is numbered behind it before its answer
    deadline = seq.next_deadline()
    assert deadline == pytest.approx(1.0)  # its request timeout: no busy wake-up meanwhile
    answer(seq, jump, ProduceResult(Outcome.ACCEPTED, base_offset=3))  # it lies ahead
    [after] = seq.batches_to_send(0.0)
    assert after.base_sequence == 1_500_000_001
    assert seq.last_acknowledged("t", 0) == 1_500_000_000


def test_a_duplicate_answer_places_a_batch_sent_alone_behind() -> None:
    seq = make(last_sequences={TP: 1_500_000_000})
    seq.add("t", 0, rec("again"), 0.0, 5)
    [old] = seq.batches_to_send(0.0)
    answer(seq, old, ProduceResult(Outcome.DUPLICATE, base_offset=None))
    assert seq.next_sequence("t", 0) == 1_500_000_001
    assert seq.last_acknowledged("t", 0) == 1_500_000_000


@pytest.mark.parametrize("policy", [Policy.STRICT, Policy.MONOTONIC])
def test_a_duplicate_after_an_unanswered_attempt_of_a_batch_sent_alone_fails_the_producer(policy: Policy) -> None:
    """The stored copy may be that attempt's (a jump, monotonic) or older data (behind, strict):
    no record without a sequence is numbered on a guess; the producer fails, loudly."""
    part = PolicyPartition(policy)
    if policy is Policy.STRICT:  # a resend of sequences stored before the wrap
        part.preload(2**31 - 10, 10)
        part.preload(0, 6)
        seq, sequence = make(last_sequences={TP: 5}), 2**31 - 5
    else:  # a jump whose acknowledgement was lost
        seq, sequence = make(), 1_500_000_000
    stored = len(part.log)
    jump = seq.add("t", 0, rec("x"), 0.0, sequence)
    after = seq.add("t", 0, rec("after"), 0.0)
    attempts: list[int] = []

    def lose_the_first(batch: OutgoingBatch) -> bool:
        attempts.append(batch.batch_id)
        return len(attempts) == 1

    ended = outcomes(deliver(seq, part, lose_the_first))
    assert ended[jump] == (sequence, True)
    assert isinstance(ended[after], SequenceDesyncError) and isinstance(seq.failure, SequenceDesyncError)
    assert "start a new producer instance" in str(seq.failure)
    assert len(part.log) == stored + (policy is Policy.MONOTONIC)  # the jump, stored once; nothing else


JUMPS = (1, 2, 2**30 - 1, 2**30, 2**30 + 1, 2**31 - 1, 2**31, 2**32, 2**62)


@settings(max_examples=300, deadline=None)
@given(
    start=st.sampled_from([None, 0, *BOUNDARIES[:-1]]),
    steps=st.lists(st.one_of(st.none(), st.sampled_from(JUMPS), st.integers(-4, -1)), max_size=20),
    max_batch_records=st.sampled_from([1, 2, 5]),
    max_in_flight=st.sampled_from([1, 2, 5]),
)
def test_monotonic_mixed_numbering_at_the_boundaries(
    start: int | None, steps: list[int | None], max_batch_records: int, max_in_flight: int
) -> None:
    """Explicit jumps of every boundary size, resends of recent sequences and records without
    a sequence, in any order: every new record is stored once under the sequence after the
    previous one (plain 64-bit), every resend is a duplicate, nothing fails."""
    last = {TP: start} if start is not None else None
    seq = make(last_sequences=last, max_batch_records=max_batch_records, max_in_flight=max_in_flight)
    part = PolicyPartition(Policy.MONOTONIC)
    stored = [] if start is None else [start]
    if start is not None:
        part.preload(start, 1)
    frontier = -1 if start is None else start
    expected: list[tuple[object, tuple[int, bool]]] = []
    for i, step in enumerate(steps):
        if step is None and frontier != MAX_SEQUENCE:  # (after 2**31-1 numbering goes on at 0: refused)
            expected.append((seq.add("t", 0, rec(i), 0.0), (frontier + 1, False)))
            frontier += 1
            stored.append(frontier)
        elif step is not None and step < 0:
            # (0 right after 2**31-1 is refused as numbering that wrapped, section 1 of semantics.md)
            if stored and not (frontier == MAX_SEQUENCE and stored[max(0, len(stored) + step)] == 0):
                again = stored[max(0, len(stored) + step)]
                expected.append((seq.add("t", 0, rec(i), 0.0, again), (again, True)))
        elif frontier + (step or 1) <= 2**63 - 2:
            frontier += step or 1
            expected.append((seq.add("t", 0, rec(i), 0.0, frontier), (frontier, False)))
            stored.append(frontier)
    ended = outcomes(deliver(seq, part))
    assert seq.failure is None, seq.failure
    assert [ended[h] for h, _ in expected] == [outcome for _, outcome in expected]
    assert [s for s, _ in part.log] == stored


@settings(max_examples=300, deadline=None)
@given(
    start=st.sampled_from([2**30 - 3, 2**30, 2**31 - 8, 2**31 - 3, 2**31 - 1]),
    steps=st.lists(st.sampled_from(["implicit", "explicit", "resend"]), max_size=20),
    max_batch_records=st.sampled_from([1, 2, 5]),
    max_in_flight=st.sampled_from([1, 2, 5]),
)
def test_strict_mixed_numbering_across_the_wrap(
    start: int, steps: list[str], max_batch_records: int, max_in_flight: int
) -> None:
    """Under strict, a resumed producer near 2**30 and near the wrap: records without a
    sequence, explicit ones continuing the partition and explicit resends of recent ones.
    Every new record is stored once at the next sequence on the ring, every resend is a
    duplicate, nothing fails."""
    seq = make(last_sequences={TP: start}, max_batch_records=max_batch_records, max_in_flight=max_in_flight)
    part = PolicyPartition(Policy.STRICT)
    part.preload(start - 2, 3)
    stored = [start - 2, start - 1, start]
    expected: list[tuple[object, tuple[int, bool]]] = []
    for i, step in enumerate(steps):
        following = sequence_at(stored[-1], 1)
        if step == "resend":
            again = stored[-1 - i % 3]
            expected.append((seq.add("t", 0, rec(i), 0.0, again), (again, True)))
            continue
        explicit = following if step == "explicit" else None
        expected.append((seq.add("t", 0, rec(i), 0.0, explicit), (following, False)))
        stored.append(following)
    ended = outcomes(deliver(seq, part))
    assert seq.failure is None, seq.failure
    assert [ended[h] for h, _ in expected] == [outcome for _, outcome in expected]
    assert [s for s, _ in part.log] == stored


# -- previous_sequence: each batch names its predecessor (the monotonic policy) ----------------


def mono_produce(checker: PartitionChecker, log: list[int], batch: OutgoingBatch) -> ProduceResult:
    """Check, push and commit a batch under the monotonic policy, with the predecessor its
    latest attempt named."""
    header = make_header(PID, 0, batch.base_sequence, len(batch.records), batch.previous_at_send)
    result = checker.check(header, policy=Policy.MONOTONIC)
    if result.outcome is Outcome.ACCEPTED:
        checker.commit(checker.push(header, 0.0), len(log))
        log.extend(batch.base_sequence + i for i in range(len(batch.records)))
        return ProduceResult(Outcome.ACCEPTED, base_offset=len(log) - len(batch.records))
    return result


def test_each_batch_names_its_predecessor_across_retries_and_renumbering() -> None:
    seq = make(max_batch_records=1, max_in_flight=3, last_sequences={TP: 41})
    add_batches(seq, 3)
    a, b, c = seq.batches_to_send(0.0)
    assert [(x.base_sequence, x.previous_sequence) for x in (a, b, c)] == [(42, 41), (43, 42), (44, 43)]
    seq.handle_error(a.batch_id, 1, InvalidBatchError("too large"), 0.1, 0.3)  # refused for good
    assert b.previous_sequence == 41  # it now names the batch before the refused one
    for x in (b, c):
        answer(seq, x, ProduceResult(Outcome.OUT_OF_ORDER_SEQUENCE, expected_sequence=42), now=0.2)
    resent = seq.batches_to_send(0.3)
    assert [(x.base_sequence, x.previous_sequence, x.attempt) for x in resent] == [(42, 41, 2), (43, 42, 2)]
    add_batches(seq, 1)  # a new batch follows the renumbered ones
    [d] = seq.batches_to_send(0.4)
    assert (d.base_sequence, d.previous_sequence) == (44, 43)


@pytest.mark.parametrize("sequences", [None, [10, 20, 30, 31, 50]])
def test_monotonic_a_batch_refused_with_nothing_stored_is_not_overtaken(sequences: list[int] | None) -> None:
    """Regression: under the monotonic policy the batches behind a batch refused for a
    passing reason were accepted, and its resend answered DUPLICATE though never stored."""
    seq = make(max_batch_records=1, max_in_flight=5)
    checker, log = PartitionChecker(), []
    wanted = sequences or list(range(5))
    for s in wanted:
        seq.add("t", 0, rec(s), 0.0, sequence=None if sequences is None else s)
    first, *rest = seq.batches_to_send(0.0)
    seq.handle_error(first.batch_id, 1, BackendUnavailableError("recovering"), 0.1, 0.2)
    for x in rest:
        answer(seq, x, mono_produce(checker, log, x), now=0.1)
    assert seq.failure is None and log == []
    for _ in range(3):
        for x in seq.batches_to_send(0.5):
            answer(seq, x, mono_produce(checker, log, x), now=0.5)
    events = drain(seq)
    assert log == wanted
    assert all(isinstance(e, BatchDelivered) and not e.duplicate for e in events) and len(events) == 5


def test_monotonic_a_batch_of_application_sequences_refused_for_good_leaves_a_declared_gap() -> None:
    seq = make(max_batch_records=1, max_in_flight=5)
    checker, log = PartitionChecker(), []
    for s in (10, 20, 30):
        seq.add("t", 0, rec(s), 0.0, sequence=s)
    a, b, c = seq.batches_to_send(0.0)
    seq.handle_error(a.batch_id, 1, InvalidBatchError("too large"), 0.1, 0.2)
    assert (b.previous_sequence, c.previous_sequence) == (-1, 20)
    for x in (b, c):  # sent naming 10, which never arrived
        answer(seq, x, mono_produce(checker, log, x), now=0.1)
    assert seq.failure is None
    for x in seq.batches_to_send(0.5):
        answer(seq, x, mono_produce(checker, log, x), now=0.5)
    assert log == [20, 30]
    events = drain(seq)
    assert [type(e) for e in events] == [BatchFailed, BatchDelivered, BatchDelivered]


def _cuts(seq: ProducerSequencer) -> list[tuple[int, int, int, int]]:
    seq.flush()
    return [(b.base_sequence, len(b.records), b.size, b.largest) for b in seq.batches_to_send(0.0)]


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 300), min_size=1, max_size=60),
    batch_size=st.integers(1, 2000),
    max_batch_records=st.integers(1, 12),
    mode=st.sampled_from(["none", "int", "list"]),
)
def test_add_many_cuts_batches_as_adding_one_record_at_a_time(
    lengths: list[int], batch_size: int, max_batch_records: int, mode: str
) -> None:
    """add_many cuts batches by bisection over the records' sizes (no sequences, or a range of
    them) or record by record (a list): the batches, their sizes and largest records are
    those of adding the records one by one."""
    records = [
        Record(b"x" * n, b"k" if n % 3 else None, [("h", b"y" * (n % 5))] if n % 4 == 0 else None) for n in lengths
    ]
    options = {"batch_size": batch_size, "max_batch_records": max_batch_records, "max_in_flight": 1000}
    one, many = make(**options), make(**options)
    start = 5
    for i, record in enumerate(records):
        one.add_one("t", 0, record, 0.0, None if mode == "none" else start + i, object())
    sequences = [start + i for i in range(len(records))]
    sequence: int | list[int] | None = {"none": None, "int": start, "list": sequences}[mode]
    many.add_many("t", 0, records, 0.0, sequence, object())
    assert _cuts(many) == _cuts(one)


def test_add_many_starts_a_new_batch_where_a_range_of_sequences_crosses_the_ring_end() -> None:
    seq = make(last_sequences={TP: MAX_SEQUENCE - 2})  # continued: no batch is sent alone
    seq.add_many("t", 0, [rec(i) for i in range(4)], 0.0, MAX_SEQUENCE - 1, object())
    assert [(base, count) for base, count, _, _ in _cuts(seq)] == [(MAX_SEQUENCE - 1, 2), (MAX_SEQUENCE + 1, 2)]


def test_record_sizes_match_the_property() -> None:
    from idempotent.core.records import record_sizes

    records = [Record(b"abc"), Record(None, b"k"), Record(b"v", None, [("name", b"12"), ("n", b"")])]
    assert record_sizes(records) == [r.size for r in records]


def test_add_many_fills_a_batch_exactly_to_its_byte_size() -> None:
    seq = make(batch_size=60, max_in_flight=1000)  # 20-byte records: three fill a batch
    seq.add_many("t", 0, [Record(b"abcd") for _ in range(7)], 0.0, None, object())
    assert [(count, size) for _, count, size, _ in _cuts(seq)] == [(3, 60), (3, 60), (1, 20)]


def test_record_columns_stay_columns_in_a_batch_until_other_records_join() -> None:
    from idempotent.core.records import RecordColumns

    seq = make(max_in_flight=1000)
    seq.add_many("t", 0, RecordColumns([b"a", b"b"], [b"k", None]), 0.0, None, object())
    seq.add_many("t", 0, RecordColumns([b"c"]), 0.0, None, object())
    seq.add_one("t", 0, Record(b"d", None, [("h", b"1")]), 0.0, None, object())
    seq.add_many("t", 0, RecordColumns([b"e"]), 0.0, None, object())
    seq.flush()
    [batch] = seq.batches_to_send(0.0)
    assert type(batch.records) is list
    assert batch.records == [
        Record(b"a", b"k"),
        Record(b"b"),
        Record(b"c"),
        Record(b"d", None, [("h", b"1")]),
        Record(b"e"),
    ]
    assert batch.size == sum(r.size for r in batch.records) and batch.largest == max(r.size for r in batch.records)

    only = make(max_in_flight=1000)
    only.add_many("t", 0, RecordColumns([b"a", b"b"], [b"k", None]), 0.0, None, object())
    only.add_many("t", 0, RecordColumns([b"c"]), 0.0, None, object())
    only.flush()
    [joined] = only.batches_to_send(0.0)
    assert type(joined.records) is RecordColumns and list(joined.records) == [
        Record(b"a", b"k"),
        Record(b"b"),
        Record(b"c"),
    ]


def test_strict_application_sequences_resume_after_an_outage_past_the_delivery_timeout() -> None:
    """Batches of the application's sequences expire unacknowledged (POSSIBLY_PERSISTED); the
    broker stored the first of them (H(P) = 19) and not the second. The next batch is refused
    OUT_OF_ORDER_SEQUENCE for 20: it fails alone, NOT_PERSISTED, and the producer goes on. The
    application's resend of 10..39 is cut at the expired batches' ends, so the stored part is
    a DUPLICATE and the rest continues after H(P)."""
    seq = make(max_batch_records=10)
    for s in range(10):
        seq.add("t", 0, rec(s), 0.0, s)
    [a] = seq.batches_to_send(0.0)
    answer(seq, a, ProduceResult(Outcome.ACCEPTED, base_offset=0))
    assert [type(e).__name__ for e in drain(seq)] == ["BatchDelivered"]
    for s in range(10, 30):
        seq.add("t", 0, rec(s), 1.0, s)
    assert [b.base_sequence for b in seq.batches_to_send(1.0)] == [10, 20]
    seq.handle_timeout(101.0)  # the broker stayed away: both expire unanswered
    expired = drain(seq)
    assert [(e.batch.base_sequence, type(e).__name__, getattr(e, "status", None)) for e in expired] == [
        (10, "BatchFailed", DeliveryStatus.POSSIBLY_PERSISTED),
        (20, "BatchFailed", DeliveryStatus.POSSIBLY_PERSISTED),
    ]
    for s in range(30, 40):
        seq.add("t", 0, rec(s), 102.0, s)
    [d] = seq.batches_to_send(102.0)
    answer(seq, d, ProduceResult(Outcome.OUT_OF_ORDER_SEQUENCE, expected_sequence=20), now=102.0)
    [refused] = drain(seq)
    assert isinstance(refused, BatchFailed) and refused.status is DeliveryStatus.NOT_PERSISTED
    assert isinstance(refused.error, SequenceDesyncError) and refused.error.expected_sequence == 20
    assert seq.failure is None  # the producer goes on
    _resend(seq, range(10, 40), 103.0)


def _resend(seq: ProducerSequencer, sequences: range, now: float) -> None:
    """Send ``sequences`` again in one call; answer as a strict broker holding up to 19 does."""
    seq.add_many("t", 0, [rec(s) for s in sequences], now, sequences.start, "app")
    sent = seq.batches_to_send(now)
    assert [(b.base_sequence, len(b.records)) for b in sent] == [(10, 10), (20, 10), (30, 10)]
    answer(seq, sent[0], ProduceResult(Outcome.DUPLICATE, base_offset=10), now=now)
    answer(seq, sent[1], ProduceResult(Outcome.ACCEPTED, base_offset=20), now=now)
    answer(seq, sent[2], ProduceResult(Outcome.ACCEPTED, base_offset=30), now=now)
    events = drain(seq)
    assert [(type(e).__name__, e.batch.base_sequence) for e in events] == [
        ("BatchDelivered", 10),
        ("BatchDelivered", 20),
        ("BatchDelivered", 30),
    ]
    assert [e.duplicate for e in events if isinstance(e, BatchDelivered)] == [True, False, False]
    assert seq.last_acknowledged("t", 0) == 39 and seq.failure is None
    assert seq._partitions[TP].abandoned == []


def test_strict_application_sequences_after_an_expiry_still_fail_the_producer_on_a_jump() -> None:
    """The broker asking for a sequence no expired batch held is a real desync (a jump of the
    application's, or data the producer never had): the producer fails as before."""
    seq = make(max_batch_records=10)
    for s in range(10, 20):
        seq.add("t", 0, rec(s), 0.0, s)
    seq.batches_to_send(0.0)
    seq.handle_timeout(100.0)
    drain(seq)
    seq.add("t", 0, rec(50), 101.0, 50)
    [jump] = seq.batches_to_send(101.0)
    answer(seq, jump, ProduceResult(Outcome.OUT_OF_ORDER_SEQUENCE, expected_sequence=0), now=101.0)
    assert isinstance(seq.failure, SequenceDesyncError)


def test_strict_checker_outage_past_the_delivery_timeout_then_the_resend_stores_each_record_once() -> None:
    """The same path against a real strict checker: the broker stores 10..19 but its answer
    is lost, 20..29 never arrives, both expire. The next batch is refused alone; the
    application sends every record not PERSISTED again with its sequence, and the log holds
    0..39 once each, in order, with each record's last outcome PERSISTED."""
    part = PolicyPartition(Policy.STRICT)
    seq = make(max_batch_records=10)
    ended: dict[int, object] = {}

    def settle() -> None:
        for event in drain(seq):
            for i, record in enumerate(event.batch.records):
                s = event.batch.base_sequence + i
                ended[s] = "persisted" if isinstance(event, BatchDelivered) else event.status  # type: ignore[union-attr]
                assert record.value == f"v{s}".encode()

    seq.add_many("t", 0, [rec(s) for s in range(10)], 0.0, 0, "app")
    [a] = seq.batches_to_send(0.0)
    answer(seq, a, part.produce(a))
    seq.add_many("t", 0, [rec(s) for s in range(10, 30)], 1.0, 10, "app")
    b, _ = seq.batches_to_send(1.0)
    part.produce(b)  # stored; the answer is lost, and the next batch never arrives
    seq.handle_timeout(101.0)
    seq.add_many("t", 0, [rec(s) for s in range(30, 40)], 102.0, 30, "app")
    [d] = seq.batches_to_send(102.0)
    answer(seq, d, part.produce(d), now=102.0)
    settle()
    assert seq.failure is None
    assert {s: ended[s] for s in (10, 20, 30)} == {
        10: DeliveryStatus.POSSIBLY_PERSISTED,
        20: DeliveryStatus.POSSIBLY_PERSISTED,
        30: DeliveryStatus.NOT_PERSISTED,
    }
    again = [s for s in range(40) if ended[s] != "persisted"]
    assert again == list(range(10, 40))
    seq.add_many("t", 0, [rec(s) for s in again], 103.0, again[0], "app")
    for batch in seq.batches_to_send(103.0):
        answer(seq, batch, part.produce(batch), now=103.0)
    settle()
    assert all(ended[s] == "persisted" for s in range(40)) and seq.failure is None
    assert [s for s, _ in part.log] == list(range(40))
