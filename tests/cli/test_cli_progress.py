"""Progress reporting (idempotent/cli/progress.py): a bar on a terminal, else a line every few seconds."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import pytest

from idempotent.cli.progress import Progress

from ..cli_helpers import run


def test_lines_count_done_work_and_rate() -> None:
    now = [100.0]
    progress = Progress("orders", total=200, initial=50, stream=io.StringIO(), terminal=False, clock=lambda: now[0])
    try:
        progress.update(30)
        now[0] += 4.0
        progress.update(10, detail="lag 0:3")
        assert progress.line() == "orders: 90/200 records (45.0%), 10 records/s, 4 s elapsed, lag 0:3"
        unknown = Progress("job", stream=io.StringIO(), terminal=False, enabled=False)
        unknown.update(7)
        assert unknown.line().startswith("job: 7 records, ")
    finally:
        progress.close()


def test_a_rate_window_shows_the_current_rate_not_the_average() -> None:
    now = [0.0]
    out = io.StringIO()
    progress = Progress("m", interval=1000, stream=out, terminal=False, clock=lambda: now[0], rate_window=10)
    try:
        progress.update(1000)
        now[0] = 5.0
        assert progress.line() == "m: 1000 records, 200 records/s (last 5 s), 5 s elapsed"  # from the start
        now[0] = 10.0
        assert progress.line().startswith("m: 1000 records, 100 records/s (last 10 s),")
        now[0] = 20.0  # nothing for 10 s: the average would say 50 records/s
        assert progress.line().startswith("m: 1000 records, 0 records/s (last 10 s),")
        progress.update(600)
        now[0] = 23.0
        assert progress.line().startswith("m: 1600 records, 46 records/s (last 13 s),")  # since the line at 10 s
    finally:
        progress.close()


def test_lines_come_every_interval_until_closed() -> None:
    out = io.StringIO()
    with Progress("t", total=10, interval=0.05, stream=out, terminal=False) as progress:
        progress.update(4)
        deadline = time.monotonic() + 10
        while progress.lines < 2:
            assert time.monotonic() < deadline, "no progress lines"
            time.sleep(0.01)
    printed = progress.lines
    time.sleep(0.15)
    assert progress.lines == printed  # closed: no more lines
    assert out.getvalue().splitlines()[0].startswith("t: 4/10 records (40.0%), ")


def test_a_terminal_gets_a_bar_and_disabled_progress_prints_nothing() -> None:
    out = io.StringIO()
    with Progress("t", total=10, stream=out, terminal=True) as progress:
        progress.update(10)
    assert "100%" in out.getvalue() and "rec/s" in out.getvalue()
    quiet = io.StringIO()
    with Progress("t", total=10, interval=0.01, stream=quiet, terminal=False, enabled=False) as progress:
        progress.update(10)
        time.sleep(0.05)
    assert quiet.getvalue() == "" and progress.lines == 0


def test_produce_prints_progress_lines_when_stderr_is_not_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    code, out, err = run(capsys, "produce", url, "t", "--generate", "30000", "--progress-interval", "0.02")
    assert code == 0, err
    lines = err.splitlines()
    assert lines and all(
        re.fullmatch(r"t: \d+/30000 records \(\d+\.\d%\), \d+ records/s, \d+ s elapsed", x) for x in lines
    )
    assert "sent=30000" in out
    code, out, err = run(capsys, "produce", url, "u", "--generate", "30000", "--progress-interval", "0.02", "--quiet")
    assert (code, out, err) == (0, "", "")
