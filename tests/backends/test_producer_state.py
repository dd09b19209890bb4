"""A named producer's state recovered at its restart (``adapters/producer_state.py``): the
stored state plus a replay of the partition after it, rebuilt within the window or refused,
never taken as empty. Pure: no backend."""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import pytest

from idempotent import Outcome
from idempotent.adapters.producer_state import recover_state, replay_start
from idempotent.core.checker import PartitionChecker
from idempotent.core.records import Snapshot, StoredBatch, make_header
from idempotent.core.types import Epoch, ProducerId, Sequence
from idempotent.errors import CorruptDataError, ProducerStateLostError

PID = 7
OTHER = 8


def _batch(offset: int, sequence: int, count: int = 10, pid: int = PID, epoch: int = 0) -> StoredBatch:
    return StoredBatch(offset, ProducerId(pid), Epoch(epoch), Sequence(sequence), count, 1.0)


def _log(batches: list[StoredBatch]) -> object:
    """``replay(start)``: the batches from ``start`` on, recording where each replay began."""
    starts: list[int] = []

    def replay(start: int) -> Iterator[StoredBatch]:
        starts.append(start)
        return iter([b for b in batches if b.base_offset >= start])

    replay.starts = starts  # type: ignore[attr-defined]
    return replay


def _state(batches: list[StoredBatch]) -> Snapshot:
    checker = PartitionChecker()
    for batch in batches:
        checker.apply(batch)
    return checker.snapshot(1.0)


def _answer(snapshot: Snapshot | None, sequence: int, count: int = 10) -> tuple[Outcome, int | None]:
    checker = PartitionChecker.restore(snapshot)
    result = checker.check(make_header(PID, 0, sequence, count))
    return result.outcome, result.base_offset


def _recover(
    stored: Snapshot | None, trouble: str | None, bounds: tuple[int, int], window: int, log: object
) -> Snapshot | None:
    return recover_state("feed", PID, "orders", 3, stored, trouble, bounds, window, log, now=2.0)  # type: ignore[arg-type]


# the producer's batches 0..49 at offsets 0..49, then another producer's 1,000 records
OURS = [_batch(10 * i, 10 * i) for i in range(5)]
THEIRS = [_batch(50 + 10 * i, 10 * i, pid=OTHER) for i in range(100)]
LOG = OURS + THEIRS
END = 1050


def test_a_current_state_is_completed_by_a_replay_that_finds_nothing_new() -> None:
    stored = _state(OURS)
    log = _log(LOG)
    state = _recover(stored, None, (0, END), 100_000, log)
    assert log.starts == [50]  # type: ignore[attr-defined]  # from the state's position on
    assert state is not None and state.position == END
    assert _answer(state, 40) == (Outcome.DUPLICATE, 40)
    assert _answer(state, 50)[0] is Outcome.ACCEPTED


def test_a_state_older_than_the_data_takes_the_newer_batches_from_the_replay() -> None:
    stored = _state(OURS[:2])  # the state topic lost the three newest states
    state = _recover(stored, None, (0, END), 100_000, _log(LOG))
    assert state is not None
    assert _answer(state, 0) == (Outcome.DUPLICATE, 0)
    assert _answer(state, 40) == (Outcome.DUPLICATE, 40)  # resends of every stored batch: duplicates
    assert _answer(state, 50)[0] is Outcome.ACCEPTED


def test_a_missing_state_is_rebuilt_from_the_whole_partition_when_the_window_holds_it() -> None:
    log = _log(LOG)
    state = _recover(None, "missing", (0, END), END, log)
    assert log.starts == [0]  # type: ignore[attr-defined]
    assert state is not None and state.position == END
    for i in range(5):
        assert _answer(state, 10 * i) == (Outcome.DUPLICATE, 10 * i)
    assert _answer(state, 50)[0] is Outcome.ACCEPTED


