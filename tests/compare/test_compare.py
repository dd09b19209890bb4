"""The comparison matrix (every system x none, lost-ack, producer-restart, broker-kill) and the
report rendered in headless Chromium.

For this project's systems every run must end with 0 duplicates, 0 lost and 0 reordered
records, every record acknowledged; the same for the consume-transform-produce workload
(``--workload ctp``) under kills of the copy job, in its output. For the native clients the counts are recorded (printed
and attached to the test as properties) and nothing is asserted about them. Kafka and Pulsar
are private brokers of this module (:class:`~idempotent.compare.Environment`), shared by
every run, so kill -9 never hits the session's brokers.
"""

from __future__ import annotations

import html
import json
import pathlib
import re
import shutil
import struct
import subprocess
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from idempotent.compare import FAULTS, SYSTEMS, CompareConfig, Environment, is_ours, run_compare, run_one, schedule
from idempotent.compare.catalogue import backend_of
from idempotent.compare.report import write_report
from idempotent.testing import browser

from .test_compare_report import report_entries

MATRIX_FAULTS = ("none", "lost-ack", "producer-restart", "broker-kill")
RECORDS = 2000
RATE = 4000.0
SEED = 7


@pytest.fixture(scope="module")
def compare_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Environment]:
    env = Environment(tmp_path_factory.mktemp("compare"))
    yield env
    print("private broker timings:", env.timings)
    env.close()


def _marks(system: str) -> list[pytest.MarkDecorator]:
    backend = backend_of(system)
    return [getattr(pytest.mark, backend)] if backend in ("kafka", "pulsar") else []


CASES = [
    pytest.param(system, fault, marks=_marks(system), id=f"{system}-{fault}")
    for fault in MATRIX_FAULTS
    for system in SYSTEMS
]


def _assert_run(result: dict[str, Any], records: int, record_property: Callable[[str, object], None]) -> None:
    """Every scheduled fault happened, every record was sent; for this project's systems
    every record is acknowledged and stored once, in order. The counts become test properties
    (prefixed with the system when several systems run in one test)."""
    system, fault = result["system"], result["fault"]
    counts = {
        k: result.get(k)
        for k in ("sent", "acknowledged", "failed", "ambiguous", "stored", "duplicates", "lost", "reordered")
    }
    print(result.get("workload"), system, fault, counts, result.get("notes"))
    for name, value in counts.items():
        record_property(f"{system}-{fault}-{name}", value)
    assert result["status"] == "ok", result["notes"]
    assert [window["at"] for window in result["faults"]] == [event.at for event in schedule(fault, SEED, records)]
    assert all(window["applied"] for window in result["faults"]), result["faults"]
    assert result["injected"] >= len(result["faults"]), "a scheduled fault did not happen"
    assert result["sent"] == records
    if is_ours(system):
        assert (result["duplicates"], result["lost"], result["reordered"]) == (0, 0, 0), result["examples"]
        assert result["acknowledged"] == records and result["stored"] == records and result["unexpected"] == 0


@pytest.mark.parametrize(("system", "fault"), CASES)
def test_matrix(
    compare_env: Environment, system: str, fault: str, record_property: Callable[[str, object], None]
) -> None:
    config = CompareConfig((system,), (fault,), records=RECORDS, rate=RATE, seed=SEED)
    _assert_run(run_one(compare_env, config, system, fault, SEED), RECORDS, record_property)


# ------------------------------------------------------------------------------ consume-transform-produce

CTP_RECORDS = 1000


