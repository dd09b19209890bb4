"""The shared backend conformance suite on the embedded backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from idempotent.testing.conformance import BackendConformance

from ..conftest import LocalHarness, memory_harness, sqlite_harness


class TestMemoryConformance(BackendConformance):
    @pytest.fixture
    def harness(self) -> LocalHarness:
        return memory_harness()


class TestSQLiteConformance(BackendConformance):
    several_writers = False

    @pytest.fixture
    def harness(self, tmp_path: Path) -> LocalHarness:
        return sqlite_harness(tmp_path)
