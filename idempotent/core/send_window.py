"""One partition's send window on the client side, and the pure rules that shape it.

:class:`SendWindow` holds what :class:`~idempotent.core.sequencer.ProducerSequencer` keeps per
topic-partition: the next sequence it numbers, the open batch, the sealed batches queued
without a sequence, and the batches in flight in sequence order. The functions below decide
one thing each, with no clock and no I/O:

- :func:`seal` closes the open batch and queues it.
- :func:`continues` says whether a record with an application-chosen sequence may join the
  open batch.
- :func:`cut_at_frontier` cuts a batch of application sequences where it crosses the
  acknowledged sequence or the end of a batch in flight.
- :func:`undecided` says whether only the broker's policy can place such a batch.
- :func:`link` names a batch's predecessor when it is first sent.
- :func:`abandon`, :func:`abandoned_at` and :func:`settle_abandoned` keep the batches of
  application sequences that failed alone unacknowledged, and say whether the broker's
  expected sequence lies in one.

The sequencer's module docstring explains why each rule exists.
"""

from __future__ import annotations

from collections import deque

import attrs

from idempotent.core.batches import OutgoingBatch, Spans
from idempotent.core.records import record_sizes
from idempotent.core.sequence import at_or_before, distance, last_sequence_of, next_sequence, order_depends_on_policy
from idempotent.core.transitions import BatchTrigger, transition
from idempotent.core.types import NO_SEQUENCE

_SEAL = BatchTrigger.SEAL


@attrs.define(eq=False)
class SendWindow:
    """The sequencer's state for one topic-partition."""

    next_sequence: int
    #: the last sequence of the latest batch sent (None: unknown); the next batch's predecessor
    sent: int | None = NO_SEQUENCE
    open: OutgoingBatch | None = None
    queued: deque[OutgoingBatch] = attrs.field(factory=deque)
    inflight: list[OutgoingBatch] = attrs.field(factory=list)
    #: the base sequence of a batch the broker refused for good while later batches were in
    #: flight: an OUT_OF_ORDER_SEQUENCE asking for it renumbers those from there
    given_back: int | None = None
    #: the base sequences of batches sent here that expired unacknowledged (past the delivery
    #: timeout) and are not known to be stored: an OUT_OF_ORDER_SEQUENCE asking for one of them
    #: shows a hole that only a new epoch can fill (a late copy of an expired attempt could
    #: land in it), so it fails the producer with SequenceDesyncError
    expired: set[int] = attrs.field(factory=set)
    #: a batch of application sequences whose place the ring and the 64-bit line read
    #: differently (``order_depends_on_policy`` against the next or the acknowledged
    #: sequence): it is in flight alone, and its answer tells where the partition goes on
    undecided: OutgoingBatch | None = None
    #: ``(first, last)`` of batches of application sequences sent here that failed alone
    #: unacknowledged (expired past the delivery timeout, or refused behind such a gap),
    #: oldest first: the broker stores whole batches, so its H(P) is at the end of one of them
    #: or before them all. An OUT_OF_ORDER_SEQUENCE asking for a sequence in one (the broker
    #: tells its H(P): the expected sequence less one) fails only the batch it answers, and
    #: a resend is cut at their ends (:func:`cut_at_frontier`), so no part of it straddles H(P)
    abandoned: list[tuple[int, int]] = attrs.field(factory=list)


def seal(window: SendWindow) -> None:
    """Seal the open batch, if any, and queue it behind the sealed ones.

    Raises:
        IllegalStateTransition: the open batch is not OPEN (a bug); nothing is moved.
    """
    if window.open is not None:
        window.open.state = transition(window.open.state, _SEAL)
        window.queued.append(window.open)
        window.open = None


def continues(batch: OutgoingBatch, sequence: int) -> bool:
    """Whether a record with explicit ``sequence`` may join the open ``batch``: the batch is
    explicit and the sequence is its next one."""
    return batch.explicit and sequence == next_sequence(batch.base_sequence, len(batch.records))


def cut_at_frontier(window: SendWindow, batch: OutgoingBatch, acked: int, tail_id: int) -> OutgoingBatch | None:
    """Cut a batch of application sequences where it crosses ``acked`` (the partition's
    acknowledged sequence), the end of a batch in flight, or the end of an abandoned batch
    (:attr:`SendWindow.abandoned`: H(P) may be there): the broker refuses a batch that is
    half stored (or in flight) and half new.

    Returns:
        The sealed tail, numbered ``tail_id``, that the caller queues next; ``batch`` keeps the
        head. None when the batch crosses nothing (``batch`` is unchanged).
    """
    last = last_sequence_of(batch.base_sequence, len(batch.records))
    cuts = [acked] + [last_sequence_of(b.base_sequence, len(b.records)) for b in window.inflight]
    cuts += [end for _, end in window.abandoned]
    inside = [c for c in cuts if at_or_before(batch.base_sequence, c) and not at_or_before(last, c)]
    if not inside:
        return None
    cut = min(inside, key=lambda c: distance(batch.base_sequence, c))
    keep = distance(batch.base_sequence, cut) + 1
    tail = OutgoingBatch(
        tail_id,
        batch.topic,
        batch.partition,
        batch.records[keep:],
        Spans(),
        batch.created_at,
        base_sequence=next_sequence(cut),
        explicit=True,
    )
    tail.state = transition(tail.state, _SEAL)  # split off a sealed batch
    tail.spans = batch.spans.split(keep)
    tail_sizes = record_sizes(tail.records)
    tail.size, tail.largest = sum(tail_sizes), max(tail_sizes)
    batch.records = batch.records[:keep]
    batch.size -= tail.size
    batch.largest = max(record_sizes(batch.records))
    return tail


def undecided(window: SendWindow, batch: OutgoingBatch, acked: int) -> bool:
    """Whether only the broker's policy can place a batch of application sequences: the ring
    and the 64-bit line disagree on whether it lies at or beyond the window's next sequence,
    or beyond ``acked`` (a jump of 2**30 or more, or a wrap)."""
    last = last_sequence_of(batch.base_sequence, len(batch.records))
    return order_depends_on_policy(window.next_sequence, last) or order_depends_on_policy(last, acked)


def link(window: SendWindow, batch: OutgoingBatch) -> None:
    """Name the batch's predecessor: the last sequence of the batch sent before it (numbered
    batches follow it; the application's sequences are compared as plain integers, as the
    ``monotonic`` policy does). A resend of sequences at or below it names none."""
    last = last_sequence_of(batch.base_sequence, len(batch.records))
    if batch.explicit and window.sent is not None and last <= window.sent:
        batch.previous_sequence = None
    else:
        batch.previous_sequence, window.sent = window.sent, last


def abandoned_at(window: SendWindow, expected: int) -> bool:
    """Whether ``expected`` (the broker's next sequence, from an OUT_OF_ORDER_SEQUENCE) lies in
    a batch of application sequences that failed here unacknowledged: the broker wants
    records whose status the producer gave already, which only the application can send
    again (with the same sequences)."""
    return any(at_or_before(first, expected) and at_or_before(expected, last) for first, last in window.abandoned)


def abandon(window: SendWindow, batch: OutgoingBatch) -> None:
    """Remember a batch of application sequences that fails alone unacknowledged."""
    window.abandoned.append((batch.base_sequence, last_sequence_of(batch.base_sequence, len(batch.records))))


def settle_abandoned(window: SendWindow, acked: int) -> None:
    """Forget the abandoned batches at or before ``acked``, the sequence just acknowledged:
    H(P) is past them."""
    window.abandoned = [(first, last) for first, last in window.abandoned if not at_or_before(last, acked)]
