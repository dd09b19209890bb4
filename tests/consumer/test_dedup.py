"""DuplicateFilter: sequence windows, producer LRU, key FIFO, and their eviction edges."""

from __future__ import annotations

import random

import pytest

from idempotent import DuplicateFilter, DuplicateVerdict
from idempotent.errors import ConfigError

NEW, DUP, OLD = DuplicateVerdict.NEW, DuplicateVerdict.DUPLICATE, DuplicateVerdict.TOO_OLD


def test_in_order_sequences_and_resends() -> None:
    f = DuplicateFilter()
    assert [f.check_sequence("dev", s) for s in (0, 1, 2, 2, 1, 3, 0)] == [NEW, NEW, NEW, DUP, DUP, NEW, DUP]
    assert f.highest_sequence("dev") == 3 and f.highest_sequence("other") is None


def test_gaps_and_reordering_inside_the_window() -> None:
    f = DuplicateFilter(window=8)
    assert f.check_sequence("p", 10) is NEW
    assert f.check_sequence("p", 14) is NEW  # a gap
    assert [f.check_sequence("p", s) for s in (12, 11, 12, 13, 14, 10)] == [NEW, NEW, DUP, NEW, DUP, DUP]
    assert f.check_sequence("p", 7) is NEW  # 14 - 7 = 7 < window: still tracked, never seen
    assert f.check_sequence("p", 6) is OLD  # 14 - 6 = 8: outside the window
    assert f.check_sequence("p", 7) is DUP


def test_window_edges_on_a_jump() -> None:
    f = DuplicateFilter(window=4)
    f.check_sequence("p", 0)
    f.check_sequence("p", 3)  # shift 3 < window: 0 stays tracked
    assert f.check_sequence("p", 0) is DUP
    f.check_sequence("p", 4)  # shift 1: 0 leaves the window (4 - 0 = 4)
    assert f.check_sequence("p", 0) is OLD
    assert f.check_sequence("p", 3) is DUP
    f.check_sequence("p", 100)  # a jump beyond the window forgets everything below
    assert [f.check_sequence("p", s) for s in (97, 96, 99, 100)] == [NEW, OLD, NEW, DUP]


def test_window_of_one_is_a_high_water_mark() -> None:
    f = DuplicateFilter(window=1)
    assert [f.check_sequence("p", s) for s in (5, 5, 4, 6, 9, 8)] == [NEW, DUP, OLD, NEW, NEW, OLD]


def test_producers_are_independent() -> None:
    f = DuplicateFilter()
    assert f.check_sequence(("pid-1", "t", 0), 0) is NEW
    assert f.check_sequence(("pid-1", "t", 1), 0) is NEW
    assert f.check_sequence(("pid-2", "t", 0), 0) is NEW
    assert f.check_sequence(("pid-1", "t", 0), 0) is DUP


def test_producer_lru_eviction() -> None:
    f = DuplicateFilter(max_producers=2)
    f.check_sequence("a", 5)
    f.check_sequence("b", 5)
    f.check_sequence("a", 6)  # a is now the most recently seen
    f.check_sequence("c", 1)  # evicts b, the least recently seen
    assert f.producer_count == 2 and f.evicted_producers == 1
    assert f.highest_sequence("b") is None
    assert f.check_sequence("a", 6) is DUP  # a survived
    assert f.check_sequence("b", 5) is NEW  # b was forgotten: its repeat passes once (documented)
    assert f.highest_sequence("c") is None  # ... and evicted c (a was touched by the check above)
    assert f.check_sequence("b", 5) is DUP


def test_a_duplicate_check_refreshes_a_producer() -> None:
    f = DuplicateFilter(max_producers=2)
    f.check_sequence("a", 1)
    f.check_sequence("b", 1)
    assert f.check_sequence("a", 1) is DUP  # touch a
    f.check_sequence("c", 1)
    assert f.highest_sequence("a") == 1 and f.highest_sequence("b") is None


def test_record_false_changes_nothing() -> None:
    f = DuplicateFilter(max_producers=1, max_keys=1)
    assert f.check_sequence("a", 1, record=False) is NEW
    assert f.producer_count == 0
    f.check_sequence("a", 1)
    assert f.check_sequence("b", 1, record=False) is NEW  # does not evict a
    assert f.check_sequence("a", 2, record=False) is NEW and f.highest_sequence("a") == 1
    assert f.check_sequence("a", 1, record=False) is DUP
    assert f.check_key("k", record=False) is NEW and f.key_count == 0


def test_keys_fifo_eviction() -> None:
    f = DuplicateFilter(max_keys=3)
    assert [f.check_key(k) for k in ("a", "b", "c", "a")] == [NEW, NEW, NEW, DUP]
    assert f.check_key("d") is NEW  # evicts a: first seen, even though it was seen again since
    assert f.key_count == 3 and f.evicted_keys == 1
    assert f.check_key("b") is DUP
    assert f.check_key("a") is NEW  # forgotten: passes once; evicts b
    assert f.check_key("b") is NEW
    assert f.check_key(("tuple", 1)) is NEW and f.check_key(("tuple", 1)) is DUP


def test_matches_an_unbounded_model_when_nothing_is_evicted() -> None:
    rng = random.Random(7)
    f = DuplicateFilter(max_producers=10, window=64)
    seen: set[tuple[int, int]] = set()
    highest: dict[int, int] = {}
    for _ in range(5000):
        producer = rng.randrange(5)
        top = highest.get(producer, 0)
        sequence = max(0, top + rng.randrange(-70, 4))
        verdict = f.check_sequence(producer, sequence)
        if producer in highest and top - sequence >= 64:
            assert verdict is OLD
        else:
            assert verdict is (DUP if (producer, sequence) in seen else NEW)
            seen.add((producer, sequence))
            highest[producer] = max(top, sequence) if producer in highest else sequence


@pytest.mark.parametrize("option", ["max_producers", "window", "max_keys"])
@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_limits_are_validated(option: str, bad: object) -> None:
    with pytest.raises(ConfigError):
        DuplicateFilter(**{option: bad})


def test_sequence_must_be_int() -> None:
    with pytest.raises(ConfigError):
        DuplicateFilter().check_sequence("p", "1")  # type: ignore[arg-type]