def test_ctp_on_memory_and_sqlite_under_kills_copies_every_record_once(
    compare_env: Environment, tmp_path: pathlib.Path, record_property: Callable[[str, object], None]
) -> None:
    """The copy job is killed inside an open transaction (sqlite: kill -9 of its process,
    memory: its instance dies in process) and restarted from its committed input position;
    the output holds every input record once, transformed. Systems and faults without ctp are
    reported n/a with their reason, and the results file and the report say ctp ran."""
    config = CompareConfig(("memory", "sqlite", "pulsar"), ("producer-restart", "broker-kill", "lost-ack"),
                           records=CTP_RECORDS, rate=RATE, seed=SEED, capacity_records=0, workload="ctp")  # fmt: skip
    out = tmp_path / "ctp"
    runs = run_compare(config, out, env=compare_env)
    assert {r["workload"] for r in runs} == {"ctp"}
    ran = [r for r in runs if r["status"] != "n/a"]
    assert sorted((r["system"], r["fault"]) for r in ran) == [
        ("memory", "broker-kill"), ("memory", "producer-restart"),
        ("sqlite", "broker-kill"), ("sqlite", "producer-restart"),
    ]  # fmt: skip
    for result in ran:
        _assert_run(result, CTP_RECORDS, record_property)
    reasons = {(r["system"], r["fault"]): r["notes"][0] for r in runs if r["status"] == "n/a"}
    assert "transactions" in reasons[("pulsar", "producer-restart")]
    assert "produce workload" in reasons[("memory", "lost-ack")]
    assert json.loads((out / "runs.jsonl").read_text().splitlines()[0])["workload"] == "ctp"
    assert "Workload ctp (consume-transform-produce" in (out / "report.md").read_text()
    assert json.loads((out / "report.json").read_text())["config"]["workload"] == "ctp"


@pytest.mark.kafka
def test_ctp_on_kafka_ours_and_native_transactional_under_a_kill(
    compare_env: Environment, record_property: Callable[[str, object], None]
) -> None:
    """kill -9 of the copy job inside an open transaction, on the private Kafka: ours resumes
    from ``committed_positions()``, confluent-kafka from its group's offsets committed with
    ``send_offsets_to_transaction``. Ours must copy every record once; the native counts
    are recorded."""
    for system in ("kafka", "kafka-native-transactional"):
        config = CompareConfig((system,), ("producer-restart",), records=CTP_RECORDS, rate=RATE, seed=SEED,
                               capacity_records=0, workload="ctp")  # fmt: skip
        _assert_run(run_one(compare_env, config, system, "producer-restart", SEED), CTP_RECORDS, record_property)


# ------------------------------------------------------------------------------ rendering


def _png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB/RGBA non-interlaced PNG (what Chromium writes) into rows."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks, header = 8, [], b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            chunks.append(body)
        pos += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and color in (2, 6) and header[12] == 0
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(b"".join(chunks))
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(bytes(line if bpp == 3 else b"".join(line[x : x + 3] for x in range(0, stride, 4))))
        prev = line
    return width, height, rows


def _chromium() -> str:
    return browser.chromium()


def _chromium_run(args: list[str], profile: pathlib.Path) -> subprocess.CompletedProcess[bytes]:
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
    ]  # fmt: skip
    return subprocess.run([_chromium(), *flags, *args], capture_output=True, timeout=120, check=False)


#: Injected into a copy of the report (the report itself has no script): lists every text
#: that leaves its chart's box, every two unrotated texts of a chart that overlap, and every
#: table cell or heading whose text is wider than its box.
OVERFLOW_CHECK = """
(function () {
  const problems = [];
  const slack = 0.5;
  const name = (el) => (el.textContent || "").trim().slice(0, 60);
  const box = (r) => `[${r.left.toFixed(1)}, ${r.top.toFixed(1)}, ${r.right.toFixed(1)}, ${r.bottom.toFixed(1)}]`;
  for (const svg of document.querySelectorAll("svg")) {
    const outer = svg.getBoundingClientRect();
    const flat = [];
    for (const text of svg.querySelectorAll("text")) {
      const r = text.getBoundingClientRect();
      if (r.left < outer.left - slack || r.right > outer.right + slack ||
          r.top < outer.top - slack || r.bottom > outer.bottom + slack) {
        problems.push(`${svg.id}: "${name(text)}" ${box(r)} overflows its chart ${box(outer)}`);
      }
      if (!text.hasAttribute("transform")) flat.push([text, r]);
    }
    for (let i = 0; i < flat.length; i++) {
      for (let j = i + 1; j < flat.length; j++) {
        const [a, ra] = flat[i], [b, rb] = flat[j];
        const w = Math.min(ra.right, rb.right) - Math.max(ra.left, rb.left);
        const h = Math.min(ra.bottom, rb.bottom) - Math.max(ra.top, rb.top);
        if (w > 1 && h > 1) problems.push(`${svg.id}: "${name(a)}" ${box(ra)} overlaps "${name(b)}" ${box(rb)}`);
      }
    }
  }
  for (const cell of document.querySelectorAll("th, td, h1, h2, h3, p")) {
    if (cell.scrollWidth > cell.clientWidth + 1) {
      problems.push(`${cell.tagName}: "${name(cell)}" is wider than its box`);
    }
  }
  const out = document.createElement("pre");
  out.id = "overflow-check";
  out.textContent = JSON.stringify(problems);
  document.body.appendChild(out);
})();
"""


