"""The life cycle of an outgoing batch: its states, the triggers that move it, one table.

Theory of operation
-------------------
Everything that moves a batch of :class:`~idempotent.core.sequencer.ProducerSequencer` from one
state to another is here, as in h11's ``_state.py``: the sequencer decides *when* a trigger
happens (a batch is full, an answer arrived, a timer ran out) and asks :func:`transition` for
the state it leads to. A move the table does not have is a bug in the sequencer and raises
:class:`~idempotent.errors.IllegalStateTransition` before anything changed; the sequencer
never assigns a state itself.

The table, one line per move (``tests/core/test_transitions.py`` checks that these lines are the
table, and walks it)::

    OPEN      --SEAL-->     QUEUED    full, lingered long enough, flushed, or split off a
                                      queued batch
    OPEN      --FAIL-->     DONE      timed out before it was sealed, or the producer failed
    QUEUED    --SEND-->     AWAITING  first transmission: stamped with its sequences now
    QUEUED    --FAIL-->     DONE      timed out before it was sent, or the producer failed
    AWAITING  --RETRY-->    RESEND    no definite answer (request timeout, transport error,
                                      IN_FLIGHT, a retriable error) or one asking to resend
                                      it after an earlier batch (OUT_OF_ORDER_SEQUENCE)
    AWAITING  --REFUSE-->   RESEND    refused by an answer that fails the producer (FENCED,
                                      UNKNOWN_PRODUCER, a fatal error): no longer awaited,
                                      and nothing of this attempt is stored
    AWAITING  --DELIVER-->  DONE      ACCEPTED or DUPLICATE
    AWAITING  --FAIL-->     DONE      refused for good alone (InvalidBatchError), or the
                                      producer failed
    RESEND    --SEND-->     AWAITING  sent again, same sequences, next attempt
    RESEND    --DELIVER-->  DONE      an answer to an earlier attempt says it is stored
    RESEND    --FAIL-->     DONE      the producer failed

``DONE`` is final. A failed batch's status is decided by whether an attempt of it went
unanswered, not by the state it failed from (``OutgoingBatch.doubtful``, or ``AWAITING``).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

from idempotent.errors import IllegalStateTransition


class BatchState(enum.Enum):
    """Where an outgoing batch is in its life cycle."""

    #: taking records
    OPEN = "open"
    #: sealed, waiting to be sent, without sequences yet (unless the application chose them)
    QUEUED = "queued"
    #: an attempt is out and its answer awaited
    AWAITING = "awaiting"
    #: to be sent again (with the same sequences), or refused while the producer fails
    RESEND = "resend"
    #: delivered or failed: the batch's records each ended in one event
    DONE = "done"

    # members are singletons: hash them by identity, in C (Enum's own __hash__ is Python
    # code, and the table is read a few times per batch on the producer's path)
    __hash__ = object.__hash__


class BatchTrigger(enum.Enum):
    """What moves a batch (see the module docstring for when each happens)."""

    SEAL = "seal"
    SEND = "send"
    RETRY = "retry"
    REFUSE = "refuse"
    DELIVER = "deliver"
    FAIL = "fail"

    __hash__ = object.__hash__  # see BatchState


def _freeze(
    table: dict[BatchState, dict[BatchTrigger, BatchState]],
) -> Mapping[BatchState, Mapping[BatchTrigger, BatchState]]:
    return MappingProxyType({state: MappingProxyType(moves) for state, moves in table.items()})


#: state -> trigger -> the state it leads to; a pair that is missing is an illegal move
TRANSITIONS: Mapping[BatchState, Mapping[BatchTrigger, BatchState]] = _freeze(
    {
        BatchState.OPEN: {
            BatchTrigger.SEAL: BatchState.QUEUED,
            BatchTrigger.FAIL: BatchState.DONE,
        },
        BatchState.QUEUED: {
            BatchTrigger.SEND: BatchState.AWAITING,
            BatchTrigger.FAIL: BatchState.DONE,
        },
        BatchState.AWAITING: {
            BatchTrigger.RETRY: BatchState.RESEND,
            BatchTrigger.REFUSE: BatchState.RESEND,
            BatchTrigger.DELIVER: BatchState.DONE,
            BatchTrigger.FAIL: BatchState.DONE,
        },
        BatchState.RESEND: {
            BatchTrigger.SEND: BatchState.AWAITING,
            BatchTrigger.DELIVER: BatchState.DONE,
            BatchTrigger.FAIL: BatchState.DONE,
        },
        BatchState.DONE: {},
    }
)


def transition(state: BatchState, trigger: BatchTrigger) -> BatchState:
    """The state ``trigger`` moves a batch in ``state`` to.

    Raises:
        IllegalStateTransition: the table has no such move (a bug in the caller); nothing
            changed.
    """
    try:
        return TRANSITIONS[state][trigger]
    except KeyError:
        raise IllegalStateTransition(
            f"a batch in state {state.name} cannot {trigger.name}: not a move of the batch "
            "transition table (a bug in the sequencer)"
        ) from None
