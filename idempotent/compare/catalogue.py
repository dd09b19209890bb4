"""Which systems are compared, and which faults and workloads apply to each one.

Systems (``SYSTEMS``):

* ours, in process over each backend: ``memory``, ``sqlite``, ``kafka``, ``pulsar``;
* ours through a broker server (``idempotent broker``): ``idem+sqlite``, ``idem+kafka``,
  ``idem+pulsar``;
* the native clients: ``kafka-native``, ``kafka-native-idempotent``,
  ``kafka-native-transactional``, ``pulsar-native``, ``pulsar-native-dedup``.

A value-only catalogue: the names of :data:`SYSTEMS`, which of them are this project's
(:func:`is_ours`), the backend each one stores into (:func:`backend_of`), and why a fault
cannot reach a system (:func:`unsupported`). The configuration and the report read it without
loading what runs the systems (:mod:`idempotent.compare.systems`).
"""

from __future__ import annotations

OURS_IN_PROCESS = ("memory", "sqlite", "kafka", "pulsar")
OURS_SERVER = ("idem+sqlite", "idem+kafka", "idem+pulsar")
NATIVE = (
    "kafka-native",
    "kafka-native-idempotent",
    "kafka-native-transactional",
    "pulsar-native",
    "pulsar-native-dedup",
)
SYSTEMS = OURS_IN_PROCESS + OURS_SERVER + NATIVE

#: The systems that run the ctp workload: those whose client commits a transaction's output
#: with the copy job's input position (see :func:`unsupported` for the others).
TRANSACTIONAL = ("memory", "sqlite", "kafka", "idem+sqlite", "kafka-native-transactional")
#: The faults of the ctp workload: the ones that end or restart a process.
CTP_FAULTS = ("none", "broker-kill", "producer-restart")


def is_ours(system: str) -> bool:
    """True for this project's systems (the ones whose anomalies must be 0)."""
    return system in OURS_IN_PROCESS or system in OURS_SERVER


def backend_of(system: str) -> str:
    """``memory``, ``sqlite``, ``kafka`` or ``pulsar``: what stores the records.

    Raises:
        ValueError: unknown system.
    """
    if system not in SYSTEMS:
        raise ValueError(f"unknown system {system!r}; expected one of {', '.join(SYSTEMS)}")
    return system.removeprefix("idem+").split("-")[0]


def unsupported(system: str, fault: str, workload: str = "produce") -> str | None:
    """Why ``fault`` cannot happen to ``system`` in ``workload``, or None when it can."""
    if workload == "ctp":
        reason = _no_ctp(system, fault)
        if reason is not None:
            return reason
    in_process = system in ("memory", "sqlite")
    if in_process and fault in ("cut", "broker-restart"):
        return "the broker runs inside the producing process: there is no connection to cut or broker to restart"
    if fault == "duplicate-request" and backend_of(system) in ("kafka", "pulsar") and system not in OURS_SERVER:
        return "the Kafka/Pulsar proxy cannot duplicate a request without confusing the client's correlation"
    return None


def _no_ctp(system: str, fault: str) -> str | None:
    if system in TRANSACTIONAL:
        if fault in CTP_FAULTS:
            return None
        return (
            f"the ctp workload runs the process faults ({', '.join(CTP_FAULTS[1:])}); "
            f"{fault} is measured by the produce workload"
        )
    if backend_of(system) == "pulsar":
        return "ctp needs transactions: pulsar-client-python has none (pulsar:// refuses them)"
    if system in OURS_SERVER:
        return "ctp needs transactions: a broker server over Kafka cannot store a group atomically"
    return "ctp needs transactions: this client cannot commit its output with the input position"


__all__ = [
    "CTP_FAULTS",
    "NATIVE",
    "OURS_IN_PROCESS",
    "OURS_SERVER",
    "SYSTEMS",
    "TRANSACTIONAL",
    "backend_of",
    "is_ours",
    "unsupported",
]
