"""The ProducerLog conformance suite on a real Kafka: the adapter's transactional writer keeps
the contract (the fault tests skip: Kafka's faults are injected in test_kafka_outage.py)."""

from __future__ import annotations

from typing import Any

import pytest

from idempotent.testing.conformance_producer_log import ProducerLogConformance, UrlProducerLogHarness

pytestmark = pytest.mark.kafka


class TestKafkaProducerLog(ProducerLogConformance):
    @pytest.fixture
    def harness(self, kafka_service: Any) -> UrlProducerLogHarness:
        return UrlProducerLogHarness(kafka_service.url)
