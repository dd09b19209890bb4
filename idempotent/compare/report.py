"""The report: report.json (every run), report.md (tables) and report.html (tables and charts).

Tables: per (system, fault) the counts summed over the schedules with median speeds; the
anomalies per (system, fault) with the seeds of every run that had one (the table
docs/comparison.md publishes); each system's capacity (one unthrottled run without a fault);
anomalies by record id; and every run. The charts (:mod:`~idempotent.compare.charts`) show
capacity apart from the throughput at the offered rate, latency and anomalies on log scales,
and each (system, fault)'s first timeline. The page has no script and fetches nothing.
"""

from __future__ import annotations

import html
import json
import pathlib
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from .catalogue import SYSTEMS
from .charts import bar_chart, timeline_chart
from .config import CompareConfig
from .schedule import FAULTS

COUNTS = ("injected", "sent", "acknowledged", "failed", "ambiguous", "stored", "duplicates", "lost", "reordered")
ANOMALIES = ("duplicates", "lost", "reordered", "ambiguous")
MAX_RUN_ROWS = 300
SPEEDS = ("records_per_s", "p50_ms", "p99_ms", "p999_ms")
ANOMALY_COLUMNS = ("duplicates", "lost", "reordered")
SUMMARY_COLUMNS = ("system", "fault", "runs", *COUNTS, "records_per_s", "p50_ms", "p99_ms", "p999_ms")
RUN_COLUMNS = ("system", "fault", "seed", *COUNTS, "records_per_s", "p50_ms", "p99_ms", "p999_ms")
SEED_COLUMNS = ("system", "fault", "runs", "errors", "injected", *ANOMALIES, "seeds with anomalies")
CAPACITY_COLUMNS = ("system", "records", "records_per_s", "p50_ms", "p99_ms", "seconds")
#: How the report names each workload.
WORKLOAD_NAMES = {
    "produce": "produce (each record published by the system's producer)",
    "ctp": (
        "ctp (consume-transform-produce: a copy job copies an input topic to the output in transactions "
        "with its input position; counts are of the output)"
    ),
}


