"""What a comparison was asked to run, and the ordered plan of its runs.

:class:`CompareConfig` is the one value the engine (:mod:`~idempotent.compare.runner`), the
results file (:mod:`~idempotent.compare.results`) and the report
(:mod:`~idempotent.compare.report`) share; it imports none of them, so none of them imports
another through it.
"""

from __future__ import annotations

import attrs

from .catalogue import SYSTEMS, is_ours
from .schedule import FAULTS
from .workload import WORKLOADS

#: ``idempotent compare --long``: every fault on every system, 50 seeded schedules each for
#: this project's systems and 20 for the native clients, 500 records as fast as each goes.
LONG = {"schedules": 50, "native_schedules": 20, "records": 500, "rate": 0.0, "seed": 100}
#: Records of a capacity run: one unthrottled run without a fault per system.
CAPACITY_RECORDS = 5000


@attrs.frozen
class PlannedRun:
    """One run of the plan: ``kind`` is ``"fault"`` (a schedule of the matrix) or
    ``"capacity"`` (no fault, no rate limit, :attr:`CompareConfig.capacity_records` records)."""

    kind: str
    system: str
    fault: str
    seed: int

    @property
    def key(self) -> tuple[str, str, str, int]:
        """What identifies the run in a results file."""
        return (self.kind, self.system, self.fault, self.seed)


@attrs.frozen
class CompareConfig:
    """What ``idempotent compare`` was asked to run.

    ``schedules`` seeded schedules (seeds ``seed``, ``seed + 1``, ...) of every fault on every
    system, except the native clients, which run the first ``native_schedules`` of them
    (``None``: all). ``capacity_records > 0`` adds one capacity run per system. ``workload``
    is ``produce`` (publish the records) or ``ctp`` (a copy job copies them from an input
    topic in transactions: :mod:`~idempotent.compare.copying`).

    Raises:
        ValueError: an unknown system, fault or workload, or a count out of range.
    """

    systems: tuple[str, ...]
    faults: tuple[str, ...]
    records: int = 2000
    rate: float = 0.0
    schedules: int = 1
    seed: int = 1
    value_bytes: int = 100
    native_schedules: int | None = None
    capacity_records: int = CAPACITY_RECORDS
    workload: str = "produce"

    def __attrs_post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r}; expected one of {', '.join(WORKLOADS)}")
        for system in self.systems:
            if system not in SYSTEMS:
                raise ValueError(f"unknown system {system!r}; expected some of {', '.join(SYSTEMS)}")
        for fault in self.faults:
            if fault not in FAULTS:
                raise ValueError(f"unknown fault {fault!r}; expected some of {', '.join(FAULTS)}")
        if self.records < 10 or self.schedules < 1 or self.rate < 0:
            raise ValueError("records must be at least 10, schedules at least 1, rate not negative")
        if self.native_schedules is not None and self.native_schedules < 0:
            raise ValueError("native schedules must not be negative")
        if self.capacity_records != 0 and self.capacity_records < 10:
            raise ValueError("capacity records must be 0 (no capacity runs) or at least 10")

    def schedules_of(self, system: str) -> int:
        """How many seeded schedules ``system`` runs."""
        if is_ours(system) or self.native_schedules is None:
            return self.schedules
        return min(self.schedules, self.native_schedules)

    def plan(self) -> list[PlannedRun]:
        """Every run, in the order they are carried out.

        Schedule by schedule (so an interrupted comparison has covered every pair about
        equally), fault by fault, system by system; the capacity runs come after the first
        schedule, once the brokers are warm.
        """
        runs: list[PlannedRun] = []
        for index in range(self.schedules):
            seed = self.seed + index
            for fault in self.faults:
                runs += [PlannedRun("fault", s, fault, seed) for s in self.systems if index < self.schedules_of(s)]
            if index == 0 and self.capacity_records:
                runs += [PlannedRun("capacity", s, "none", self.seed) for s in self.systems]
        return runs


__all__ = ["CAPACITY_RECORDS", "LONG", "CompareConfig", "PlannedRun"]
