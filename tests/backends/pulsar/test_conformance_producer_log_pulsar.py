"""The ProducerLog conformance suite on a real Pulsar: the adapter's pipelined writer keeps
the contract (Pulsar's faults are injected by test_pulsar_faults.py, not through this
suite's fault switches; its pipelined writer is written through submit, not write)."""

from __future__ import annotations

import urllib.parse
from typing import Any

import pytest

from idempotent.testing.conformance_producer_log import ProducerLogConformance, UrlProducerLogHarness

pytestmark = pytest.mark.pulsar


class TestPulsarProducerLog(ProducerLogConformance):
    @pytest.fixture
    def harness(self, pulsar_service: Any) -> UrlProducerLogHarness:
        query = urllib.parse.urlencode({"admin_url": pulsar_service.admin_url})
        return UrlProducerLogHarness(f"{pulsar_service.url}?{query}", open_waits_for_older=True, dense_offsets=False)
