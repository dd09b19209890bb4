"""Becoming the backend's writer (idempotent/broker/claim.py): when the backend says this
broker just became it, everything cached is replaced by what is stored; once claimed, nothing
is asked again. Two processes over one SQLite file: the conformance suite."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from idempotent.broker.claim import WriterClaim
from idempotent.errors import ConfigError


class _Backend:
    def __init__(self, becomes: bool) -> None:
        self.becomes = becomes
        self.claims = 0
        self.refuse: Exception | None = None

    def claim_writer(self) -> bool:
        self.claims += 1
        if self.refuse is not None:
            raise self.refuse
        return self.becomes

    def load_producers(self) -> list[str]:
        return ["stored record"]

    def load_settings(self) -> dict[str, str]:
        return {"dedup:broker": "off"}

    def list_topics(self) -> dict[str, int]:
        return {"orders": 3}


class _Spy:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def replace(self, value: Any) -> None:
        self.calls.append(("replace", value))

    def forget_all(self) -> None:
        self.calls.append(("forget_all", None))


def _claim(backend: _Backend) -> tuple[WriterClaim, _Spy, _Spy, _Spy, _Spy]:
    producers, topics, settings, partitions = _Spy(), _Spy(), _Spy(), _Spy()
    claim = WriterClaim(backend, threading.RLock(), producers, topics, settings, partitions)  # type: ignore[arg-type]
    return claim, producers, topics, settings, partitions


def test_becoming_the_writer_replaces_what_was_cached() -> None:
    backend = _Backend(becomes=True)
    claim, producers, topics, settings, partitions = _claim(backend)
    assert not claim.claimed
    claim.claim()
    assert claim.claimed
    assert producers.calls == [("replace", ["stored record"])]
    assert topics.calls == [("replace", {"orders": 3})]
    assert settings.calls == [("replace", {"dedup:broker": "off"})]
    assert partitions.calls == [("forget_all", None)]
    claim.claim()  # claimed: the backend is not asked again
    assert backend.claims == 1


def test_already_the_writer_keeps_the_cache() -> None:
    backend = _Backend(becomes=False)
    claim, producers, topics, settings, partitions = _claim(backend)
    claim.claim()
    assert claim.claimed
    assert producers.calls == topics.calls == settings.calls == partitions.calls == []


def test_a_refused_claim_leaves_it_unclaimed() -> None:
    backend = _Backend(becomes=True)
    backend.refuse = ConfigError("another process writes the file (test)")
    claim, producers, *_ = _claim(backend)
    with pytest.raises(ConfigError, match="another process"):
        claim.claim()
    assert not claim.claimed and producers.calls == []
    backend.refuse = None
    claim.claim()
    assert claim.claimed and backend.claims == 2
