"""Tests for idempotent.testing.services: real Kafka / Pulsar brokers, plus stale-state
handling that needs no Java.

The broker tests start *their own* broker instances: they point ``IDEMPOTENT_CACHE`` at a
private directory whose ``<name>-<version>`` entries are symlinks to the real cache (so
nothing is downloaded twice), hence their run state, ports and workdir are separate from
any broker a session fixture or a developer started, which they never touch.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import idempotent
from idempotent.testing import services


@pytest.fixture
def empty_cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("IDEMPOTENT_CACHE", str(cache))
    return cache


def _private_cache(name: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    lib = services.install(name)  # real cache: resolves once, then a no-op
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / lib.parent.name).symlink_to(lib.parent, target_is_directory=True)
    monkeypatch.setenv("IDEMPOTENT_CACHE", str(cache))
    return cache


@pytest.fixture
def private_broker(
    request: pytest.FixtureRequest, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    name = str(request.param)
    _private_cache(name, tmp_path, monkeypatch)
    workdir = services._default_workdir(name)
    try:
        yield name
    finally:
        services.down(name)
        shutil.rmtree(workdir.parent, ignore_errors=True)


def _timed(label: str, fn: Callable[..., services.ServiceInfo], *args: Any, **kwargs: Any) -> services.ServiceInfo:
    started = time.monotonic()
    result = fn(*args, **kwargs)
    print(f"{label}: {time.monotonic() - started:.1f} s")
    return result


# ------------------------------------------------------------------------------ kafka


def _kafka_read_all(bootstrap: str, topic: str, expected: int, timeout: float = 30.0) -> list[bytes]:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    values: list[bytes] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout
        while len(values) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            value = msg.value()
            assert value is not None
            values.append(value)
    finally:
        consumer.close()
    return values


def _kafka_produce(bootstrap: str, topic: str, value: bytes, transactional: bool = False) -> None:
    from confluent_kafka import Producer

    conf = {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True}
    if transactional:
        conf["transactional.id"] = f"tx-{uuid.uuid4().hex}"
    producer = Producer(conf)
    if transactional:
        producer.init_transactions(30)
        producer.begin_transaction()
    errors: list[object] = []
    producer.produce(topic, value, on_delivery=lambda err, _msg: errors.append(err) if err else None)
    if transactional:
        producer.commit_transaction(30)
    assert producer.flush(30) == 0
    assert not errors, errors


@pytest.mark.kafka
@pytest.mark.parametrize("private_broker", ["kafka"], indirect=True)
def test_kafka_lifecycle(private_broker: str) -> None:
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    name = private_broker
    assert services.status(name) is None
    info = _timed("kafka up (fresh)", services.up, name)
    assert info.name == "kafka"
    assert info.url.startswith("kafka://127.0.0.1:")
    assert info.bootstrap == info.url.removeprefix("kafka://")
    assert info.admin_url is None
    assert services.status(name) == info
    assert services.up(name) == info  # idempotent: same JVM

    topic = "services-test"
    admin = AdminClient({"bootstrap.servers": info.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    del admin  # no client left reconnecting (and logging) while the broker is down
    _kafka_produce(info.bootstrap, topic, b"m1")
    _kafka_produce(info.bootstrap, topic, b"m2", transactional=True)
    assert _kafka_read_all(info.bootstrap, topic, 2) == [b"m1", b"m2"]

    restarted = _timed("kafka restart", services.restart, name)
    assert restarted.url == info.url and restarted.workdir == info.workdir
    assert restarted.pid != info.pid
    assert _kafka_read_all(restarted.bootstrap, topic, 2) == [b"m1", b"m2"]

    _kafka_produce(restarted.bootstrap, topic, b"m3")  # acked (acks=all) before the crash
    services.kill9(name)
    assert services.status(name) is None
    recovered = _timed("kafka kill9 + up(fresh=False)", services.up, name, fresh=False)
    assert recovered.url == info.url and recovered.workdir == info.workdir
    assert _kafka_read_all(recovered.bootstrap, topic, 3) == [b"m1", b"m2", b"m3"]

    assert services.down(name) is True
    assert services.status(name) is None
    assert services.down(name) is False


# ----------------------------------------------------------------------------- pulsar


def _pulsar_client(url: str) -> Any:
    import pulsar

    return pulsar.Client(url, operation_timeout_seconds=30, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))


def _pulsar_read_all(url: str, topic: str, expected: int, timeout_ms: int = 5000) -> list[bytes]:
    import pulsar

    client = _pulsar_client(url)
    values: list[bytes] = []
    try:
        consumer = client.subscribe(topic, f"s-{uuid.uuid4().hex}", initial_position=pulsar.InitialPosition.Earliest)
        while len(values) < expected:
            try:
                msg = consumer.receive(timeout_ms)
            except pulsar.Timeout:
                break
            values.append(msg.data())
            consumer.acknowledge(msg)
    finally:
        client.close()
    return values


def _pulsar_send(url: str, topic: str, value: bytes) -> None:
    client = _pulsar_client(url)
    try:
        client.create_producer(topic).send(value)  # returns once the broker acked it
    finally:
        client.close()


def _post_json(url: str, body: object) -> int:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return int(response.status)


def _check_dedup_admin(admin_url: str, url: str) -> None:
    """Namespace dedup and topic-level policies work through the admin REST API."""
    assert _post_json(f"{admin_url}/admin/v2/namespaces/public/default/deduplication", True) == 204
    topic = "dedup-test"
    with urllib.request.urlopen(
        urllib.request.Request(f"{admin_url}/admin/v2/persistent/public/default/{topic}", method="PUT"), timeout=30
    ) as response:
        assert response.status == 204
    policy = f"{admin_url}/admin/v2/persistent/public/default/{topic}/deduplicationEnabled"
    assert _post_json(policy, True) == 204  # topic-level policy (needs topicLevelPoliciesEnabled)
    deadline = time.monotonic() + 30
    while True:
        with urllib.request.urlopen(f"{admin_url}/admin/v2/persistent/public/default/{topic}/stats", timeout=30) as r:
            if json.load(r).get("deduplicationStatus") == "Enabled":
                break
        assert time.monotonic() < deadline, "deduplication never became Enabled"
        time.sleep(0.2)
    client = _pulsar_client(url)
    try:
        producer = client.create_producer(f"persistent://public/default/{topic}", producer_name="p1")
        first = producer.send(b"a", sequence_id=7)
        duplicate = producer.send(b"a", sequence_id=7)
        assert first.ledger_id() >= 0
        assert (duplicate.ledger_id(), duplicate.entry_id()) == (-1, -1)
    finally:
        client.close()


@pytest.mark.pulsar
@pytest.mark.parametrize("private_broker", ["pulsar"], indirect=True)
def test_pulsar_lifecycle(private_broker: str) -> None:
    name = private_broker
    assert services.status(name) is None
    info = _timed("pulsar up (fresh)", services.up, name)
    assert info.name == "pulsar"
    assert info.url.startswith("pulsar://127.0.0.1:")
    assert info.bootstrap == info.url
    assert info.admin_url is not None and info.admin_url.startswith("http://127.0.0.1:")
    assert services.status(name) == info
    assert services.up(name) == info  # idempotent: same JVM

    topic = "persistent://public/default/services-test"
    _pulsar_send(info.bootstrap, topic, b"m1")
    assert _pulsar_read_all(info.bootstrap, topic, 1) == [b"m1"]
    _check_dedup_admin(info.admin_url, info.bootstrap)

    restarted = _timed("pulsar restart", services.restart, name)
    assert restarted.url == info.url and restarted.admin_url == info.admin_url
    assert restarted.workdir == info.workdir and restarted.pid != info.pid
    assert _pulsar_read_all(restarted.bootstrap, topic, 1) == [b"m1"]

    _pulsar_send(restarted.bootstrap, topic, b"m2")  # acked before the crash
    services.kill9(name)
    assert services.status(name) is None
    recovered = _timed("pulsar kill9 + up(fresh=False)", services.up, name, fresh=False)
    assert recovered.url == info.url and recovered.workdir == info.workdir
    assert _pulsar_read_all(recovered.bootstrap, topic, 2) == [b"m1", b"m2"]

    assert services.down(name) is True
    assert services.status(name) is None
    assert services.down(name) is False


# ------------------------------------------------- stale state (no Java, no network)


def _write_state(cache: pathlib.Path, name: str, pid: int, workdir: pathlib.Path) -> pathlib.Path:
    run = cache / "run"
    run.mkdir(parents=True, exist_ok=True)
    path = run / f"{name}.json"
    ports = (
        {"port": 1, "controller_port": 2} if name == "kafka" else {"broker_port": 1, "web_port": 2, "bookie_port": 3}
    )
    path.write_text(json.dumps({"name": name, "pid": pid, "ports": ports, "workdir": str(workdir)}))
    return path


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_state_with_dead_pid_is_cleaned(empty_cache: pathlib.Path, tmp_path: pathlib.Path) -> None:
    path = _write_state(empty_cache, "kafka", _dead_pid(), tmp_path / "w")
    assert services.status("kafka") is None
    assert path.exists()  # status() is read-only
    assert services.down("kafka") is False
    assert not path.exists()
    with pytest.raises(RuntimeError, match="not running"):
        services.kill9("kafka")
    with pytest.raises(RuntimeError, match="not running"):
        services.restart("kafka")  # no state left


def test_corrupt_state_file_is_discarded(empty_cache: pathlib.Path) -> None:
    run = empty_cache / "run"
    run.mkdir(parents=True)
    (run / "pulsar.json").write_text("{not json")
    assert services.status("pulsar") is None
    assert not (run / "pulsar.json").exists()


def test_live_foreign_pid_is_never_killed(empty_cache: pathlib.Path, tmp_path: pathlib.Path) -> None:
    # pid reuse: the state names a live process that is not one of our JVMs
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _write_state(empty_cache, "pulsar", proc.pid, tmp_path / "w")
        assert services.status("pulsar") is None
        assert services.down("pulsar") is False
        with pytest.raises(RuntimeError):
            services.kill9("pulsar")
        assert proc.poll() is None  # still alive
    finally:
        proc.kill()
        proc.wait()


def test_stale_jvm_of_ours_is_stopped(empty_cache: pathlib.Path, tmp_path: pathlib.Path) -> None:
    # A stand-in for a leftover broker JVM: same main class and markers on its command line.
    workdir = tmp_path / "w"
    fake = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
            "time.sleep(60)",
            "-Didempotent.service=kafka",
            f"-Didempotent.service.workdir={workdir}",
            "kafka.Kafka",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert fake.stdout is not None and fake.stdout.readline() == b"ready\n"
        assert services._is_ours(fake.pid, services._SPECS["kafka"], workdir)
        assert not services._is_ours(fake.pid, services._SPECS["kafka"], tmp_path / "other")
        assert not services._is_ours(fake.pid, services._SPECS["pulsar"])
        _write_state(empty_cache, "kafka", fake.pid, workdir)
        assert services.status("kafka") is None  # alive and ours, but not answering
        started = time.monotonic()
        assert services.down("kafka", timeout=1.0) is True  # ignores SIGTERM: SIGKILL fallback
        assert time.monotonic() - started < 10
        assert fake.wait(5) == -9
        assert not (empty_cache / "run" / "kafka.json").exists()
    finally:
        if fake.poll() is None:
            fake.kill()
            fake.wait()


def test_up_refuses_to_wipe_foreign_workdir(empty_cache: pathlib.Path, tmp_path: pathlib.Path) -> None:
    foreign = tmp_path / "precious"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("do not delete")
    with pytest.raises(ValueError, match="refusing to wipe"):
        services.up("kafka", workdir=str(foreign))
    assert (foreign / "keep.txt").read_text() == "do not delete"


def test_unknown_service(empty_cache: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="unknown service"):
        services.status("rabbitmq")


def test_the_api_and_the_helpers_callers_use_stay_where_they_were() -> None:
    """The module is split by concern into ``services_*`` siblings; the public API and the
    helpers that tests, benches and ``testing/spark.py`` reach for still resolve here."""
    assert services.__all__ == [
        "SERVICES",
        "ServiceInfo",
        "cache_dir",
        "clean",
        "down",
        "install",
        "kill9",
        "main",
        "restart",
        "status",
        "up",
    ]
    for name in (
        "_CONF_DIR",
        "_DEPENDENCY_PLUGIN",
        "_POM_DIR",
        "_SPECS",
        "_clean_stale",
        "_default_workdir",
        "_home",
        "_is_ours",
        "_java",
        "_locked",
        "_tail",
    ):
        assert hasattr(services, name), name
    assert (services._POM_DIR / "kafka.xml").is_file() and (services._CONF_DIR / "log4j2.properties").is_file()
    from idempotent.testing import spark  # imports its helpers from services

    assert spark is not None


def test_cache_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("IDEMPOTENT_CACHE", str(tmp_path / "c"))
    assert services.cache_dir() == (tmp_path / "c").resolve()
    monkeypatch.delenv("IDEMPOTENT_CACHE")
    assert services.cache_dir() == pathlib.Path.home() / ".cache" / "idempotent"


def test_cli_status_not_running(empty_cache: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert services.main(["status", "all"]) == 1
    assert capsys.readouterr().out.splitlines() == ["kafka not running", "pulsar not running"]
    assert services.main(["down", "kafka"]) == 0
    assert capsys.readouterr().out.strip() == "kafka was not running"


def test_install_is_cached(empty_cache: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # With a marker matching the POM, install() must not run Maven at all.
    spec = services._SPECS["kafka"]
    home = services._home(spec)
    (home / "lib").mkdir(parents=True)
    (home / "lib" / "kafka_2.13-0.0.0.jar").write_bytes(b"")
    pom_hash = hashlib.sha256((services._POM_DIR / spec.pom).read_bytes()).hexdigest()
    (home / ".installed").write_text(json.dumps({"pom_sha256": pom_hash}))
    monkeypatch.setattr(shutil, "which", lambda _cmd: None)  # no mvn: would raise
    monkeypatch.setattr(subprocess, "run", None)
    assert services.install("kafka", progress=False) == home / "lib"


def test_default_workdir_is_per_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("IDEMPOTENT_CACHE", str(tmp_path / "a"))
    first = services._default_workdir("kafka")
    monkeypatch.setenv("IDEMPOTENT_CACHE", str(tmp_path / "b"))
    assert services._default_workdir("kafka") != first
    assert first.name in ("kafka", "kafka-work")


_LISTENER = (
    "import signal, socket, sys, time\n"
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
    "print(s.getsockname()[1], flush=True)\n"
    "time.sleep(60)\n"
)


def _listener(*markers: str) -> tuple[subprocess.Popen[bytes], int]:
    proc = subprocess.Popen([sys.executable, "-c", _LISTENER, *markers], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def test_leftover_jvm_of_ours_in_the_workdir_is_stopped(empty_cache: pathlib.Path, tmp_path: pathlib.Path) -> None:
    # A stand-in for a broker JVM whose state file was lost: found by its command line.
    spec = services._SPECS["pulsar"]
    main_class = "org.apache.pulsar.PulsarStandaloneStarter"
    mine, _ = _listener("-Didempotent.service=pulsar", f"-Didempotent.service.workdir={tmp_path / 'w'}", main_class)
    other, other_port = _listener(
        "-Didempotent.service=pulsar", f"-Didempotent.service.workdir={tmp_path / 'other'}", main_class
    )
    try:
        services._clean_stale(spec, None, tmp_path / "w")
        assert mine.wait(5) == -15  # SIGTERM
        assert other.poll() is None  # ours too, but another workdir: never touched
        # ... even when it holds the port we want: the start fails and names it instead
        with pytest.raises(RuntimeError, match=f"pid {other.pid} .*workdir={tmp_path / 'other'}"):
            services.up("pulsar", port=other_port)
        assert other.poll() is None
    finally:
        for proc in (mine, other):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_port_held_by_foreign_process_is_reported(empty_cache: pathlib.Path) -> None:
    foreign, port = _listener()
    try:
        with pytest.raises(RuntimeError, match=f"port\\(s\\) \\[{port}\\].*in use by another process"):
            services.up("kafka", port=port)
        assert foreign.poll() is None  # never killed
    finally:
        foreign.kill()
        foreign.wait()


@pytest.mark.pulsar
def test_cli_prints_a_pulsar_url_that_connects_as_it_is(
    pulsar_service: services.ServiceInfo, capsys: pytest.CaptureFixture[str]
) -> None:
    assert services.main(["status", "pulsar"]) == 0
    name, url, *_ = capsys.readouterr().out.split()
    assert name == "pulsar" and url == pulsar_service.connect_url and "admin_url=" in url
    broker = idempotent.connect(url)  # the admin port is not 8080: it must come from the URL
    try:
        broker.create_topic("services-connect-url", 1)
        assert broker.topics()["services-connect-url"] == 1
    finally:
        broker.close()
