"""``idempotent mirror``: the command line of copy jobs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import idempotent

from .cli_helpers import read_all, run


def _values(url: str, topic: str) -> list[bytes | None]:
    try:
        return [r.value for r in read_all(url, topic)[0]]
    except idempotent.ProducerError:  # not created yet
        return []


def test_mirror_copies_a_file_and_resumes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.txt"
    source.write_bytes(b"".join(b"r%d\n" % i for i in range(500)))
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    argv = ["mirror", "--from", f"file://{source}", "--to", dest, "--to-topic", "lines", "--job", "j"]
    code, out, err = run(capsys, *argv, "--progress-interval", "0.001")
    assert code == 0, err
    assert "copied=500 " in out and "duplicates=0" in out
    assert "mirror j: " in err and "lag (partition:offsets) 0:" in err  # lines: stderr is no terminal
    assert [r.value for r in read_all(dest, "lines")[0]] == [b"r%d" % i for i in range(500)]
    code, out, err = run(capsys, *argv, "--quiet")
    assert (code, out, err) == (0, "", "")
    code, out, err = run(capsys, *argv)
    assert code == 0 and "copied=0 " in out and "{0@" in out


def test_mirror_refuses_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    code, _, err = run(capsys, "mirror", "--from", f"file://{tmp_path}", "--to", dest, "--job", "j")
    assert code == 2 and "destination topic" in err
    code, _, err = run(capsys, "mirror", "--from", "nope://x", "--to", dest, "--topic", "t", "--job", "j")
    assert code == 2 and "unknown source URL scheme" in err
    code, _, err = run(capsys, "mirror", "--from", f"file://{tmp_path}", "--to", dest, "--to-topic", "t")
    assert code == 2 and "--job" in err


def test_follow_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_bytes(b"a\nb\n")
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    argv = ["mirror", "--from", f"file://{source}", "--to", dest, "--to-topic", "t", "--job", "j", "--follow"]
    process = subprocess.Popen(
        [sys.executable, "-m", "idempotent", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if (tmp_path / "d.db").exists() and len(_values(dest, "t")) == 2:
                break
            time.sleep(0.1)
        with source.open("ab") as handle:
            handle.write(b"c\n")
        while len(_values(dest, "t")) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert b"copied=3 " in out
    assert [r.value for r in read_all(dest, "t")[0]] == [b"a", b"b", b"c"]
