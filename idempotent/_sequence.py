"""Sequence arithmetic on the int32 ring ``0 .. MAX_SEQUENCE`` (wrapping to 0, like Kafka).

All comparisons between sequences are made on the ring: ``a`` is *before* ``b`` when walking
forward from ``a`` reaches ``b`` in fewer than half the ring's steps. Producers never have half
a ring (about a billion records) pipelined, so the comparison is unambiguous in practice.
"""

from __future__ import annotations

from ._types import MAX_SEQUENCE, NO_SEQUENCE, SEQUENCE_SPACE, Sequence

_HALF = SEQUENCE_SPACE // 2


def next_sequence(sequence: int, count: int = 1) -> Sequence:
    """Return the sequence ``count`` steps after ``sequence`` (``NO_SEQUENCE`` counts as -1).

    >>> next_sequence(NO_SEQUENCE)
    0
    >>> next_sequence(MAX_SEQUENCE)
    0
    """
    if sequence == NO_SEQUENCE:
        return Sequence((count - 1) % SEQUENCE_SPACE)
    return Sequence((sequence + count) % SEQUENCE_SPACE)


def last_sequence_of(base_sequence: int, record_count: int) -> Sequence:
    """Return the sequence of the last record of a batch starting at ``base_sequence``."""
    return Sequence((base_sequence + record_count - 1) % SEQUENCE_SPACE)


def distance(start: int, end: int) -> int:
    """Return how many forward steps lead from ``start`` to ``end`` on the ring (0 .. 2**31-1).

    ``NO_SEQUENCE`` is treated as the position just before 0.
    """
    if start == NO_SEQUENCE:
        return end + 1 if end != NO_SEQUENCE else 0
    if end == NO_SEQUENCE:
        return (MAX_SEQUENCE - start + 1) % SEQUENCE_SPACE
    return (end - start) % SEQUENCE_SPACE


def at_or_before(sequence: int, reference: int) -> bool:
    """True when ``sequence`` is ``reference`` or within half a ring behind it."""
    if reference == NO_SEQUENCE:
        return False
    return distance(sequence, reference) < _HALF


def in_sequence(last: int, following: int) -> bool:
    """True when ``following`` is exactly the sequence after ``last``."""
    return following == next_sequence(last)


def is_valid_sequence(sequence: int) -> bool:
    """True for a sequence a batch may carry (``0 .. MAX_SEQUENCE``)."""
    return 0 <= sequence <= MAX_SEQUENCE