def test_a_missing_state_is_rebuilt_from_the_window_when_it_holds_the_producers_newest_batch() -> None:
    log = [*OURS, *THEIRS, _batch(END, 50), _batch(END + 10, 60)]  # it wrote again after the others
    state = _recover(None, "missing", (0, END + 20), 100, _log(log))
    assert state is not None
    assert _answer(state, 60) == (Outcome.DUPLICATE, END + 10)
    assert _answer(state, 0)[0] is Outcome.DUPLICATE  # behind its newest batch: never stored again
    assert _answer(state, 70)[0] is Outcome.ACCEPTED


def test_a_missing_state_that_the_window_cannot_decide_refuses_the_restart() -> None:
    with pytest.raises(ProducerStateLostError) as refused:
        _recover(None, "missing", (0, END), 100, _log(LOG))
    error = refused.value
    assert (error.producer_name, error.topic, error.partition) == ("feed", "orders", 3)
    assert "'feed'" in str(error) and "orders[3]" in str(error) and "missing" in str(error)
    assert "state_rebuild_records" in str(error) and str(END) in str(error)  # what to do
    assert isinstance(error, CorruptDataError) and not error.retriable
    clone = pickle.loads(pickle.dumps(error))
    assert (clone.producer_name, clone.topic, clone.partition, str(clone)) == ("feed", "orders", 3, str(error))


def test_a_state_older_than_the_window_is_refused_unless_the_window_holds_a_newer_batch() -> None:
    stored = _state(OURS[:2])
    with pytest.raises(ProducerStateLostError, match="older than the window"):
        _recover(stored, None, (0, END), 100, _log(LOG))
    log = [*LOG, _batch(END, 50)]
    state = _recover(stored, None, (0, END + 10), 100, _log(log))
    assert state is not None
    assert _answer(state, 50) == (Outcome.DUPLICATE, END)
    assert _answer(state, 0) == (Outcome.DUPLICATE, 0)  # the stored state's batches are kept


def test_an_unreadable_state_is_rebuilt_as_a_missing_one() -> None:
    state = _recover(None, "unreadable (garbled)", (0, END), END, _log(LOG))
    assert state is not None and _answer(state, 40) == (Outcome.DUPLICATE, 40)
    with pytest.raises(ProducerStateLostError, match="unreadable"):
        _recover(None, "unreadable (garbled)", (0, END), 10, _log(LOG))


def test_a_missing_state_on_a_partition_without_its_batches_is_no_state() -> None:
    assert _recover(None, "missing", (0, 1000), 1000, _log(THEIRS)) is None
    with pytest.raises(ProducerStateLostError):  # retention removed the start: its batches may have been there
        _recover(None, "missing", (500, 1000), 1000, _log(THEIRS))


def test_other_producers_batches_are_not_applied() -> None:
    state = _recover(None, "missing", (0, END), END, _log(LOG))
    assert state is not None
    assert not PartitionChecker.restore(state).tracks(OTHER)


def test_where_the_replay_starts() -> None:
    stored = _state(OURS)  # position 50
    assert replay_start(stored, 0, 1000, 10_000) == (50, True)
    assert replay_start(stored, 0, 1000, 100) == (900, False)
    assert replay_start(stored, 80, 1000, 10_000) == (80, True)  # retention removed what follows it
    assert replay_start(stored, 0, 40, 10) == (50, True)  # a state beyond the end: nothing to read
    assert replay_start(None, 0, 1000, 10_000) == (0, True)
    assert replay_start(None, 0, 1000, 100) == (900, False)
    assert replay_start(None, 200, 1000, 10_000) == (200, False)


def test_the_drop_in_reports_a_refused_restart_as_a_fatal_state_error() -> None:
    from idempotent.compat import _kafka_errors

    error = ProducerStateLostError("refused: orders[3]", "feed", "orders", 3)
    for mapped in (_kafka_errors.kafka_error_of(error, None, None), _kafka_errors.kafka_error_for(error)):
        assert (mapped.name(), mapped.fatal(), mapped.retriable()) == ("_STATE", True, False)
        assert mapped.cause is error and "orders[3]" in mapped.str()
