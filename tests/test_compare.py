"""The comparison matrix (every system x none, lost-ack, producer-restart, broker-kill) and the
report rendered in headless Chromium.

For this project's systems every run must end with 0 duplicates, 0 lost and 0 reordered
records, every record acknowledged. For the native clients the counts are recorded (printed
and attached to the test as properties) and nothing is asserted about them. Kafka and Pulsar
are private brokers of this module (:class:`~idempotent.compare.Environment`), shared by
every run, so kill -9 never hits the session's brokers.
"""

from __future__ import annotations

import pathlib
import shutil
import struct
import subprocess
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from idempotent.compare import SYSTEMS, CompareConfig, Environment, is_ours, run_compare, run_one, schedule
from idempotent.compare.systems import backend_of
from idempotent.testing import browser

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


@pytest.mark.parametrize(("system", "fault"), CASES)
def test_matrix(
    compare_env: Environment, system: str, fault: str, record_property: Callable[[str, object], None]
) -> None:
    config = CompareConfig((system,), (fault,), records=RECORDS, rate=RATE, seed=SEED)
    result = run_one(compare_env, config, system, fault, SEED)
    counts = {
        k: result.get(k)
        for k in ("sent", "acknowledged", "failed", "ambiguous", "stored", "duplicates", "lost", "reordered")
    }
    print(system, fault, counts, result.get("notes"))
    for name, value in counts.items():
        record_property(name, value)
    assert result["status"] == "ok", result["notes"]
    assert [window["at"] for window in result["faults"]] == [event.at for event in schedule(fault, SEED, RECORDS)]
    assert all(window["applied"] for window in result["faults"]), result["faults"]
    assert result["injected"] >= len(result["faults"]), "a scheduled fault did not happen"
    assert result["sent"] == RECORDS
    if is_ours(system):
        assert (result["duplicates"], result["lost"], result["reordered"]) == (0, 0, 0), result["examples"]
        assert result["acknowledged"] == RECORDS and result["stored"] == RECORDS and result["unexpected"] == 0


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


def test_report_renders_in_headless_chromium(tmp_path: pathlib.Path) -> None:
    config = CompareConfig(
        ("memory", "sqlite"), ("none", "lost-ack", "producer-restart", "zombie"), records=500, rate=2000
    )
    runs: list[dict[str, Any]] = run_compare(config, tmp_path / "report")
    assert [r["status"] for r in runs] == ["ok"] * 8
    page = (tmp_path / "report" / "report.html").as_uri()
    assert (tmp_path / "report" / "report.md").read_text().count("| memory |") >= 4

    dom = _chromium_run(["--dump-dom", page], tmp_path / "profile-dom")
    assert dom.returncode == 0, dom.stderr.decode(errors="replace")[-2000:]
    html = dom.stdout.decode()
    for element in (
        '<table id="summary"',
        '<svg id="throughput"',
        '<svg id="latency-p99"',
        '<svg id="anomalies"',
        'id="timeline-0"',
    ):
        assert element in html
    assert html.count('class="bar"') >= 8 and html.count('class="fault"') >= 3
    assert html.count('<tr class="ours') >= 8

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
