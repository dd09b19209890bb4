"""``idempotent services``: delegated to idempotent.testing.services."""

from __future__ import annotations

import pytest

from idempotent import cli

from ..cli_helpers import run


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


def test_services_clean_removes_only_this_caches_data(
    tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two caches of the same user (two checkouts) side by side in /dev/shm: cleaning one
    leaves the other's data alone."""
    import subprocess
    import sys

    from idempotent.testing import services

    mine, theirs = tmp_path / "mine", tmp_path / "theirs"  # type: ignore[operator]
    data = {}
    for cache in (mine, theirs):
        monkeypatch.setenv("IDEMPOTENT_CACHE", str(cache))
        workdir = services._default_workdir("kafka")
        (workdir / "data").mkdir(parents=True)
        (workdir / "data" / "segment").write_bytes(b"x")
        data[cache] = workdir
    assert data[mine].parent != data[theirs].parent
    try:
        env = {**__import__("os").environ, "IDEMPOTENT_CACHE": str(mine)}
        done = subprocess.run(
            [sys.executable, "-m", "idempotent", "services", "clean", "all"], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        assert f"kafka: removed {data[mine]}" in done.stdout and "pulsar: no data to remove" in done.stdout
        assert not data[mine].parent.exists()  # the cache's directory, now empty, too
        assert (data[theirs] / "data" / "segment").read_bytes() == b"x"  # another checkout's: kept
    finally:
        import shutil

        for workdir in data.values():
            shutil.rmtree(workdir.parent, ignore_errors=True)


def test_services_clean_refuses_a_running_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    from idempotent.testing import services

    monkeypatch.setattr(services, "_running_pid", lambda spec, state: 1234)
    with pytest.raises(RuntimeError, match=r"kafka is running: stop it first \(idempotent services down kafka\)"):
        services.clean("kafka")
