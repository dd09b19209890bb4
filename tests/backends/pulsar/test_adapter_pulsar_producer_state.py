"""A named producer's state topic on Pulsar (adapters/pulsar/producer_state.py): its name and
the encoding of its messages. Opening and reading it against a real Pulsar is in
tests/backends/pulsar/test_adapter_pulsar_direct.py."""

from __future__ import annotations

import types

import pytest

from idempotent.core.checker import PartitionChecker
from idempotent.errors import CorruptDataError


def test_states_round_trip_through_one_message() -> None:
    from idempotent.adapters.pulsar.producer_state import pack_states, unpack_states

    later = PartitionChecker.restore(None)
    later.position = 1 << 40
    states = {("orders", 0): PartitionChecker.restore(None).snapshot(1.0), ("a/b", 3): later.snapshot(2.0)}
    assert unpack_states(pack_states(states)) == states
    assert unpack_states(pack_states({})) == {}


def test_an_unreadable_state_is_corrupt_data() -> None:
    from idempotent.adapters.pulsar.producer_state import unpack_states

    with pytest.raises(CorruptDataError, match="unreadable producer state"):
        unpack_states(b"\xc1not msgpack")


def test_the_state_topic_is_in_the_metadata_namespace_and_spells_any_name() -> None:
    from idempotent.adapters.pulsar.producer_state import STATE_PREFIX, state_topic

    backend = types.SimpleNamespace(meta_topic="persistent://acme/meta/__idempotent_meta")
    assert state_topic(backend, "orders-feed") == f"persistent://acme/meta/{STATE_PREFIX}orders-feed"  # type: ignore[arg-type]
    spelled = state_topic(backend, "a/b c")  # type: ignore[arg-type]
    assert spelled == f"persistent://acme/meta/{STATE_PREFIX}x-" + b"a/b c".hex()
