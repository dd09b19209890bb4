"""The values of the deterministic link (idempotent/testing/link_values.py)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from idempotent.core.types import TopicPartition
from idempotent.errors import ConfigError
from idempotent.testing.link_values import Fate, Faults, Message


@pytest.mark.parametrize(
    "kwargs",
    [{"drop": 1.5}, {"delay": -0.1}, {"drop": 0.6, "duplicate": 0.6}, {"max_delay": -1.0}],
)
def test_faults_are_validated(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        Faults(**kwargs)


def test_faults_choose_roughly_in_proportion() -> None:
    rng = random.Random(1)
    faults = Faults(drop=0.1, duplicate=0.2, delay=0.3, error=0.1)
    counts = Counter(faults.choose(rng) for _ in range(20_000))
    for fate, p in [(Fate.DROP, 0.1), (Fate.DUPLICATE, 0.2), (Fate.DELAY, 0.3), (Fate.ERROR, 0.1), (Fate.DELIVER, 0.3)]:
        assert abs(counts[fate] / 20_000 - p) < 0.02


def test_a_message_orders_by_the_time_it_was_sent_then_by_its_index() -> None:
    tp = TopicPartition("t", 0)
    early, late = Message(0, 5, tp, b"a", 0.1), Message(0, 1, tp, b"b", 0.2)
    same_time = Message(0, 6, tp, b"c", 0.1)
    assert sorted([late, same_time, early], key=lambda m: m.order) == [early, same_time, late]
