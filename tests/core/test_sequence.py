"""Sequence arithmetic (idempotent/core/sequence.py): where the int32 ring and the 64-bit line part."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from idempotent.core.sequence import at_or_before, order_depends_on_policy
from idempotent.core.types import MAX_SEQUENCE, NO_SEQUENCE


@pytest.mark.parametrize(
    ("sequence", "reference", "depends"),
    [
        (0, 2**30 - 1, False),  # less than half a ring apart: the same order both ways
        (0, 2**30, True),  # a jump of 2**30 on the line, a step back (a wrap) on the ring
        (0, 2**30 + 1, True),
        (0, MAX_SEQUENCE, True),
        (MAX_SEQUENCE, 0, True),  # 0 follows 2**31-1 on the ring, lies far below it on the line
        (MAX_SEQUENCE - 5, 3, True),
        (2**30 + 1, 0, True),  # ahead on the line, behind 0 (before a wrap) on the ring
        (2**30 - 1, 0, False),  # ahead either way
        (5, 7, False),
        (7, 7, False),
        (0, 2**31, False),  # 2**31 is on the line only: compared as plain integers
        (2**32, 5, False),
        (2**62, 2**63 - 1, False),
        (NO_SEQUENCE, 2**30, False),
        (2**30, NO_SEQUENCE, False),
    ],
)
def test_order_depends_on_the_policy_only_for_ring_values_half_a_ring_apart(
    sequence: int, reference: int, depends: bool
) -> None:
    assert order_depends_on_policy(sequence, reference) is depends


@given(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1))
def test_where_the_order_does_not_depend_on_the_policy_the_ring_agrees_with_plain_integers(a: int, b: int) -> None:
    if not order_depends_on_policy(a, b):
        assert at_or_before(a, b) is (a <= b)
    else:
        assert a <= MAX_SEQUENCE and b <= MAX_SEQUENCE and abs(a - b) >= 2**30
