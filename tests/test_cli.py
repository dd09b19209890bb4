"""The ``idempotent`` entry point: --version, help, and one-line errors with exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest

import idempotent

from .cli_helpers import run


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--version")
    assert code == 0
    assert out.strip() == f"idempotent {idempotent.__version__}"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["produce", "sqlite:///{db}", "t", "--file", "{tmp}/missing.txt"], "no such file"),
        (["produce", "sqlite:///{db}", "t", "--file", "-"], "not supported"),
        (["produce", "ftp://host/x", "t", "--generate", "5"], "unknown backend URL scheme 'ftp'"),
        (["produce", "sqlite:///{tmp}/no/dir.db", "t", "--generate", "5"], "does not exist"),
        (["produce", "sqlite:///{db}", "t", "--generate", "lots"], "'lots' is not an integer"),
        (["produce", "sqlite:///{db}", "t", "--generate", "-1"], "at least 0"),
        (["produce", "sqlite:///{db}", "t", "--generate", "5", "--size", "3"], "at least 19"),
        (["produce", "sqlite:///{db}", "t"], "one of the arguments --file --generate is required"),
        (["produce", "sqlite:///{db}", "bad topic", "--generate", "5"], "invalid topic name"),
        (["produce", "sqlite:///{db}", "t", "--generate", "5", "--max-in-flight", "9999"], "max_in_flight"),
        (["tail", "sqlite:///{db}", "unknown"], "unknown topic 'unknown'"),
        (["tail", "sqlite:///{tmp}/nothing.db", "t"], "no database file"),
        (["tail", "sqlite:///{db}", "t", "--partition", "7"], "partitions 0..0"),
        (["tail", "sqlite:///{db}", "t", "--offset", "1", "--from-beginning"], "not allowed with"),
        (["stats", "sqlite:///{db}", "unknown"], "unknown topic 'unknown'"),
        (["stats", "kafka"], "unknown backend URL scheme"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_errors_are_one_line_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    db = tmp_path / "log.db"
    with idempotent.connect(f"sqlite:///{db}") as broker:
        broker.create_topic("t", 1)
    code, out, err = run(capsys, *(a.format(db=db, tmp=tmp_path) for a in argv))
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert message in err
    assert "Traceback" not in err
    assert not (tmp_path / "nothing.db").exists()


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys)
    assert code == 2
    assert "produce" in err and "tail" in err and "stats" in err
