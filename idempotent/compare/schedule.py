"""Seeded fault schedules: the same faults at the same points of the workload on every system.

A schedule is a list of :class:`FaultEvent`: the producing process pauses before it hands
record ``at`` to its producer, the fault is injected, and it goes on. Positions depend only
on the fault, the seed and the record count, never on the system, so ``--seed S`` gives every
system the same schedule.
"""

from __future__ import annotations

import random

import attrs

#: Every fault the comparison knows, in report order.
FAULTS = (
    "none",
    "lost-ack",
    "cut",
    "duplicate-request",
    "broker-restart",
    "broker-kill",
    "producer-restart",
    "zombie",
)

#: Faults injected several times per run (cheap, on the link); the others once.
LINK_FAULTS = ("lost-ack", "cut", "duplicate-request")


@attrs.frozen
class FaultEvent:
    """Inject ``fault`` before record ``at`` is sent."""

    at: int
    fault: str


def schedule(fault: str, seed: int, records: int) -> tuple[FaultEvent, ...]:
    """The seeded events of one run.

    Link faults happen 2 to 4 times between 10 % and 90 % of the records; a broker or
    producer restart and a zombie once, between 25 % and 60 %.

    Raises:
        ValueError: unknown fault.
    """
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; expected one of {', '.join(FAULTS)}")
    if fault == "none":
        return ()
    rng = random.Random(f"{fault}/{seed}/{records}")
    if fault in LINK_FAULTS:
        points = sorted(rng.uniform(0.1, 0.9) for _ in range(rng.randint(2, 4)))
    else:
        points = [rng.uniform(0.25, 0.6)]
    return tuple(FaultEvent(max(1, int(p * records)), fault) for p in points)


__all__ = ["FAULTS", "LINK_FAULTS", "FaultEvent", "schedule"]
