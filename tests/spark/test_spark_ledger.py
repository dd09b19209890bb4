"""A batch job's ledger anchor, found again by every run (no Spark session needed)."""

from __future__ import annotations

import uuid

import idempotent
from idempotent.broker.broker import BrokerConfig
from idempotent.core.checker import CheckerConfig
from idempotent.spark._ledger import LEDGER_RUNS, _anchor, ledger_topic
from idempotent.spark._rerun import Mode


def test_the_anchor_is_found_again_even_after_the_broker_evicted_its_producer() -> None:
    config = BrokerConfig(checker=CheckerConfig(max_producers=2))
    topic = "out"
    with idempotent.connect(f"memory://anchor-{uuid.uuid4().hex}", config) as broker:
        broker.create_topic(ledger_topic(topic), 2)
        first = _anchor(broker, topic, "daily", Mode.SPLIT)
        assert _anchor(broker, topic, "daily", Mode.POSITION) == first  # a DUPLICATE with its offset
        for name in ("a", "b", "c"):  # more producers on the runs partition than it tracks
            with idempotent.Producer(broker, producer_name=name) as other:
                other.send(ledger_topic(topic), b"noise", partition=LEDGER_RUNS).result()
        assert _anchor(broker, topic, "daily", Mode.POSITION) == first  # found by a scan
        offset, mode = _anchor(broker, topic, "other-job", Mode.PARTITION)  # another job: its own anchor
        assert offset > first[0] and mode is Mode.PARTITION
        assert _anchor(broker, topic, "other-job", Mode.SPLIT) == (offset, Mode.PARTITION)
