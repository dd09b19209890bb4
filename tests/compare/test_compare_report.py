"""The comparison report without running anything: scales, ticks, tables and charts drawn from
report entries shaped like the runner's (see :func:`report_entries`)."""

from __future__ import annotations

import itertools
import math
import pathlib
import random
import re
from typing import Any

import pytest

from idempotent.compare import FAULTS, SYSTEMS, CompareConfig, is_ours
from idempotent.compare.catalogue import unsupported
from idempotent.compare.charts import linear_scale, log_scale, nice_step, text_width, tick_label
from idempotent.compare.report import seeds_text, summarise, write_report

ROUND_MANTISSAS = (1.0, 2.0, 2.5, 5.0)


def report_entries(schedules: int = 2, seed: int = 100, rate: float = 4000.0) -> list[dict[str, Any]]:
    """Entries for every system and fault, with the spread a real comparison shows: SQLite in
    process answering in a few ms and Kafka after a kill -9 in about 12 s, duplicates from
    none to thousands, a burst of acknowledgements after a recovery, and a capacity run per
    system far above the offered rate."""
    rng = random.Random(seed)
    runs: list[dict[str, Any]] = []
    for index in range(schedules):
        for fault in FAULTS:
            for system in SYSTEMS:
                reason = unsupported(system, fault)
                ours = is_ours(system)
                head = {"kind": "fault", "system": system, "fault": fault, "seed": seed + index, "ours": ours}
                if reason is not None:
                    runs.append({**head, "status": "n/a", "notes": [reason]})
                    continue
                duplicates = 0 if is_ours(system) else rng.choice([0, 0, 4, 4278])
                if system in ("memory", "sqlite"):
                    p50 = rng.uniform(4.3, 9.0)
                elif fault in ("broker-kill", "broker-restart"):
                    p50 = rng.uniform(5538.5, 12580.2)
                else:
                    p50 = rng.uniform(51.5, 1764.5)
                acks = [rng.randint(0, 40) for _ in range(60)]
                acks[40] = 1900  # the pipeline held back by a broker kill, acknowledged at once
                runs.append(
                    {
                        **head,
                        "status": "ok",
                        **dict.fromkeys(("failed", "ambiguous", "ambiguous_stored", "lost", "reordered"), 0),
                        "unexpected": 0,
                        "injected": 2,
                        "sent": 2000,
                        "acknowledged": 2000,
                        "stored": 2000 + duplicates,
                        "stored_unique": 2000,
                        "duplicates": duplicates,
                        "examples": {
                            "duplicates": [5] if duplicates else [],
                            "lost": [],
                            "reordered": [],
                            "failed_but_stored": [],
                        },
                        "records": 2000,
                        "rate": rate,
                        "records_per_s": round(rng.uniform(71.6, 3995.8), 1),
                        "p50_ms": round(p50, 3),
                        "p99_ms": round(p50 * 1.4, 3),
                        "p999_ms": round(p50 * 1.5, 3),
                        "seconds": 3.0,
                        "faults": [{"fault": fault, "at": 700, "applied": True, "start_s": 1.0, "end_s": 1.6}],
                        "timeline": {"bucket_s": 0.004, "acks": acks},
                        "notes": [],
                        "wall_s": 4.0,
                    }
                )
    first = {r["system"]: r for r in runs if r["status"] == "ok" and r["fault"] == "none"}
    for system in SYSTEMS:
        runs.append({**first[system], "kind": "capacity", "rate": 0.0, "records": 5000,
                     "records_per_s": round(rng.uniform(8000, 62579.8), 1)})  # fmt: skip
    return runs


def _config(rate: float = 4000.0) -> CompareConfig:
    return CompareConfig(SYSTEMS, FAULTS, records=2000, rate=rate, schedules=2, seed=100)


def _svg(page: str, chart_id: str) -> str:
    match = re.search(rf'<svg id="{chart_id}".*?</svg>', page, re.S)
    assert match, f"no chart {chart_id}"
    return match.group(0)


def _axis_labels(svg: str) -> list[float]:
    """The value axis' tick labels: right-aligned texts that are not rotated."""
    labels = re.findall(r"<text(?![^>]*transform)[^>]*text-anchor=\"end\"[^>]*>([^<]*)</text>", svg)
    return [float(label.replace(",", "")) for label in labels]


def _bar_heights(svg: str) -> dict[str, float]:
    """Each bar's height, by its tooltip's "group / series"."""
    bars = re.findall(r'<rect class="bar"[^>]*height="([\d.]+)"[^>]*><title>([^:<]*):', svg)
    return {title.strip(): float(height) for height, title in bars}


def _round_axis(labels: list[float]) -> bool:
    """0 and multiples of one round step (linear), or round values only (log)."""
    steps = {round(b - a, 9) for a, b in itertools.pairwise(labels)}
    linear = labels[0] == 0 and len(steps) == 1 and _round(steps.pop())
    return linear or all(_round(v) for v in labels)


def _round(value: float) -> bool:
    if value == 0:
        return True
    mantissa = value / 10 ** math.floor(math.log10(value))
    return any(math.isclose(mantissa, m) for m in ROUND_MANTISSAS)


