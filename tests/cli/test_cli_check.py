"""``idempotent check``: verify a SQLite database file."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import idempotent

from ..cli_helpers import run


def _database(tmp_path: Path) -> tuple[str, Path]:
    path = tmp_path / "log.db"
    url = f"sqlite:///{path}"
    with idempotent.Producer(url, "writer") as producer:
        producer.send_many("t", [b"x" * 100] * 20_000, partition=0).result(60)
    return url, path


def _damage_middle_page(path: Path) -> None:
    pages = path.stat().st_size // 4096
    with open(path, "r+b") as file:
        file.seek(pages // 2 * 4096)
        file.write(random.Random(7).randbytes(4096))


@pytest.mark.parametrize("quick", [False, True])
def test_check_passes_a_sound_file_and_fails_a_damaged_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], quick: bool
) -> None:
    url, path = _database(tmp_path)
    flags = ["--quick"] if quick else []
    pragma = "quick_check" if quick else "integrity_check"
    code, out, _ = run(capsys, "check", url, *flags)
    assert code == 0 and out.startswith(f"ok: {path} passed {pragma}")
    _damage_middle_page(path)
    code, out, _ = run(capsys, "check", url, *flags)
    # the problems SQLite lists, or the one it stopped at
    assert code == 1 and out.startswith(f"damaged: {path} failed {pragma}"), out
    assert "restore it from a backup" in out


def test_check_runs_next_to_a_writer_and_sees_its_committed_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'live.db'}"
    broker = idempotent.connect(url)
    try:
        with idempotent.Producer(broker) as producer:
            producer.send("t", b"v", partition=0).result(10)
            code, out, _ = run(capsys, "check", url)  # the writer holds its lock file meanwhile
            assert code == 0 and "passed integrity_check" in out
            producer.send("t", b"w", partition=0).result(10)  # and goes on writing
    finally:
        broker.close()


def test_check_refuses_what_is_not_a_sqlite_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "check", "kafka://127.0.0.1:9092")
    assert code == 2 and "verifies SQLite database files" in err
    code, _, err = run(capsys, "check", f"sqlite:///{tmp_path / 'missing.db'}")
    assert code == 2 and "no database file" in err
    assert not (tmp_path / "missing.db").exists()  # not created by looking
    text = tmp_path / "text.db"
    text.write_text("not a database\n" * 1000)
    code, out, _ = run(capsys, "check", f"sqlite:///{text}")
    assert code == 1 and out.startswith(f"damaged: {text}") and "file is not a database" in out