def _faults(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [run for run in runs if run.get("kind", "fault") == "fault"]


def _capacity(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [run for run in runs if run.get("kind") == "capacity"]


def summarise(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (system, fault) of the fault runs: counts summed over schedules, speeds
    as medians, ``errors`` the runs that could not be carried out, ``seeds`` per anomaly the
    seeds of the runs that had it."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for run in _faults(runs):
        key = (run["system"], run["fault"])
        row = rows.setdefault(
            key,
            {"system": key[0], "fault": key[1], "ours": run.get("ours", False), "runs": 0, "errors": 0,
             "status": run["status"], "notes": [], **{c: 0 for c in COUNTS}, "seeds": {a: [] for a in ANOMALIES},
             "_speed": {m: [] for m in SPEEDS}},
        )  # fmt: skip
        if run["status"] != "ok":
            row["errors"] += run["status"] == "error"
            row["status"] = run["status"] if row["runs"] == 0 else row["status"]
            row["notes"].extend(run.get("notes", []))
            continue
        row["status"] = "ok"
        row["runs"] += 1
        for count in COUNTS:
            row[count] += run.get(count, 0)
        for kind in ANOMALIES:
            if run.get(kind):
                row["seeds"][kind].append(run["seed"])
        for metric, values in row["_speed"].items():
            if run.get(metric) is not None:
                values.append(run[metric])
    out = []
    for row in rows.values():
        speed = row.pop("_speed")
        for metric, values in speed.items():
            row[metric] = round(statistics.median(values), 3) if values else None
        row["seeds with anomalies"] = seeds_text(row["seeds"])
        out.append(row)
    order_s, order_f = _order(SYSTEMS), _order(FAULTS)
    return sorted(out, key=lambda r: (order_f(r["fault"]), order_s(r["system"])))


def seeds_text(seeds: dict[str, list[int]]) -> str:
    """``duplicates: 100-119; lost: 111``: the seeds of each anomaly, consecutive ones as ranges."""
    parts = [f"{kind}: {_ranges(sorted(set(found)))}" for kind, found in seeds.items() if found]
    return "; ".join(parts) if parts else "none"


def _ranges(seeds: list[int]) -> str:
    spans: list[list[int]] = []
    for seed in seeds:
        if spans and seed == spans[-1][1] + 1:
            spans[-1][1] = seed
        else:
            spans.append([seed, seed])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}" if value >= 100 else f"{value:.3g}"
    return str(value)


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A GitHub-flavoured Markdown table; rows without a finished run show their reason."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        if row["status"] != "ok":
            cells = [row["system"], row["fault"], row["status"] + ": " + "; ".join(dict.fromkeys(row["notes"]))]
            cells += [""] * (len(columns) - len(cells))
        else:
            cells = [_fmt(row.get(c)) for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_report(
    out: pathlib.Path,
    config: CompareConfig,
    runs: Sequence[dict[str, Any]],
    timings: Sequence[tuple[str, str, float]] = (),
    elapsed: float | None = None,
) -> None:
    """Write report.json, report.md and report.html into ``out``.

    ``elapsed`` defaults to the sum of the runs' wall times (``wall_s``).
    """
    if elapsed is None:
        elapsed = sum(run.get("wall_s") or 0.0 for run in runs)
    header = {
        "config": attrs.asdict(config),
        "elapsed_s": round(elapsed, 1),
        "broker_timings": [{"service": s, "action": a, "seconds": t} for s, a, t in timings],
    }
    (out / "report.json").write_text(json.dumps({**header, "runs": list(runs)}, indent=1) + "\n")
    summary = summarise(runs)
    fault_runs = _faults(runs)
    md = [
        "# Comparison report",
        "",
        _describe(config, runs, elapsed),
        "",
        "## Per system and fault",
        "",
        "Counts are summed over the schedules; records/s and latencies (ms) are medians over them.",
        "",
        markdown_table(summary, SUMMARY_COLUMNS),
        "",
        "## Anomalies per system and fault, with their seeds",
        "",
        "Records summed over the schedules; a seed is listed under each anomaly its run had.",
        "",
        markdown_table(summary, SEED_COLUMNS),
        "",
        "## Capacity: no fault, no rate limit",
        "",
        markdown_table(_capacity(runs), CAPACITY_COLUMNS) if _capacity(runs) else "No capacity run.",
        "",
        _md_examples(fault_runs),
    ]
    if len(fault_runs) <= MAX_RUN_ROWS:
        md += ["", "## Every run", "", markdown_table(fault_runs, RUN_COLUMNS), ""]
    (out / "report.md").write_text("\n".join(md) + "\n")
    (out / "report.html").write_text(_html(config, runs, summary, elapsed))


def _describe(config: CompareConfig, runs: Sequence[dict[str, Any]], elapsed: float) -> str:
    rate = f"offered rate {config.rate:g} records/s" if config.rate else "no rate limit"
    native = (
        f" ({config.native_schedules} for the native clients)"
        if config.native_schedules is not None and config.native_schedules < config.schedules
        else ""
    )
    capacity = f"; capacity runs of {config.capacity_records} records" if config.capacity_records else ""
    return (
        f"Workload {WORKLOAD_NAMES[config.workload]}: "
        f"{config.records} records of {config.value_bytes} bytes, {rate}, {config.schedules} schedule(s){native} "
        f"from seed {config.seed}; {len(config.systems)} systems x {len(config.faults)} faults{capacity}; "
        f"{sum(1 for run in runs if run['status'] != 'n/a')} runs, {_hours(elapsed)} of run time."
    )


def _hours(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def _md_examples(runs: Sequence[dict[str, Any]]) -> str:
    lines = ["## Anomalies by record id", ""]
    found = False
    for run in runs:
        if run["status"] != "ok":
            continue
        parts = [f"{kind}: {', '.join(map(str, ids))}" for kind, ids in run["examples"].items() if ids]
        if parts:
            found = True
            lines.append(f"* {run['system']} / {run['fault']} / seed {run['seed']}: " + "; ".join(parts))
    if not found:
        lines.append("None: every stored record was stored once, in order, and every acknowledged one is stored.")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ HTML


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _html_table(rows: Sequence[dict[str, Any]], columns: Sequence[str], table_id: str) -> str:
    head = "".join(f"<th>{_esc(c)}</th>" for c in columns)
    body = []
    for row in rows:
        if row["status"] != "ok":
            reason = "; ".join(dict.fromkeys(row.get("notes", [])))
            body.append(
                f"<tr class='na'><td>{_esc(row['system'])}</td><td>{_esc(row['fault'])}</td>"
                f"<td colspan='{len(columns) - 2}'>{_esc(row['status'])}: {_esc(reason)}</td></tr>"
            )
            continue
        bad = row.get("ours") and any(row.get(k) for k in ANOMALY_COLUMNS)
        cells = "".join(
            f"<td class='{'bad' if c in ANOMALY_COLUMNS and row.get(c) else ''}'>{_esc(_fmt(row.get(c)))}</td>"
            for c in columns
        )
        body.append(f"<tr class='{'ours' if row.get('ours') else 'native'}{' fail' if bad else ''}'>{cells}</tr>")
    return f"<table id='{table_id}'><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _order(names: Sequence[str]) -> Callable[[str], int]:
    return lambda name: names.index(name) if name in names else len(names)


def _charts(config: CompareConfig, runs: Sequence[dict[str, Any]], summary: list[dict[str, Any]]) -> list[str]:
    ok = [r for r in summary if r["status"] == "ok"]
    systems = sorted({r["system"] for r in ok}, key=_order(SYSTEMS))
    faults = sorted({r["fault"] for r in ok}, key=_order(FAULTS))
    index = {(r["system"], r["fault"]): r for r in ok}
    capacity = {r["system"]: r for r in _capacity(runs) if r["status"] == "ok"}

    def metric(name: str) -> Callable[[str, str], float | None]:
        return lambda s, f: index[(s, f)][name] if (s, f) in index else None

    def anomaly(s: str, kind: str) -> float:
        return float(sum(r[kind] for r in ok if r["system"] == s))

    median = "median over the schedules"
    charts = []
    sent_fast = f"records/s of one run of {config.capacity_records} records sent as fast as the system takes them"
    if capacity:
        charts.append(
            bar_chart(
                "Capacity per system", sorted(capacity, key=_order(SYSTEMS)), ["no fault, no rate limit"],
                lambda s, _f: capacity[s]["records_per_s"], "records/s", "capacity",
                subtitle=sent_fast,
            )
        )  # fmt: skip
    offered = f"at the offered rate of {config.rate:,g} records/s" if config.rate else "without a rate limit"
    charts += [
        bar_chart(
            "Throughput under each fault", systems, faults, metric("records_per_s"), "records/s", "throughput",
            subtitle=f"acknowledged records/s {offered}, {median}",
            reference=(config.rate, f"offered rate: {config.rate:,g} records/s") if config.rate else None,
        ),
        bar_chart("Latency p50", systems, faults, metric("p50_ms"), "ms", "latency-p50", log=True,
                  subtitle=f"send to acknowledgement, {median}"),
        bar_chart("Latency p99", systems, faults, metric("p99_ms"), "ms", "latency-p99", log=True,
                  subtitle=f"send to acknowledgement, {median}"),
        bar_chart("Anomalies per system", systems, ANOMALIES, anomaly, "records", "anomalies", log=True, counts=True,
                  subtitle="records, summed over faults and schedules; 0 draws no bar"),
    ]  # fmt: skip
    return charts


def _html(config: CompareConfig, runs: Sequence[dict[str, Any]], summary: list[dict[str, Any]], elapsed: float) -> str:
    charts = _charts(config, runs, summary)
    fault_runs = _faults(runs)
    firsts: dict[tuple[str, str], dict[str, Any]] = {}
    for run in fault_runs:
        if run["status"] == "ok":
            firsts.setdefault((run["system"], run["fault"]), run)
    timelines = [timeline_chart(run, f"timeline-{i}") for i, run in enumerate(firsts.values())]
    examples = []
    for run in fault_runs:
        if run["status"] != "ok":
            continue
        for kind, ids in run["examples"].items():
            if ids:
                examples.append(
                    f"<tr><td>{_esc(run['system'])}</td><td>{_esc(run['fault'])}</td><td>{run['seed']}</td>"
                    f"<td>{_esc(kind)}</td><td>{_esc(', '.join(map(str, ids)))}</td></tr>"
                )
    example_html = (
        "<table id='examples'><thead><tr><th>system</th><th>fault</th><th>seed</th><th>anomaly</th>"
        f"<th>record ids</th></tr></thead><tbody>{''.join(examples)}</tbody></table>"
        if examples
        else "<p id='examples'>No anomaly in any run.</p>"
    )
    capacity = _capacity(runs)
    capacity_html = _html_table(capacity, CAPACITY_COLUMNS, "capacity-table") if capacity else "<p>No capacity run.</p>"
    run_table = _html_table(fault_runs, RUN_COLUMNS, "runs") if len(fault_runs) <= MAX_RUN_ROWS else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>idempotent compare report</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; font-size: 12px; margin: 0.5em 0 1.5em; }}
th, td {{ border: 1px solid #ccc; padding: 2px 6px; text-align: right; }}
th {{ background: #f0f0f0; }} td:first-child, td:nth-child(2) {{ text-align: left; }}
#seeds td:last-child {{ text-align: left; }}
tr.ours td:first-child {{ font-weight: bold; }} tr.na td {{ color: #888; text-align: left; }}
td.bad {{ background: #fbd5d5; }} tr.fail td {{ border-color: #e15759; }}
svg {{ margin: 0.5em 1em 0.5em 0; flex: none; }}
.charts, .timelines {{ display: flex; flex-wrap: wrap; align-items: flex-start; }}
</style></head><body>
<h1>idempotent compare</h1>
<p>{_esc(_describe(config, runs, elapsed))} Ours in bold. <em>ambiguous</em> = possibly persisted: the producer
could not tell whether the record was stored. <em>lost</em> = acknowledged but not stored.</p>
<h2>Capacity, throughput and latency</h2>
<div class="charts">{"".join(charts[:-1])}</div>
<h2>Anomalies</h2>
{charts[-1]}
<h3>Per system and fault, with the seeds of every anomaly</h3>
{_html_table(summary, SEED_COLUMNS, "seeds")}
<h3>Examples by record id</h3>
{example_html}
<h2>Per system and fault</h2>
{_html_table(summary, SUMMARY_COLUMNS, "summary")}
<h3>Capacity runs</h3>
{capacity_html}
<h2>Timelines (first schedule; fault windows shaded)</h2>
<div class="timelines">{"".join(timelines)}</div>
<h2>Every run</h2>
{run_table}
</body></html>
"""


__all__ = ["markdown_table", "seeds_text", "summarise", "write_report"]
