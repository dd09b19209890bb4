"""``idempotent compare --long``: the overnight comparison, run here in a tiny version through
the real command, interrupted and continued."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from idempotent.cli import build_parser
from idempotent.cli.compare import config_of
from idempotent.compare import FAULTS, LONG, SYSTEMS, CompareConfig, run_compare
from idempotent.compare.results import FILE_NAME
from idempotent.compare.systems import Identify, SystemRun
from idempotent.compare.workload import record_id
from idempotent.errors import BackendUnavailableError

TINY = ["--systems", "memory,sqlite", "--faults", "none,lost-ack,producer-restart", "--schedules", "3",
        "--records", "100", "--capacity-records", "100"]  # fmt: skip
PLANNED = 2 * 3 * 3 + 2  # systems x faults x schedules, and one capacity run per system


def test_long_presets_every_system_and_fault_and_takes_overrides() -> None:
    config, out, resume = config_of(build_parser().parse_args(["compare", "--long"]))
    assert (config.systems, config.faults) == (tuple(SYSTEMS), tuple(FAULTS))
    assert (config.schedules, config.native_schedules, config.records, config.rate, config.seed) == (
        LONG["schedules"], LONG["native_schedules"], LONG["records"], LONG["rate"], LONG["seed"],
    )  # fmt: skip
    assert out == pathlib.Path("compare-long") and resume
    args = ["compare", "--long", "--schedules", "2", "--native-schedules", "1", "--records", "300", "--out", "x"]
    config, out, resume = config_of(build_parser().parse_args(args))
    assert (config.schedules, config.native_schedules, config.records, out) == (2, 1, 300, pathlib.Path("x"))
    config, out, resume = config_of(build_parser().parse_args(["compare", "--systems", "memory", "--faults", "none"]))
    assert (config.schedules, config.native_schedules, config.records, resume) == (1, None, 2000, False)
    assert config.workload == "produce"
    args = ["compare", "--systems", "memory", "--faults", "none", "--workload", "ctp"]
    assert config_of(build_parser().parse_args(args))[0].workload == "ctp"
    with pytest.raises(SystemExit):
        build_parser().parse_args([*args[:-1], "batch"])


def _lines(path: pathlib.Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_tiny_long_run_is_interrupted_and_continues(tmp_path: pathlib.Path) -> None:
    out, scratch = tmp_path / "long", tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    command = [sys.executable, "-m", "idempotent", "compare", "--long", *TINY, "--out", str(out)]
    first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = out / FILE_NAME
    deadline = time.monotonic() + 120
    while len(_lines(results)) < 4 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    first.send_signal(signal.SIGTERM)
    stdout, stderr = first.communicate(timeout=120)
    assert first.returncode == 130, stderr
    assert "the same command continues" in stderr
    kept = _lines(results)
    assert 4 <= len(kept) < 1 + PLANNED, "interrupted too late to test a resume"
    assert f"{PLANNED} runs planned, 0 already in" in stdout
    assert (out / "report.md").exists()  # written when interrupted too

    # kill -9 in the middle of the next run: the runs finished so far stay, the next
    # invocation stops what the killed one left behind (its scratch directory) and goes on
    second = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(_lines(results)) < len(kept) + 2 and second.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # into the next run
    second.kill()
    stdout, _ = second.communicate(timeout=60)
    assert f"{PLANNED} runs planned, {len(kept) - 1} already in" in stdout
    killed = _lines(results)
    assert len(kept) + 2 <= len(killed) < 1 + PLANNED, "killed too late to test a resume"
    assert (out / ".compare-scratch").exists() and len(list(scratch.iterdir())) == 1

    last = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert last.returncode == 0, last.stderr
    assert f"{PLANNED} runs planned, {len(killed) - 1} already in" in last.stdout
    assert last.stdout.count(" rec/s ") == PLANNED - (len(killed) - 1)  # only the missing runs were carried out
    assert f"[{PLANNED}/{PLANNED}]" in last.stdout
    lines = _lines(results)
    assert lines[: len(killed)] == killed  # the finished runs were kept as they were
    entries = [json.loads(line) for line in lines[1:]]
    keys = [(e["kind"], e["system"], e["fault"], e["seed"]) for e in entries]
    assert len(keys) == len(set(keys)) == PLANNED
    assert all(e["status"] == "ok" and (e["duplicates"], e["lost"], e["reordered"]) == (0, 0, 0) for e in entries)
    assert sum(e["kind"] == "capacity" for e in entries) == 2

    report = json.loads((out / "report.json").read_text())
    assert len(report["runs"]) == PLANNED
    md = (out / "report.md").read_text()
    assert "| memory | lost-ack | 3 | 0 |" in md and "seeds with anomalies" in md
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.json", "report.md", "runs.jsonl"]
    assert list(scratch.iterdir()) == []  # the private brokers' scratch directories are gone too

    third = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert third.returncode == 0 and f"{PLANNED} runs planned, {PLANNED} already in" in third.stdout


def test_a_results_file_of_other_records_is_not_continued(tmp_path: pathlib.Path) -> None:
    from idempotent.cli import main

    out = tmp_path / "long"
    args = ["compare", "--long", "--systems", "memory", "--faults", "none", "--schedules", "1", "--records", "50",
            "--capacity-records", "0", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    before = (out / FILE_NAME).read_bytes()
    assert main([*args[:-4], "--records", "60", "--capacity-records", "0", "--out", str(out)]) == 2
    assert (out / FILE_NAME).read_bytes() == before


def test_a_broker_unreachable_after_its_fault_fails_that_run_only(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a private Pulsar not back from a restart when its run read the records back
    raised BackendUnavailableError out of the whole long run, 3,027 runs into 3,612. That run
    is an error (carried out again on resume); the others go on."""
    real = SystemRun.read_back

    def unreachable(self: SystemRun, timeout: float = 60.0, identify: Identify = record_id) -> list[int | None]:
        if self.system == "sqlite":
            raise BackendUnavailableError("pulsar: cannot connect to 127.0.0.1:1 within the connect timeout of 10 s")
        return real(self, timeout, identify)

    monkeypatch.setattr(SystemRun, "read_back", unreachable)
    config = CompareConfig(systems=("memory", "sqlite"), faults=("none",), records=50, capacity_records=0, seed=100)
    out = tmp_path / "out"
    first = {(r["system"], r["status"]) for r in run_compare(config, out, resume=True)}
    assert first == {("memory", "ok"), ("sqlite", "error")}
    (failed,) = [json.loads(line) for line in _lines(out / FILE_NAME)[1:] if '"sqlite"' in line]
    assert "BackendUnavailableError: pulsar: cannot connect" in failed["notes"][0]
    monkeypatch.setattr(SystemRun, "read_back", real)
    lines: list[str] = []
    again = run_compare(config, out, progress=lines.append, resume=True)
    assert "2 runs planned, 1 already in" in lines[0]
    assert {(r["system"], r["status"]) for r in again} == {("memory", "ok"), ("sqlite", "ok")}
