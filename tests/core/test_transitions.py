"""The batch transition table (idempotent/core/transitions.py): walked move by move, every move it
lacks refused, and the sequencer held to it."""

from __future__ import annotations

import itertools
import pickle
import re

import pytest

import idempotent.core.transitions as transitions
from idempotent.core.outcomes import Outcome, ProduceResult
from idempotent.core.records import Record
from idempotent.core.registry import Admission, ProducerRegistry
from idempotent.core.sequencer import ProducerSequencer
from idempotent.core.transitions import TRANSITIONS, BatchState, BatchTrigger, transition
from idempotent.errors import IllegalStateTransition, InternalError, Recovery

LEGAL = [(state, trigger, target) for state, moves in TRANSITIONS.items() for trigger, target in moves.items()]
ILLEGAL = [
    (state, trigger)
    for state, trigger in itertools.product(BatchState, BatchTrigger)
    if trigger not in TRANSITIONS[state]
]


def test_the_table_covers_every_state_once() -> None:
    assert set(TRANSITIONS) == set(BatchState)
    assert len(LEGAL) == 11 and len(ILLEGAL) == len(BatchState) * len(BatchTrigger) - 11


@pytest.mark.parametrize(("state", "trigger", "target"), LEGAL, ids=lambda v: getattr(v, "name", v))
def test_every_legal_move(state: BatchState, trigger: BatchTrigger, target: BatchState) -> None:
    assert transition(state, trigger) is target


@pytest.mark.parametrize(("state", "trigger"), ILLEGAL, ids=lambda v: v.name)
def test_every_other_move_is_refused(state: BatchState, trigger: BatchTrigger) -> None:
    with pytest.raises(IllegalStateTransition, match=rf"state {state.name} cannot {trigger.name}"):
        transition(state, trigger)


def test_an_illegal_move_is_a_fatal_bug_of_the_tree() -> None:
    with pytest.raises(InternalError) as raised:
        transition(BatchState.DONE, BatchTrigger.SEND)
    assert raised.value.recovery is Recovery.FATAL
    clone = pickle.loads(pickle.dumps(raised.value))
    assert type(clone) is IllegalStateTransition and str(clone) == str(raised.value)


def test_the_table_cannot_be_changed_at_run_time() -> None:
    with pytest.raises(TypeError):
        TRANSITIONS[BatchState.DONE][BatchTrigger.SEND] = BatchState.AWAITING  # type: ignore[index]


def test_every_state_is_reached_from_open_and_ends_done() -> None:
    reached, todo = {BatchState.OPEN}, [BatchState.OPEN]
    while todo:
        for target in TRANSITIONS[todo.pop()].values():
            if target not in reached:
                reached.add(target)
                todo.append(target)
    assert reached == set(BatchState)
    assert TRANSITIONS[BatchState.DONE] == {}
    for state in set(BatchState) - {BatchState.DONE}:
        assert TRANSITIONS[state][BatchTrigger.FAIL] is BatchState.DONE  # a producer can always fail


def test_the_docstring_draws_the_table() -> None:
    drawn = {
        (BatchState[state], BatchTrigger[trigger], BatchState[target])
        for state, trigger, target in re.findall(
            r"^\s+([A-Z]+)\s+--([A-Z]+)-->\s+([A-Z]+)", transitions.__doc__ or "", re.M
        )
    }
    assert drawn == set(LEGAL)


# -- the sequencer moves batches only through the table ------------------------------------


def _sent(seq: ProducerSequencer) -> list[object]:
    seq.add("t", 0, Record(b"v"), 0.0)
    seq.flush()
    return list(seq.batches_to_send(0.0))


def test_the_sequencer_refuses_to_send_an_awaited_batch_again() -> None:
    """Regression: ``_transmit`` assigned AWAITING whatever the state, so a second send of a
    batch whose answer was still awaited went unnoticed (and counted a new attempt)."""
    seq = ProducerSequencer(1, 0)
    (batch,) = _sent(seq)
    before = (batch.state, batch.attempt, batch.sent_at)  # type: ignore[attr-defined]
    with pytest.raises(IllegalStateTransition, match="state AWAITING cannot SEND"):
        seq._transmit(batch, 1.0)  # type: ignore[arg-type]
    assert (batch.state, batch.attempt, batch.sent_at) == before  # type: ignore[attr-defined]


def test_the_sequencer_refuses_to_end_a_batch_twice() -> None:
    """Regression: ``_finish`` set DONE on a batch already DONE and counted its records off
    the unfinished ones a second time."""
    seq = ProducerSequencer(1, 0)
    (batch,) = _sent(seq)
    seq.handle_result(batch.batch_id, batch.attempt, ProduceResult(Outcome.ACCEPTED, 0), 0.0, 0.0)  # type: ignore[attr-defined]
    assert batch.state.name == "DONE" and seq.unfinished == 0  # type: ignore[attr-defined]
    with pytest.raises(IllegalStateTransition, match="state DONE cannot DELIVER"):
        seq._finish(batch, BatchTrigger.DELIVER)  # type: ignore[arg-type]
    assert seq.unfinished == 0


def test_a_batch_walks_the_table_through_a_retry() -> None:
    seq = ProducerSequencer(1, 0)
    seq.add("t", 0, Record(b"v"), 0.0)
    assert seq._partitions[("t", 0)].open.state is BatchState.OPEN  # type: ignore[union-attr, index]
    seq.flush()
    (batch,) = seq.batches_to_send(0.0)
    assert batch.state is BatchState.AWAITING
    seq.handle_result(batch.batch_id, batch.attempt, ProduceResult(Outcome.IN_FLIGHT), 0.0, 0.0)
    assert batch.state is BatchState.RESEND
    (again,) = seq.batches_to_send(0.0)
    assert again is batch and batch.state is BatchState.AWAITING and batch.attempt == 2
    # the answer to the first attempt says it is stored: taken
    seq.handle_result(batch.batch_id, 1, ProduceResult(Outcome.ACCEPTED, 5), 0.0, 0.0)
    assert batch.state is BatchState.DONE


# -- admission values ----------------------------------------------------------------------


def test_admission_is_an_enum_with_the_same_values() -> None:
    """Regression: Admission was a class of string constants, so any string compared equal
    to one passed for an admission."""
    assert [a.value for a in Admission] == ["admitted", "state_lost", "fenced", "unknown"]
    registry = ProducerRegistry()
    registry.add_id_block(0, 10)
    record = registry.init("p")
    assert registry.admit(record.producer_id, record.producer_epoch) is Admission.ADMITTED
    assert registry.admit(record.producer_id, record.producer_epoch + 1) is Admission.UNKNOWN
    assert Admission.ADMITTED != "admitted"
