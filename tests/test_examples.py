"""Every example runs against the embedded default."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quickstart(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py"), str(tmp_path / "q.db")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "resend of sequences 3..4: DUPLICATE at original offset 3" in out
    assert "the log holds 5 records" in out
    assert "epoch 1" in out
