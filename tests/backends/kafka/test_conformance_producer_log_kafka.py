"""The ProducerLog conformance suite on a real Kafka: the adapter's transactional writer keeps
the contract, groups written at once included (Kafka's faults are injected by
test_kafka_outage.py and the cluster fault tests, not through this suite's fault switches)."""

from __future__ import annotations

from typing import Any

import pytest

from idempotent.testing.conformance_producer_log import (
    GroupWriteConformance,
    ProducerLogConformance,
    UrlProducerLogHarness,
)

pytestmark = pytest.mark.kafka


class TestKafkaProducerLog(ProducerLogConformance, GroupWriteConformance):
    @pytest.fixture
    def harness(self, kafka_service: Any) -> UrlProducerLogHarness:
        return UrlProducerLogHarness(kafka_service.url)
