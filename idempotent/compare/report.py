"""The report: report.json (every run), report.md (tables) and report.html (tables and plots).

The plots are SVG drawn here (no plotting library, no script, nothing fetched), so the page
renders offline: throughput and latency per system, the timeline of each run with its fault
windows shaded, anomaly counts as bars, and concrete anomalies by record id.
"""

from __future__ import annotations

import html
import json
import pathlib
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from .runner import CompareConfig
from .schedule import FAULTS
from .systems import SYSTEMS

COUNTS = ("injected", "sent", "acknowledged", "failed", "ambiguous", "stored", "duplicates", "lost", "reordered")
ANOMALIES = ("duplicates", "lost", "reordered", "ambiguous")
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")
MAX_RUN_ROWS = 300
SPEEDS = ("records_per_s", "p50_ms", "p99_ms", "p999_ms")
ANOMALY_COLUMNS = ("duplicates", "lost", "reordered")


def summarise(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (system, fault): counts summed over schedules, speeds as medians."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for run in runs:
        key = (run["system"], run["fault"])
        row = rows.setdefault(
            key,
            {"system": key[0], "fault": key[1], "ours": run.get("ours", False), "runs": 0, "status": run["status"],
             "notes": [], **{c: 0 for c in COUNTS}, "_speed": {m: [] for m in SPEEDS}},
        )  # fmt: skip
        if run["status"] != "ok":
            row["status"] = run["status"] if row["runs"] == 0 else row["status"]
            row["notes"].extend(run.get("notes", []))
            continue
        row["status"] = "ok"
        row["runs"] += 1
        for count in COUNTS:
            row[count] += run.get(count, 0)
        for metric, values in row["_speed"].items():
            if run.get(metric) is not None:
                values.append(run[metric])
    out = []
    for row in rows.values():
        speed = row.pop("_speed")
        for metric, values in speed.items():
            row[metric] = round(statistics.median(values), 3) if values else None
        out.append(row)
    return out


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}" if value >= 100 else f"{value:.3g}"
    return str(value)


