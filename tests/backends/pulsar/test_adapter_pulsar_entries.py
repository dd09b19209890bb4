"""One batch, one entry (adapters/pulsar/entries.py): what an entry's answers say, read the
same way by the group writes and the pipelined writes of a producer's own Pulsar writer."""

from __future__ import annotations

from typing import Any

from idempotent.errors import BackendUnavailableError, ProducerError


class _Id:
    """A message id as the client's answer carries it."""

    def __init__(self, ledger: int, entry: int, index: int) -> None:
        self._ledger, self._entry, self._index = ledger, entry, index

    def ledger_id(self) -> int:
        return self._ledger

    def entry_id(self) -> int:
        return self._entry

    def batch_index(self) -> int:
        return self._index


def _ok() -> Any:
    import pulsar

    return pulsar.Result.Ok


def test_an_entry_stored_whole_gives_its_base_offset() -> None:
    from idempotent.adapters.pulsar.entries import entry_offset
    from idempotent.adapters.pulsar.names import encode_offset

    offset, error = entry_offset((_ok(), _Id(7, 3, 0)), (_ok(), _Id(7, 3, 4)), 5, "append to t[0]")
    assert (offset, error) == (encode_offset(7, 3, 0), None)
    # one message: batch index -1 ("the whole entry") counts as 0, its answer is first and last
    assert entry_offset((_ok(), _Id(7, 4, -1)), (_ok(), _Id(7, 4, -1)), 1, "x") == (encode_offset(7, 4, 0), None)


def test_a_refused_message_is_pulsars_error_translated() -> None:
    import pulsar

    from idempotent.adapters.pulsar.entries import entry_offset

    offset, error = entry_offset((_ok(), _Id(7, 3, 0)), (pulsar.Result.Timeout, None), 2, "append to t[0]")
    assert offset is None
    assert isinstance(error, ProducerError) and "append to t[0]" in str(error)


def test_an_entry_stored_by_an_earlier_attempt_or_split_is_not_known_stored() -> None:
    from idempotent.adapters.pulsar.entries import entry_offset

    offset, error = entry_offset((_ok(), _Id(-1, -1, -1)), (_ok(), _Id(-1, -1, -1)), 2, "append to t[0]")
    assert offset is None and isinstance(error, BackendUnavailableError)
    assert "stored before" in str(error)
    for last in (_Id(7, 4, 1), _Id(8, 3, 1), _Id(7, 3, 2)):  # another entry, ledger, or a gap
        offset, error = entry_offset((_ok(), _Id(7, 3, 0)), (_ok(), last), 2, "append to t[0]")
        assert offset is None and isinstance(error, BackendUnavailableError)
        assert "not stored as one entry" in str(error)


def test_the_pulsar_name_of_a_producer() -> None:
    from idempotent.adapters.pulsar.entries import pulsar_producer_name

    assert pulsar_producer_name("orders-feed", True) == "orders-feed"
    assert pulsar_producer_name("42", False) == "idempotent-p-42"
