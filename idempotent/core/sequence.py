"""Sequence arithmetic for both policies: Kafka's int32 ring and 64-bit application sequences.

A sequence is an int in ``0 .. MAX_APPLICATION_SEQUENCE`` (2**63-1). Two spaces share it:

* **the int32 ring** ``0 .. MAX_SEQUENCE`` (2**31-1), the ``strict`` policy's space and the
  space of the sequences a producer numbers itself: after ``MAX_SEQUENCE`` comes 0, as in
  Kafka's record batch format, and a batch may cross that boundary (``2**31-1, 0, 1``);
* **the 64-bit line** above it, reached only by sequences an application chooses under the
  ``monotonic`` policy (like pulsar-client's ``sequence_id``). Nothing wraps there.

Which one applies is a property of the values, so that a log can be replayed without knowing
the policy it was written under: a batch whose first sequence is in the ring and whose records
run past ``MAX_SEQUENCE`` wraps to 0 (the ``monotonic`` policy refuses such a batch, so the
producer starts a new batch at ``2**31`` instead); every other batch counts upwards.

The comparisons here (:func:`at_or_before`, :func:`distance`) are the client's view: between two
ring values they read the shorter way round the ring (half a ring, about a billion, is the
horizon), between any other values they compare plain integers. The broker's checker makes its
own, policy-aware decisions (``_checker.py``) so that a jump is never read as a step back.

The ring and the 64-bit line order two values differently only when both are ring values at
least half a ring apart, or on either side of the ring's end (:func:`order_depends_on_policy`):
``strict`` reads them on the ring (a wrap), ``monotonic`` on the line (a jump). The producer
does not know the policy of a topic, so it never decides such a case from the values: it asks
the broker, by sending the batch alone and reading the answer (``_sequencer.py``).
"""

from __future__ import annotations

from idempotent.core.types import MAX_APPLICATION_SEQUENCE, MAX_SEQUENCE, NO_SEQUENCE, SEQUENCE_SPACE, Sequence

_HALF = SEQUENCE_SPACE // 2


def sequence_at(base_sequence: int, index: int) -> Sequence:
    """Return the sequence of record ``index`` of a batch starting at ``base_sequence``.

    >>> sequence_at(MAX_SEQUENCE, 1)
    0
    >>> sequence_at(2**31, 1)
    2147483649
    """
    value = base_sequence + index
    if base_sequence <= MAX_SEQUENCE < value:
        return Sequence(value % SEQUENCE_SPACE)
    return Sequence(value)


def crosses_ring_end(base_sequence: int, record_count: int) -> bool:
    """True when a batch starts in the int32 ring and runs past ``MAX_SEQUENCE`` (it wraps)."""
    return base_sequence <= MAX_SEQUENCE < base_sequence + record_count - 1


def next_sequence(sequence: int, count: int = 1) -> Sequence:
    """Return the sequence ``count`` steps after ``sequence`` (``NO_SEQUENCE`` counts as -1).

    >>> next_sequence(NO_SEQUENCE)
    0
    >>> next_sequence(MAX_SEQUENCE)
    0
    """
    if sequence == NO_SEQUENCE:
        return sequence_at(0, count - 1)
    return sequence_at(sequence, count)


def last_sequence_of(base_sequence: int, record_count: int) -> Sequence:
    """Return the sequence of the last record of a batch starting at ``base_sequence``."""
    return sequence_at(base_sequence, record_count - 1)


def in_ring(sequence: int) -> bool:
    """True for ``NO_SEQUENCE`` and the int32 ring ``0 .. MAX_SEQUENCE``."""
    return sequence <= MAX_SEQUENCE


def distance(start: int, end: int) -> int:
    """Return how many forward steps lead from ``start`` to ``end``.

    On the ring (both values in it) the count wraps (0 .. 2**31-1); elsewhere it is the plain
    difference. ``NO_SEQUENCE`` is treated as the position just before 0.
    """
    if in_ring(start) and in_ring(end):
        if start == NO_SEQUENCE:
            return end + 1 if end != NO_SEQUENCE else 0
        if end == NO_SEQUENCE:
            return (MAX_SEQUENCE - start + 1) % SEQUENCE_SPACE
        return (end - start) % SEQUENCE_SPACE
    return end - start


def at_or_before(sequence: int, reference: int) -> bool:
    """True when ``sequence`` is ``reference`` or behind it: within half a ring behind it when
    both are ring values, numerically at or below it otherwise."""
    if reference == NO_SEQUENCE:
        return False
    if in_ring(sequence) and in_ring(reference):
        return distance(sequence, reference) < _HALF
    return sequence <= reference


def order_depends_on_policy(sequence: int, reference: int) -> bool:
    """True when the int32 ring and the 64-bit line disagree on whether ``sequence`` is at or
    before ``reference``: both are ring values at least half a ring apart, or on either side of
    the ring's end. ``strict`` orders them on the ring, ``monotonic`` as plain integers, so only
    the policy of the topic can tell. False when either is ``NO_SEQUENCE``.

    >>> order_depends_on_policy(0, 1_500_000_000)  # a jump of 1.5e9, or a wrap 647e6 back
    True
    >>> order_depends_on_policy(2**31 - 1, 2**31)  # 2**31 is not a ring value
    False
    """
    if sequence == NO_SEQUENCE or reference == NO_SEQUENCE:
        return False
    return at_or_before(sequence, reference) != (sequence <= reference)


def advances(last: int, reference: int) -> bool:
    """True when a stored batch ending at ``last`` moves the highest sequence past ``reference``.

    Policy-free, so replay needs no policy: a higher value always advances (a step, or a jump
    the ``monotonic`` policy accepted); a lower one only when both are ring values and ``last``
    is less than half a ring ahead of ``reference`` on the ring (the wrap to 0).
    """
    if reference == NO_SEQUENCE or last > reference:
        return True
    return last != reference and in_ring(reference) and (last - reference) % SEQUENCE_SPACE < _HALF


def in_sequence(last: int, following: int) -> bool:
    """True when ``following`` is exactly the sequence after ``last``."""
    return following == next_sequence(last)


def is_valid_sequence(sequence: int) -> bool:
    """True for a sequence a batch may carry (``0 .. MAX_APPLICATION_SEQUENCE``)."""
    return 0 <= sequence <= MAX_APPLICATION_SEQUENCE