def _overflows(report: pathlib.Path, profile: pathlib.Path) -> list[str]:
    """What :data:`OVERFLOW_CHECK` finds in ``report`` rendered by headless Chromium."""
    checked = report.with_name("checked.html")
    checked.write_text(report.read_text().replace("</body>", f"<script>{OVERFLOW_CHECK}</script></body>"))
    dom = _chromium_run(["--window-size=1400,2600", "--dump-dom", checked.as_uri()], profile)
    checked.unlink()
    assert dom.returncode == 0, dom.stderr.decode(errors="replace")[-2000:]
    found = re.search(r'<pre id="overflow-check">(.*?)</pre>', dom.stdout.decode(), re.S)
    assert found, "the overflow check did not run"
    problems: list[str] = json.loads(html.unescape(found.group(1)))
    return problems


def test_report_renders_in_headless_chromium(tmp_path: pathlib.Path) -> None:
    faults = ("none", "lost-ack", "duplicate-request", "broker-kill", "producer-restart", "zombie")
    config = CompareConfig(("memory", "sqlite"), faults, records=500, rate=2000, capacity_records=2000)
    out = tmp_path / "report"
    runs: list[dict[str, Any]] = run_compare(config, out)
    assert [r["status"] for r in runs] == ["ok"] * 14
    capacity = {r["system"]: r["records_per_s"] for r in runs if r["kind"] == "capacity"}
    assert sorted(capacity) == ["memory", "sqlite"] and min(capacity.values()) > config.rate
    # nothing but the report and the results file is left in --out
    assert [p.name for p in out.iterdir() if p.is_dir()] == []
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.json", "report.md", "runs.jsonl"]
    page = (out / "report.html").as_uri()
    assert (out / "report.md").read_text().count("| memory |") >= 6

    dom = _chromium_run(["--dump-dom", page], tmp_path / "profile-dom")
    assert dom.returncode == 0, dom.stderr.decode(errors="replace")[-2000:]
    html_text = dom.stdout.decode()
    for element in (
        '<table id="summary"',
        '<table id="seeds"',
        '<svg id="capacity"',
        '<svg id="throughput"',
        '<svg id="latency-p99"',
        '<svg id="anomalies"',
        'id="timeline-0"',
    ):
        assert element in html_text
    assert html_text.count('class="bar"') >= 14 and html_text.count('class="fault"') >= 5
    assert html_text.count('<tr class="ours') >= 12 and 'class="reference"' in html_text
    assert "<script" not in (out / "report.html").read_text()

    problems = _overflows(out / "report.html", tmp_path / "profile-check")
    assert problems == [], "\n".join(problems)
    # every system and fault, thousands of duplicates, seconds of latency, a burst of acknowledgements
    wide = tmp_path / "wide"
    wide.mkdir()
    write_report(wide, CompareConfig(SYSTEMS, FAULTS, rate=4000, schedules=2, seed=100), report_entries())
    problems = _overflows(wide / "report.html", tmp_path / "profile-wide")
    assert problems == [], "\n".join(problems)

    shot = tmp_path / "report.png"
    result = _chromium_run([f"--screenshot={shot}", "--window-size=1400,2600", page], tmp_path / "profile-shot")
    assert result.returncode == 0 and shot.exists(), result.stderr.decode(errors="replace")[-2000:]
    width, height, rows = _png_pixels(shot.read_bytes())
    assert (width, height) == (1400, 2600)
    bar_blue = bytes.fromhex("4e79a7")
    painted = sum(row.count(bar_blue) for row in rows)  # counts byte-aligned and unaligned hits alike
    assert painted > 2000, f"only {painted} pixels of the bar colour: the plots did not render"
    copy = pathlib.Path("/tmp/idempotent-compare-report.png")
    shutil.copy(shot, copy)
