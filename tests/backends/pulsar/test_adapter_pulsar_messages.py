"""Records as Pulsar messages and back (adapters/pulsar/messages.py): the properties an
application set, from what a stored message carries."""

from __future__ import annotations

from idempotent.adapters.pulsar.messages import application_properties, encode_record, headers_of
from idempotent.core.records import Record


def _stored(record: Record, head: bool) -> dict[str, str]:
    """The properties of ``record`` as the Pulsar backend stores it (a batch's head carries
    the identity)."""
    identity = {"idem.pid": "7", "idem.epoch": "0", "idem.seq": "41", "idem.count": "3"} if head else {}
    return encode_record(record, identity, 0).properties


def test_the_identity_is_left_out_and_the_rest_is_the_applications() -> None:
    record = Record(b"v", headers={"color": "blue", "size": "9"})
    for head in (True, False):
        assert application_properties(_stored(record, head)) == {"color": "blue", "size": "9"}
    assert application_properties(_stored(Record(b"v"), True)) == {}


def test_idem_named_and_binary_headers_come_back_from_the_exact_list() -> None:
    record = Record(b"v", headers=[("idem.note", b"kept"), ("b", b"2"), ("a", b"1")])
    stored = _stored(record, True)
    assert "idem.headers" in stored
    assert application_properties(stored) == {"idem.note": "kept", "b": "2", "a": "1"}
    assert headers_of(stored) == (("idem.note", b"kept"), ("b", b"2"), ("a", b"1"))
    binary = _stored(Record(b"v", headers={"raw": b"\xff"}), False)
    assert application_properties(binary) == {"raw": "\ufffd"}


def test_properties_without_idem_names_are_returned_as_they_are() -> None:
    plain = {"x": "1"}
    assert application_properties(plain) is plain
