"""Spark URLs resolved once, on the driver, and how tasks reach them (idempotent/spark/_host.py)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from idempotent.errors import ConfigError
from idempotent.spark._host import check_reachable, executor_url, machine, machine_bound, resolve_url, stop_host
from idempotent.spark._options import Options

pytestmark = pytest.mark.spark


@pytest.fixture
def hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "hosts"
    monkeypatch.setenv("IDEMPOTENT_SPARK_HOSTS", str(path))
    return path


def test_the_driver_makes_a_relative_sqlite_path_absolute_from_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_url("sqlite:///rel.db") == f"sqlite:///{tmp_path}/rel.db"
    assert resolve_url("sqlite:///sub/rel.db?check=off") == f"sqlite:///{tmp_path}/sub/rel.db?check=off"
    assert resolve_url("sqlite:////abs/x.db") == "sqlite:////abs/x.db"
    assert resolve_url("kafka://k:9092") == "kafka://k:9092"
    options = Options({"url": "sqlite:///rel.db", "topic": "t"})
    assert (options.url, options.machine) == (f"sqlite:///{tmp_path}/rel.db", machine())
    copy = pickle.loads(pickle.dumps(options))  # what tasks get
    assert (copy.url, copy.machine) == (options.url, options.machine)
    with pytest.raises(ConfigError, match="non-empty string"):
        resolve_url("")


def test_what_only_the_drivers_machine_serves() -> None:
    assert machine_bound("sqlite:////data/x.db") == "the SQLite file '/data/x.db'"
    assert machine_bound("memory://m") == "an in-memory broker"
    for url in ("idem://127.0.0.1:7650", "idem://localhost:1", "idems://[::1]:7650"):
        assert machine_bound(url) is not None, url
    for url in ("idem://10.1.2.3:7650", "idems://broker.internal:7650", "kafka://k:9092", "pulsar://p:6650"):
        assert machine_bound(url) is None, url


@pytest.mark.parametrize("url", ["sqlite:///{tmp}/driver.db", "memory://shared", "idem://127.0.0.1:7650"])
def test_a_task_on_another_machine_is_refused_naming_the_url_and_what_to_do(
    url: str, tmp_path: Path, hosts: Path
) -> None:
    url = url.format(tmp=tmp_path)
    with pytest.raises(ConfigError) as refused:
        executor_url(url, "driver-host/boot")
    message = str(refused.value)
    assert url in message and "driver-host/boot" in message and machine() in message
    assert "idempotent broker --backend" in message and "idem://" in message
    assert pickle.loads(pickle.dumps(refused.value)).args == refused.value.args  # Spark ships it
    assert not (tmp_path / "driver.db").exists()  # nothing created
    assert not hosts.exists() or not list(hosts.glob("*.run"))  # no broker server started


def test_a_task_never_creates_the_sqlite_file(tmp_path: Path, hosts: Path) -> None:
    url = f"sqlite:///{tmp_path}/gone.db"
    with pytest.raises(ConfigError, match="does not exist for this task") as refused:
        executor_url(url, machine())
    assert str(tmp_path / "gone.db") in str(refused.value)
    assert not (tmp_path / "gone.db").exists()


def test_a_task_on_the_drivers_machine_reaches_the_drivers_host(tmp_path: Path, hosts: Path) -> None:
    import idempotent.spark

    url = f"sqlite:///{tmp_path}/shared.db"
    driver = idempotent.spark.broker_url(url)  # the driver opens the file (creating it)
    try:
        assert executor_url(url, machine()) == driver
        check_reachable("kafka://k:9092", "another-host/boot")  # any machine reaches Kafka
        assert executor_url("idem://10.1.2.3:7650", "another-host/boot") == "idem://10.1.2.3:7650"
    finally:
        assert stop_host(url)