@pytest.mark.parametrize("peak", [3995.8, 2996.9, 62579.8, 0.37, 1.0, 12.0, 100.0, 7.3e-3, 0.0])
def test_linear_scale_ticks_are_round_and_cover_the_peak(peak: float) -> None:
    scale = linear_scale(peak)
    steps = {round(b - a, 12) for a, b in itertools.pairwise(scale.ticks)}
    assert len(steps) == 1 and _round(steps.pop())
    assert scale.ticks[0] == 0 and scale.ticks[-1] >= peak
    assert 2 <= len(scale.ticks) <= 6
    assert all("e" not in label for label in scale.labels())
    if peak > 0:
        assert scale.fraction(peak) > 0.5  # no wasted half of the chart


def test_tick_labels() -> None:
    assert [tick_label(v, 2.5) for v in (0.0, 2.5, 5.0, 7.5)] == ["0", "2.5", "5.0", "7.5"]
    assert tick_label(12000.0, 2000.0) == "12,000"
    assert tick_label(0.01) == "0.01" and tick_label(1000.0) == "1,000"
    assert nice_step(3995.8, 4) == 1000 and nice_step(0.9, 4) == 0.25


def test_log_scale_spans_whole_decades() -> None:
    scale = log_scale([4.3, 12580.2])
    assert scale.ticks == (1.0, 10.0, 100.0, 1000.0, 10000.0, 100000.0)
    assert 0 < scale.fraction(4.3) < scale.fraction(12580.2) < 1
    narrow = log_scale([3.0, 8.0])
    assert narrow.ticks == (1.0, 2.0, 5.0, 10.0)
    assert log_scale([4278.0], floor=1.0).ticks[0] == 1.0
    assert log_scale([]).ticks == (1.0, 2.0, 5.0, 10.0)


def test_text_width_is_generous_for_wide_strings() -> None:
    assert text_width("kafka-native-transactional", 11) > text_width("memory", 11) > 0
    assert text_width("M", 10, bold=True) > text_width("M", 10)


def test_report_axes_have_round_ticks(tmp_path: pathlib.Path) -> None:
    """Regression: the ticks were the peak's quarters (3,995.8 -> 998.9, 1,997.9, 2,996.9)."""
    write_report(tmp_path, _config(), report_entries())
    page = (tmp_path / "report.html").read_text()
    for chart in ("throughput", "latency-p50", "latency-p99", "anomalies"):
        labels = _axis_labels(_svg(page, chart))
        assert len(labels) >= 3, chart
        assert _round_axis(labels), f"{chart}: {labels}"


def test_latency_is_drawn_on_a_log_scale(tmp_path: pathlib.Path) -> None:
    """Regression: on a linear scale SQLite's few ms were a sliver next to Kafka's 12 s."""
    runs = report_entries()
    write_report(tmp_path, _config(), runs)
    heights = _bar_heights(_svg((tmp_path / "report.html").read_text(), "latency-p50"))
    assert heights["sqlite / none"] >= 0.15 * max(heights.values()), heights


def test_capacity_is_shown_apart_from_the_throughput_at_the_offered_rate(tmp_path: pathlib.Path) -> None:
    """Regression: the throughput bars were the only speed shown, and at --rate they show the cap."""
    write_report(tmp_path, _config(4000.0), report_entries())
    page = (tmp_path / "report.html").read_text()
    capacity = _bar_heights(_svg(page, "capacity"))
    assert sorted(name.split(" / ")[0] for name in capacity) == sorted(SYSTEMS)
    throughput = _svg(page, "throughput")
    assert 'class="reference"' in throughput and "offered rate: 4,000 records/s" in throughput
    md = (tmp_path / "report.md").read_text()
    assert "## Capacity: no fault, no rate limit" in md and "| kafka-native | 5000 |" in md


def test_anomaly_seeds_are_listed_per_system_and_fault(tmp_path: pathlib.Path) -> None:
    runs = report_entries(schedules=3)
    rows = {(r["system"], r["fault"]): r for r in summarise(runs)}
    for (system, fault), row in rows.items():
        if row["status"] != "ok":
            continue
        mine = [r for r in runs if (r["system"], r["fault"], r["kind"]) == (system, fault, "fault")]
        expected = [r["seed"] for r in mine if r["duplicates"]]
        assert row["seeds"]["duplicates"] == expected
        assert row["runs"] == 3 and row["duplicates"] == sum(r["duplicates"] for r in mine)
    write_report(tmp_path, _config(), runs)
    md = (tmp_path / "report.md").read_text()
    assert "| runs | errors | injected | duplicates | lost | reordered | ambiguous | seeds with anomalies |" in md
    assert "| memory | lost-ack | 3 | 0 | 6 | 0 | 0 | 0 | 0 | none |" in md


def test_seeds_text_joins_consecutive_seeds() -> None:
    assert seeds_text({"duplicates": [100, 101, 102, 105], "lost": [111], "reordered": []}) == (
        "duplicates: 100-102, 105; lost: 111"
    )
    assert seeds_text({"duplicates": []}) == "none"


def test_summary_ignores_capacity_runs_and_counts_errors() -> None:
    runs = report_entries(schedules=1)
    runs.append({"kind": "fault", "system": "memory", "fault": "none", "seed": 101, "status": "error",
                 "ours": True, "notes": ["RuntimeError: no"]})  # fmt: skip
    row = next(r for r in summarise(runs) if (r["system"], r["fault"]) == ("memory", "none"))
    assert (row["runs"], row["errors"], row["sent"]) == (1, 1, 2000)
