"""The per-partition send window's pure rules (``idempotent.core.send_window``)."""

from __future__ import annotations

import pytest

from idempotent.core.batches import OutgoingBatch, Spans
from idempotent.core.records import Record
from idempotent.core.send_window import SendWindow, continues, cut_at_frontier, link, seal, undecided
from idempotent.core.transitions import BatchState
from idempotent.core.types import NO_SEQUENCE
from idempotent.errors import IllegalStateTransition

OWNER = object()


def batch(batch_id: int, base_sequence: int, count: int, explicit: bool = True) -> OutgoingBatch:
    records = [Record(b"v%d" % i) for i in range(count)]
    spans = Spans()
    spans.add(OWNER, 0, count)
    out = OutgoingBatch(batch_id, "t", 0, records, spans, 0.0, base_sequence=base_sequence, explicit=explicit)
    out.size = sum(r.size for r in records)
    out.largest = max(r.size for r in records)
    return out


def test_seal_queues_the_open_batch_once() -> None:
    window = SendWindow(0)
    window.open = batch(1, 0, 2)
    seal(window)
    assert window.open is None
    assert [b.batch_id for b in window.queued] == [1]
    assert window.queued[0].state is BatchState.QUEUED
    seal(window)  # nothing open: nothing moves
    assert len(window.queued) == 1


def test_seal_refuses_a_batch_that_is_not_open() -> None:
    window = SendWindow(0)
    window.open = batch(1, 0, 2)
    window.open.state = BatchState.DONE
    with pytest.raises(IllegalStateTransition):
        seal(window)


def test_a_record_continues_only_an_explicit_batch_at_its_next_sequence() -> None:
    assert continues(batch(1, 10, 3), 13)
    assert not continues(batch(1, 10, 3), 14)
    assert not continues(batch(1, 10, 3), 12)
    assert not continues(batch(1, 10, 3, explicit=False), 13)


def test_a_batch_crossing_the_acknowledged_sequence_is_cut_there() -> None:
    window = SendWindow(20)
    head = batch(1, 10, 10)  # 10..19, of which 10..14 are acknowledged
    tail = cut_at_frontier(window, head, acked=14, tail_id=7)
    assert tail is not None
    assert (head.base_sequence, len(head.records)) == (10, 5)
    assert (tail.batch_id, tail.base_sequence, len(tail.records)) == (7, 15, 5)
    assert tail.explicit and tail.state is BatchState.QUEUED
    assert [r.value for r in tail.records] == [b"v5", b"v6", b"v7", b"v8", b"v9"]
    assert head.size + tail.size == sum(r.size for r in head.records + list(tail.records))
    assert list(tail.spans) == [(OWNER, 5, 5)]


def test_the_nearest_frontier_wins_among_batches_in_flight() -> None:
    window = SendWindow(40)
    window.inflight = [batch(2, 0, 13), batch(3, 13, 4)]  # in flight: 0..12 and 13..16
    head = batch(1, 11, 9)  # 11..19 crosses both ends: cut after 12 first
    tail = cut_at_frontier(window, head, acked=NO_SEQUENCE, tail_id=9)
    assert tail is not None
    assert (head.base_sequence, len(head.records)) == (11, 2)
    assert (tail.base_sequence, len(tail.records)) == (13, 7)


def test_a_batch_entirely_ahead_is_not_cut() -> None:
    window = SendWindow(5)
    head = batch(1, 5, 3)
    assert cut_at_frontier(window, head, acked=4, tail_id=2) is None
    assert len(head.records) == 3


def test_only_a_jump_the_ring_and_the_line_read_differently_is_undecided() -> None:
    window = SendWindow(100)
    assert not undecided(window, batch(1, 100, 5), acked=99)
    assert not undecided(window, batch(1, 50, 5), acked=99)  # a plain resend lies behind
    assert undecided(window, batch(1, 100 + 2**30, 5), acked=99)
    near_end = SendWindow(2**31 - 10)
    assert undecided(near_end, batch(1, 5, 3), acked=2**31 - 11)  # ahead on the ring, behind on the line


def test_link_names_the_previous_batch_and_a_resend_behind_it_names_none() -> None:
    window = SendWindow(0)
    first, second = batch(1, 0, 3, explicit=False), batch(2, 3, 2, explicit=False)
    link(window, first)
    link(window, second)
    assert (first.previous_sequence, second.previous_sequence, window.sent) == (NO_SEQUENCE, 2, 4)
    resend = batch(3, 1, 2)  # the application's own sequences, behind what was sent
    link(window, resend)
    assert resend.previous_sequence is None and window.sent == 4
