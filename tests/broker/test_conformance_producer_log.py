"""The ProducerLog conformance suite on the in-memory log: the producer-scoped logic of
:class:`~idempotent.broker.direct.DirectBroker`, CPU only."""

from __future__ import annotations

import pytest

from idempotent.testing.conformance_producer_log import (
    GroupWriteConformance,
    MemoryProducerLogHarness,
    ProducerLogFaultConformance,
)


class TestMemoryProducerLog(ProducerLogFaultConformance, GroupWriteConformance):
    @pytest.fixture
    def harness(self) -> MemoryProducerLogHarness:
        return MemoryProducerLogHarness()
