"""Compare: one workload and one fault schedule on every system, and a report.

``idempotent compare --systems LIST --faults LIST`` publishes the same records (unique ids,
replayable source: :mod:`~idempotent.compare.workload`) under the same seeded fault
schedule (:mod:`~idempotent.compare.schedule`) through this project's producer (in process
over memory, SQLite, Kafka and Pulsar, and through a broker server) and through the native
Kafka and Pulsar clients (:mod:`~idempotent.compare.systems`, :mod:`~idempotent.compare.producers`),
injects the faults the same way for all of them (:mod:`~idempotent.compare.faults`), reads
everything back, counts duplicates, losses, reorders and "possibly persisted" sends
(:mod:`~idempotent.compare.check`), and writes report.json, report.md and report.html
(:mod:`~idempotent.compare.report`, charts in :mod:`~idempotent.compare.charts`).
:mod:`~idempotent.compare.runner` is the engine; :mod:`~idempotent.compare.config` says what
to run (``--long``: every fault on every system, many schedules) and
:mod:`~idempotent.compare.results` keeps the finished runs so an interrupted comparison
continues where it stopped.
"""

from .catalogue import NATIVE, OURS_IN_PROCESS, OURS_SERVER, SYSTEMS, is_ours
from .check import Ledger, State, Verdict, check
from .config import LONG, CompareConfig, PlannedRun
from .runner import run_compare, run_one
from .schedule import FAULTS, FaultEvent, schedule
from .systems import Environment
from .workload import Workload, record_id

__all__ = [
    "FAULTS",
    "LONG",
    "NATIVE",
    "OURS_IN_PROCESS",
    "OURS_SERVER",
    "SYSTEMS",
    "CompareConfig",
    "Environment",
    "FaultEvent",
    "Ledger",
    "PlannedRun",
    "State",
    "Verdict",
    "Workload",
    "check",
    "is_ours",
    "record_id",
    "run_compare",
    "run_one",
    "schedule",
]
