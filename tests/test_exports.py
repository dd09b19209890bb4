"""The public API is exactly idempotent.__all__."""

from __future__ import annotations

import types

import idempotent


def test_public_names() -> None:
    public = {name for name in dir(idempotent) if not name.startswith("_")}
    modules = {name for name in public if isinstance(getattr(idempotent, name), types.ModuleType)}
    assert set(idempotent.__all__) - {"__version__"} == public - modules
    for name in idempotent.__all__:
        assert getattr(idempotent, name) is not None


def test_contract_names() -> None:
    for name in ("connect", "Producer", "AsyncProducer", "Outcome", "Broker", "ProduceResult", "RecordMetadata"):
        assert name in idempotent.__all__
    assert [o.name for o in idempotent.Outcome] == [
        "ACCEPTED",
        "DUPLICATE",
        "OUT_OF_ORDER_SEQUENCE",
        "IN_FLIGHT",
        "FENCED",
        "UNKNOWN_PRODUCER",
    ]
