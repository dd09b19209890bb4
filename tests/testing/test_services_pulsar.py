"""The Pulsar standalone of ``idempotent services`` keeps working after an entry of the
broker's largest size (its embedded bookie takes the framing around it)."""

from __future__ import annotations

from typing import Any

import pytest

from idempotent.testing.conformance import topic_name

pytestmark = pytest.mark.pulsar


def test_an_entry_of_max_message_size_is_stored_and_the_broker_keeps_working(pulsar_service: Any) -> None:
    import pulsar

    client = pulsar.Client(pulsar_service.bootstrap, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        big = client.create_producer(f"persistent://public/default/{topic_name('big')}", send_timeout_millis=20_000)
        big.send(b"x" * (5 * 1024 * 1024 - 64))  # maxMessageSize, with its metadata
        after = client.create_producer(f"persistent://public/default/{topic_name('after')}", send_timeout_millis=20_000)
        assert after.send(b"still writable").ledger_id() >= 0
    finally:
        client.close()
