"""``idempotent compare``: arguments, exit codes and the report it writes."""

from __future__ import annotations

import json
import pathlib

import pytest

from idempotent.cli import main


def test_compare_runs_and_writes_the_report(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    code = main(
        ["compare", "--systems", "memory", "--faults", "none,lost-ack,cut", "--records", "300", "--out", str(out)]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "memory" in printed and f"report: {out / 'report.html'}" in printed
    runs = json.loads((out / "report.json").read_text())["runs"]
    assert [(r["kind"], r["system"], r["fault"], r["status"]) for r in runs] == [
        ("fault", "memory", "none", "ok"),
        ("fault", "memory", "lost-ack", "ok"),
        ("fault", "memory", "cut", "n/a"),
        ("capacity", "memory", "none", "ok"),
    ]
    for field in ("sent", "acknowledged", "failed", "ambiguous", "stored", "duplicates", "lost", "reordered"):
        assert field in runs[1]
    for field in ("records_per_s", "p50_ms", "p99_ms", "p999_ms", "seed"):
        assert field in runs[1]
    assert runs[1]["injected"] >= 2 and runs[1]["acknowledged"] == runs[1]["stored"] == 300
    assert "| memory | cut | n/a: " in (out / "report.md").read_text()


@pytest.mark.parametrize(
    "argv",
    [
        ["--systems", "cassandra", "--faults", "none"],
        ["--systems", "memory", "--faults", "meteor"],
        ["--systems", "memory", "--faults", "none", "--records", "5"],
        ["--systems", "memory"],
        ["--systems", "memory", "--faults", "none", "--capacity-records", "5"],
        ["--systems", "memory", "--faults", "none", "--native-schedules", "-1"],
    ],
)
def test_compare_refuses_bad_arguments(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", *argv]) == 2
    assert "error" in capsys.readouterr().err
