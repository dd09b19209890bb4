"""Plain Pulsar topics as a mirror source (``pulsar+native://``): message ids as offsets."""

from __future__ import annotations

import pytest

from idempotent.errors import ConfigError
from idempotent.mirror.pulsar import full_topic, pack_message_id, unpack_offset


def test_message_ids_pack_into_ordered_offsets() -> None:
    ids = [(0, 0, -1), (0, 0, 1), (0, 1, 0), (5, 0, 0), (5, 2**18 - 1, 4095), (2**33 - 1, 0, 0)]
    packed = [pack_message_id(*i) for i in ids]
    assert packed == sorted(packed) and len(set(packed)) == len(packed)
    assert packed[-1] < 2**63
    assert unpack_offset(pack_message_id(12, 34, 5)) == (12, 34, 5)
    for bad in [(2**33, 0, 0), (0, 2**18, 0), (0, 0, 2**12), (-1, 0, 0)]:
        with pytest.raises(ConfigError, match="does not fit"):
            pack_message_id(*bad)


def test_short_topic_names_are_in_public_default() -> None:
    assert full_topic("orders") == "persistent://public/default/orders"
    assert full_topic("persistent://t/n/x") == "persistent://t/n/x"
