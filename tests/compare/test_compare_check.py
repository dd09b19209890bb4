"""The comparison's pure parts: workload ids, seeded schedules, the ledger and the check."""

from __future__ import annotations

import pytest

from idempotent.compare.check import Ledger, State, check
from idempotent.compare.schedule import FAULTS, schedule
from idempotent.compare.workload import Workload, copied_id, record_id, transform


def test_workload_values_carry_their_id_and_replay_from_any_point() -> None:
    workload = Workload(50, value_bytes=32)
    assert [record_id(v) for _, v in workload.source(45)] == [45, 46, 47, 48, 49]
    assert len(workload.value(7)) == 32
    assert record_id(b"not ours") is None
    assert record_id(None) is None
    with pytest.raises(ValueError):
        Workload(0)


def test_schedule_depends_on_seed_not_on_system() -> None:
    assert schedule("none", 1, 1000) == ()
    for fault in FAULTS[1:]:
        first = schedule(fault, 3, 1000)
        assert first == schedule(fault, 3, 1000)
        assert first
        assert all(0 < e.at < 1000 and e.fault == fault for e in first)
        assert [e.at for e in first] == sorted(e.at for e in first)
    assert schedule("lost-ack", 1, 1000) != schedule("lost-ack", 2, 1000)
    with pytest.raises(ValueError):
        schedule("earthquake", 1, 10)


def test_ledger_keeps_the_strongest_outcome() -> None:
    ledger = Ledger(5)
    for i in range(5):
        ledger.sent(i)
    ledger.failed(0, possibly_persisted=False)
    ledger.failed(1, possibly_persisted=True)
    ledger.failed(1, possibly_persisted=False)  # an earlier instance may have stored it
    ledger.acknowledged_at(2, 0.1, 0.01)
    ledger.failed(2, possibly_persisted=False)  # an acknowledgement stands
    ledger.acknowledged_at(2, 0.2, 0.02)  # counted once
    ledger.in_flight_lost(3, 4)
    assert ledger.states() == [State.FAILED, State.AMBIGUOUS, State.ACKNOWLEDGED, State.AMBIGUOUS, State.AMBIGUOUS]
    assert ledger.acknowledged == 1 and ledger.acks == [(0.1, 0.01)]
    assert ledger.first_unacknowledged() == 0


def test_check_counts_duplicates_losses_and_reorders() -> None:
    states = [State.ACKNOWLEDGED] * 6 + [State.AMBIGUOUS, State.FAILED, State.UNSENT]
    stored = [0, 1, 3, 2, 3, 4, None, 6, 7]  # 2 after 3: reordered; 3 twice; 5 lost; 7 failed yet stored
    verdict = check(states, stored)
    assert (verdict.duplicates, verdict.lost, verdict.reordered) == (1, 1, 1)
    assert verdict.examples["duplicates"] == [3]
    assert verdict.examples["lost"] == [5]
    assert verdict.examples["reordered"] == [2]
    assert verdict.examples["failed_but_stored"] == [7]
    assert (verdict.sent, verdict.acknowledged, verdict.failed, verdict.ambiguous) == (8, 6, 1, 1)
    assert (verdict.stored, verdict.stored_unique, verdict.unexpected, verdict.ambiguous_stored) == (8, 7, 1, 1)


def test_check_of_a_clean_log_is_clean() -> None:
    verdict = check([State.ACKNOWLEDGED] * 4, [0, 1, 2, 3])
    assert (verdict.duplicates, verdict.lost, verdict.reordered, verdict.unexpected) == (0, 0, 0, 0)


def test_the_copy_jobs_output_carries_the_input_id_and_only_copies_count() -> None:
    value = Workload(50, value_bytes=32).value(42)
    copied = transform(value)
    assert copied != value and copied_id(copied) == 42 and record_id(copied) == 42
    assert copied_id(value) is None  # an input value stored untransformed is not a copy
    assert copied_id(None) is None and copied_id(b"short") is None


def test_check_of_a_copy_job_counts_what_it_committed_past_and_did_not_write_as_lost() -> None:
    # 0-3 acknowledged; 4-5 possibly persisted (the instance died), then passed by a commit
    # recorded in another instance: the committed input position says 6 were copied
    states = [State.ACKNOWLEDGED] * 4 + [State.AMBIGUOUS] * 2 + [State.UNSENT] * 2
    stored = [0, 1, 2, 3, 4]
    assert check(states, stored).lost == 0
    verdict = check(states, stored, committed=6)
    assert (verdict.lost, verdict.examples["lost"]) == (1, [5])
    assert check(states, [*stored, 5], committed=6).lost == 0