SUMMARY_COLUMNS = ("system", "fault", "runs", *COUNTS, "records_per_s", "p50_ms", "p99_ms", "p999_ms")
RUN_COLUMNS = ("system", "fault", "seed", *COUNTS, "records_per_s", "p50_ms", "p99_ms", "p999_ms")


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A GitHub-flavoured Markdown table; n/a and error rows show their reason."""
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
    elapsed: float = 0.0,
) -> None:
    """Write report.json, report.md and report.html into ``out``."""
    header = {
        "config": attrs.asdict(config),
        "elapsed_s": round(elapsed, 1),
        "broker_timings": [{"service": s, "action": a, "seconds": t} for s, a, t in timings],
    }
    (out / "report.json").write_text(json.dumps({**header, "runs": list(runs)}, indent=1) + "\n")
    summary = summarise(runs)
    md = [
        "# Comparison report",
        "",
        _describe(config, elapsed),
        "",
        "## Per system and fault",
        "",
        "Counts are summed over the schedules; records/s and latencies (ms) are medians over them.",
        "",
        markdown_table(summary, SUMMARY_COLUMNS),
        "",
        _md_examples(runs),
    ]
    if len(runs) <= MAX_RUN_ROWS:
        md += ["", "## Every run", "", markdown_table(list(runs), RUN_COLUMNS), ""]
    (out / "report.md").write_text("\n".join(md) + "\n")
    (out / "report.html").write_text(_html(config, runs, summary, elapsed))


def _describe(config: CompareConfig, elapsed: float) -> str:
    rate = f"{config.rate:g} records/s" if config.rate else "unlimited rate"
    return (
        f"{config.records} records of {config.value_bytes} bytes, {rate}, {config.schedules} schedule(s) from seed "
        f"{config.seed}; {len(config.systems)} systems x {len(config.faults)} faults; {elapsed:.0f} s in total."
    )


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


# ------------------------------------------------------------------------------- SVG


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def bar_chart(
    title: str,
    groups: Sequence[str],
    series: Sequence[str],
    value: Callable[[str, str], float | None],
    unit: str,
    chart_id: str,
) -> str:
    """Grouped bars: one group per ``groups`` entry, one bar per ``series`` entry."""
    width, height, left, bottom, top = max(640, 60 + len(groups) * (len(series) * 12 + 18)), 320, 70, 110, 30
    values = [[value(g, s) for s in series] for g in groups]
    peak = max([v for row in values for v in row if v is not None] or [0]) or 1.0
    plot_h = height - bottom - top
    group_w = (width - left - 10) / max(1, len(groups))
    bar_w = max(2.0, (group_w - 8) / max(1, len(series)))
    parts = [
        f'<svg id="{chart_id}" class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height + 20 * ((len(series) + 5) // 6)}">',
        f'<text x="{left}" y="18" font-weight="bold">{_esc(title)}</text>',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{width - 10}" y2="{top + plot_h}" stroke="#333"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#333"/>',
    ]
    for tick in range(5):
        y = top + plot_h - plot_h * tick / 4
        parts.append(
            f'<text x="{left - 4}" y="{y + 4}" text-anchor="end" font-size="10">{_fmt(peak * tick / 4)}</text>'
        )
        parts.append(f'<line x1="{left}" y1="{y}" x2="{width - 10}" y2="{y}" stroke="#ddd"/>')
    parts.append(
        f'<text x="12" y="{top + plot_h / 2}" font-size="11" transform="rotate(-90 12 {top + plot_h / 2})">'
        f"{_esc(unit)}</text>"
    )
    for gi, group in enumerate(groups):
        x0 = left + gi * group_w + 4
        for si, v in enumerate(values[gi]):
            if v is None:
                continue
            h = plot_h * v / peak
            parts.append(
                f'<rect class="bar" x="{x0 + si * bar_w:.1f}" y="{top + plot_h - h:.1f}" width="{bar_w - 1:.1f}" '
                f'height="{max(h, 0.5):.1f}" fill="{PALETTE[si % len(PALETTE)]}"><title>{_esc(group)} / '
                f"{_esc(series[si])}: {_fmt(v)} {_esc(unit)}</title></rect>"
            )
        cx = x0 + group_w / 2
        parts.append(
            f'<text x="{cx:.1f}" y="{top + plot_h + 12}" font-size="10" text-anchor="end" '
            f'transform="rotate(-35 {cx:.1f} {top + plot_h + 12})">{_esc(group)}</text>'
        )
    for si, name in enumerate(series):
        lx, ly = left + (si % 6) * 120, height - 4 + 20 * (si // 6)
        parts.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{PALETTE[si % len(PALETTE)]}"/>')
        parts.append(f'<text x="{lx + 14}" y="{ly}" font-size="11">{_esc(name)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def timeline_chart(run: dict[str, Any], chart_id: str) -> str:
    """Acknowledgements per time bucket, with each fault window shaded."""
    width, height, left, top, bottom = 420, 150, 40, 22, 24
    acks = run["timeline"]["acks"]
    bucket = run["timeline"]["bucket_s"] or 1.0
    span = bucket * len(acks)
    peak = max(acks) or 1
    plot_w, plot_h = width - left - 8, height - top - bottom
    parts = [
        f'<svg id="{chart_id}" class="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">',
        f'<text x="{left}" y="14" font-size="12" font-weight="bold">{_esc(run["system"])} · {_esc(run["fault"])} '
        f"· seed {run['seed']}</text>",
    ]
    for window in run.get("faults", []):
        if not window.get("applied"):
            continue
        x = left + plot_w * window["start_s"] / span
        w = max(2.0, plot_w * (window["end_s"] - window["start_s"]) / span)
        parts.append(
            f'<rect class="fault" x="{x:.1f}" y="{top}" width="{w:.1f}" height="{plot_h}" fill="#e15759" '
            f'fill-opacity="0.25"><title>{_esc(window["fault"])} at {window["start_s"]:.2f}-{window["end_s"]:.2f} s'
            "</title></rect>"
        )
    points = " ".join(
        f"{left + plot_w * (i + 0.5) / len(acks):.1f},{top + plot_h - plot_h * a / peak:.1f}"
        for i, a in enumerate(acks)
    )
    parts += [
        f'<polyline points="{points}" fill="none" stroke="#4e79a7" stroke-width="1.5"/>',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#333"/>',
        f'<text x="{left - 3}" y="{top + 8}" font-size="9" text-anchor="end">{_fmt(peak / bucket)}</text>',
        f'<text x="{left - 3}" y="{top + plot_h}" font-size="9" text-anchor="end">0</text>',
        f'<text x="{left + plot_w}" y="{height - 8}" font-size="9" text-anchor="end">{span:.1f} s</text>',
        f'<text x="{left}" y="{height - 8}" font-size="9">acks/s</text>',
        "</svg>",
    ]
    return "\n".join(parts)


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


def _html(config: CompareConfig, runs: Sequence[dict[str, Any]], summary: list[dict[str, Any]], elapsed: float) -> str:
    ok = [r for r in summary if r["status"] == "ok"]
    systems = sorted({r["system"] for r in ok}, key=_order(SYSTEMS))
    faults = sorted({r["fault"] for r in ok}, key=_order(FAULTS))
    index = {(r["system"], r["fault"]): r for r in ok}

    def metric(name: str) -> Callable[[str, str], float | None]:
        return lambda s, f: index[(s, f)][name] if (s, f) in index else None

    def anomaly(s: str, kind: str) -> float:
        return float(sum(r[kind] for r in ok if r["system"] == s))

    speed = "median over schedules"
    charts = [
        bar_chart(f"Throughput per system (records/s, {speed})", systems, faults, metric("records_per_s"), "records/s",
                  "throughput"),
        bar_chart(f"Latency per system: p50 (ms, {speed})", systems, faults, metric("p50_ms"), "ms", "latency-p50"),
        bar_chart(f"Latency per system: p99 (ms, {speed})", systems, faults, metric("p99_ms"), "ms", "latency-p99"),
        bar_chart("Anomalies per system (records, summed over faults and schedules)", systems, ANOMALIES, anomaly,
                  "records", "anomalies"),
    ]  # fmt: skip
    firsts: dict[tuple[str, str], dict[str, Any]] = {}
    for run in runs:
        if run["status"] == "ok":
            firsts.setdefault((run["system"], run["fault"]), run)
    timelines = [timeline_chart(run, f"timeline-{i}") for i, run in enumerate(firsts.values())]
    examples = []
    for run in runs:
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
    run_table = _html_table(list(runs), RUN_COLUMNS, "runs") if len(runs) <= MAX_RUN_ROWS else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>idempotent compare report</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; font-size: 12px; margin: 0.5em 0 1.5em; }}
th, td {{ border: 1px solid #ccc; padding: 2px 6px; text-align: right; }}
th {{ background: #f0f0f0; }} td:first-child, td:nth-child(2) {{ text-align: left; }}
tr.ours td:first-child {{ font-weight: bold; }} tr.na td {{ color: #888; text-align: left; }}
td.bad {{ background: #fbd5d5; }} tr.fail td {{ border-color: #e15759; }}
svg {{ margin: 0.5em 1em 0.5em 0; font-family: sans-serif; }} .timelines {{ display: flex; flex-wrap: wrap; }}
</style></head><body>
<h1>idempotent compare</h1>
<p>{_esc(_describe(config, elapsed))} Ours in bold. <em>ambiguous</em> = possibly persisted: the producer
could not tell whether the record was stored. <em>lost</em> = acknowledged but not stored.</p>
<h2>Per system and fault</h2>
{_html_table(summary, SUMMARY_COLUMNS, "summary")}
<h2>Throughput and latency</h2>
{charts[0]}
{charts[1]}
{charts[2]}
<h2>Anomalies</h2>
{charts[3]}
<h3>Examples by record id</h3>
{example_html}
<h2>Timelines (first schedule; fault windows shaded)</h2>
<div class="timelines">{"".join(timelines)}</div>
<h2>Every run</h2>
{run_table}
</body></html>
"""


__all__ = ["bar_chart", "markdown_table", "summarise", "timeline_chart", "write_report"]
