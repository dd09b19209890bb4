"""``idempotent services``: delegated to idempotent.testing.services."""

from __future__ import annotations

import pytest

from idempotent import cli

from .cli_helpers import run


def test_services_without_the_module(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def missing(name: str) -> object:
        raise ModuleNotFoundError(f"No module named {name!r}")

    monkeypatch.setattr(cli.services.importlib, "import_module", missing)
    code, _, err = run(capsys, "services", "up", "kafka")
    assert code == 2
    assert err.startswith("error: the services command is not available")


def test_services_delegates_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []

    class Module:
        @staticmethod
        def main(argv: list[str]) -> int:
            seen.append(argv)
            return 3

    monkeypatch.setattr(cli.services.importlib, "import_module", lambda name: Module)
    assert cli.main(["services", "--help", "up", "-x"]) == 3
    assert seen == [["--help", "up", "-x"]]
