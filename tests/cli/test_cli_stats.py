"""``idempotent stats``: the checker state of every partition."""

from __future__ import annotations

from pathlib import Path

import pytest

import idempotent

from ..cli_helpers import run


def test_stats_of_an_empty_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    idempotent.connect(url).close()
    code, out, _ = run(capsys, "stats", url)
    assert code == 0
    assert out.startswith("no topics")
    assert run(capsys, "stats", url, "--json")[1].strip() == "[]"
