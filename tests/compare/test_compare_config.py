"""What a comparison runs: the configuration's checks and the ordered plan of its runs."""

from __future__ import annotations

from collections import Counter

import pytest

from idempotent.compare import FAULTS, LONG, NATIVE, SYSTEMS, CompareConfig, is_ours
from idempotent.compare.catalogue import unsupported


def test_plan_goes_schedule_by_schedule_and_runs_the_natives_fewer_times() -> None:
    config = CompareConfig(("memory", "kafka-native"), ("none", "lost-ack"), schedules=3, seed=10,
                           native_schedules=1, capacity_records=100)  # fmt: skip
    plan = [(r.kind, r.system, r.fault, r.seed) for r in config.plan()]
    assert plan == [
        ("fault", "memory", "none", 10),
        ("fault", "kafka-native", "none", 10),
        ("fault", "memory", "lost-ack", 10),
        ("fault", "kafka-native", "lost-ack", 10),
        ("capacity", "memory", "none", 10),
        ("capacity", "kafka-native", "none", 10),
        ("fault", "memory", "none", 11),
        ("fault", "memory", "lost-ack", 11),
        ("fault", "memory", "none", 12),
        ("fault", "memory", "lost-ack", 12),
    ]
    assert len({r.key for r in config.plan()}) == len(plan)


def test_without_native_schedules_every_system_runs_every_schedule() -> None:
    config = CompareConfig(("memory", "pulsar-native"), ("none",), schedules=2, capacity_records=0)
    assert Counter(r.system for r in config.plan()) == {"memory": 2, "pulsar-native": 2}
    assert config.schedules_of("pulsar-native") == 2


def test_the_long_preset_covers_every_applicable_fault_on_every_system() -> None:
    config = CompareConfig(SYSTEMS, FAULTS, **LONG)  # type: ignore[arg-type]
    runs = Counter((r.system, r.fault) for r in config.plan() if r.kind == "fault")
    for system in SYSTEMS:
        for fault in FAULTS:
            if unsupported(system, fault) is None:
                assert runs[(system, fault)] >= (50 if is_ours(system) else 20), (system, fault)
    assert {s for s, _ in runs} == set(SYSTEMS) and {f for _, f in runs} == set(FAULTS)
    assert all(config.schedules_of(s) == 20 for s in NATIVE)


@pytest.mark.parametrize(
    "changes",
    [
        {"systems": ("cassandra",)},
        {"faults": ("meteor",)},
        {"records": 5},
        {"native_schedules": -1},
        {"capacity_records": 5},
        {"rate": -1.0},
        {"workload": "batch"},
    ],
)
def test_bad_configurations_are_refused(changes: dict[str, object]) -> None:
    values: dict[str, object] = {"systems": ("memory",), "faults": ("none",), **changes}
    with pytest.raises(ValueError):
        CompareConfig(**values)  # type: ignore[arg-type]


def test_ctp_runs_on_the_transactional_systems_under_the_process_faults() -> None:
    from idempotent.compare.catalogue import CTP_FAULTS, TRANSACTIONAL

    for system in SYSTEMS:
        for fault in FAULTS:
            reason = unsupported(system, fault, "ctp")
            if system in TRANSACTIONAL and fault in CTP_FAULTS:
                assert reason is None, (system, fault, reason)
            else:
                assert reason, (system, fault)
    assert "pulsar" in (unsupported("pulsar", "none", "ctp") or "")
    assert "transactions" in (unsupported("kafka-native-idempotent", "none", "ctp") or "")
    assert "produce workload" in (unsupported("memory", "lost-ack", "ctp") or "")
    assert unsupported("pulsar", "none") is None  # the produce workload is unchanged
