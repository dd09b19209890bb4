"""The systems under comparison, the brokers they run on, and how each one suffers a fault.

The systems' names, and which faults apply to which, are in
:mod:`idempotent.compare.catalogue`.

Kafka and Pulsar are **private** to the comparison: :class:`Environment` starts its own
single-node brokers under a private ``IDEMPOTENT_CACHE`` that links the installed jars, so
``broker-kill`` and ``broker-restart`` never touch brokers someone else uses. One pair serves
every run of an invocation (each run has its own topic) and is stopped at the end.

How each fault reaches each system is in :class:`SystemRun`; see docs/comparison.md for the table.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from ..testing import services
from ..testing.native_proxy import CutProxy, kafka_produce, pulsar_rewrite, pulsar_send
from ..testing.proxy import FaultyProxy
from .catalogue import OURS_SERVER, backend_of
from .producers import Target
from .workload import record_id

#: Reads a record id from a stored value (None: a value the workload did not write).
Identify = Callable[[bytes | None], int | None]

#: Namespace with Pulsar deduplication enabled (pulsar-native-dedup).
DEDUP_NAMESPACE = "public/compare-dedup"


def _port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


def _free_port(digits: int | None = None) -> int:
    for _ in range(200):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if digits is None or len(str(port)) == digits:
            return port
    raise RuntimeError(f"no free {digits}-digit port found")


class Environment:
    """Private Kafka and Pulsar brokers for one comparison, started on first use.

    ``workdir`` holds the private cache (links to the jars of the normal cache) and each
    run's files: its SQLite databases and the logs of its producing processes and broker
    server. :meth:`discard` removes a finished run's files, moving the logs of a run that
    failed to ``kept_logs`` (default: they stay in ``workdir``); :meth:`close` stops the
    brokers it started and removes their data.
    """

    def __init__(self, workdir: pathlib.Path, kept_logs: pathlib.Path | None = None) -> None:
        self.workdir = workdir
        self.kept_logs = kept_logs
        self.cache = workdir / "cache"
        self._started: dict[str, services.ServiceInfo] = {}
        #: seconds each broker took to start, restart or recover, by action
        self.timings: list[tuple[str, str, float]] = []

    @contextlib.contextmanager
    def _private(self) -> Iterator[None]:
        old = os.environ.get("IDEMPOTENT_CACHE")
        os.environ["IDEMPOTENT_CACHE"] = str(self.cache)
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("IDEMPOTENT_CACHE", None)
            else:
                os.environ["IDEMPOTENT_CACHE"] = old

    def _timed(self, name: str, action: str, started: float) -> None:
        self.timings.append((name, action, round(time.monotonic() - started, 2)))

    def service(self, name: str) -> services.ServiceInfo:
        """The private broker ``name`` (``kafka`` or ``pulsar``), started if needed.

        Raises:
            RuntimeError: the jars could not be installed or the broker did not start.
        """
        info = self._started.get(name)
        if info is not None:
            return info
        lib = services.install(name, progress=False)  # the normal cache: resolved once, then a no-op
        self.cache.mkdir(parents=True, exist_ok=True)
        link = self.cache / lib.parent.name
        if not link.exists():
            link.symlink_to(lib.parent, target_is_directory=True)
        started = time.monotonic()
        with self._private():
            info = services.up(name)
        self._timed(name, "start", started)
        self._started[name] = info
        return info

    def kill9_and_recover(self, name: str) -> None:
        """kill -9 the private broker, then start it again on its data and ports."""
        started = time.monotonic()
        with self._private():
            services.kill9(name)
            self._started[name] = services.up(name, fresh=False)
        self._timed(name, "kill9+up", started)

    def restart(self, name: str) -> None:
        """SIGTERM the private broker and start it again on its data and ports."""
        started = time.monotonic()
        with self._private():
            self._started[name] = services.restart(name)
        self._timed(name, "restart", started)

    def log(self, run_id: str, what: str) -> pathlib.Path:
        """Where the run's ``what`` (``producer``, ``server``) writes its log."""
        return self.workdir / f"{run_id}-{what}.log"

    def discard(self, run_id: str, keep_logs: bool) -> list[pathlib.Path]:
        """Remove the files of a finished run: its databases, and its logs unless
        ``keep_logs``; return where the kept logs are."""
        kept: list[pathlib.Path] = []
        for name in (f"{glob.escape(run_id)}.*", f"{glob.escape(run_id)}-*"):
            for path in sorted(self.workdir.glob(name)):
                if not path.is_file():
                    continue
                if not (keep_logs and path.name.endswith(".log")):
                    path.unlink(missing_ok=True)
                elif self.kept_logs is None:
                    kept.append(path)
                else:
                    self.kept_logs.mkdir(parents=True, exist_ok=True)
                    kept.append(pathlib.Path(shutil.move(path, self.kept_logs / path.name)))
        return kept

    @classmethod
    def reap(cls, workdir: pathlib.Path) -> None:
        """Stop the brokers of an earlier comparison that was killed before it could (its
        ``workdir``), and remove their data and ``workdir``."""
        env = cls(workdir)
        if workdir.is_dir():
            with env._private():
                for name in services.SERVICES:
                    info = services.status(name)
                    services.down(name)
                    if info is not None:
                        shutil.rmtree(pathlib.Path(info.workdir).parent, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)

    def close(self) -> None:
        """Stop the private brokers and remove their data."""
        with self._private():
            for name in list(self._started):
                workdir = pathlib.Path(self._started[name].workdir)
                services.down(name)
                shutil.rmtree(workdir.parent, ignore_errors=True)
                del self._started[name]


class BrokerServer:
    """An ``idempotent broker`` process over one backend, on a fixed port."""

    def __init__(self, backend_url: str, log: pathlib.Path) -> None:
        self.backend_url = backend_url
        self.port = _free_port()
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> None:
        """Start the server and wait until it accepts connections.

        Raises:
            RuntimeError: it exited or did not listen within ``timeout`` s.
        """
        cmd = [
            sys.executable, "-m", "idempotent", "broker",
            "--backend", self.backend_url, "--listen", f"127.0.0.1:{self.port}",
        ]  # fmt: skip
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not _port_open(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop(kill=True)
                raise RuntimeError(f"broker server did not start; see its log {self.log.name}")
            time.sleep(0.05)

    def stop(self, kill: bool = False, timeout: float = 30.0) -> None:
        """SIGKILL (``kill``) or SIGTERM the server and wait for it to exit."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class SystemRun:
    """One run's plumbing for one system: topic, proxy, broker server, faults, read-back."""

    def __init__(self, env: Environment, system: str, run_id: str) -> None:
        self.env = env
        self.system = system
        self.run_id = run_id
        self.backend = backend_of(system)
        self.topic = f"cmp-{run_id}"
        self.cut_proxy: CutProxy | None = None
        self.proxy: FaultyProxy | None = None
        self.server: BrokerServer | None = None
        self._read_url = ""
        self._read_options: dict[str, Any] = {}

    # -- set-up ----------------------------------------------------------------------------

    @property
    def in_process(self) -> bool:
        """Our producer and broker share the producing process (memory, sqlite)."""
        return self.system in ("memory", "sqlite")

    @property
    def worker_reads_back(self) -> bool:
        """The store lives in the producing process (memory): it reads itself back."""
        return self.system == "memory"

    def _kafka_proxy(self) -> tuple[services.ServiceInfo, str]:
        info = self.env.service("kafka")
        assert info.proxy_port is not None and info.relay_port is not None
        self.cut_proxy = CutProxy(info.proxy_port, info.relay_port, cut=kafka_produce)
        return info, f"127.0.0.1:{info.proxy_port}"

    def _pulsar_proxy(self) -> tuple[services.ServiceInfo, int]:
        info = self.env.service("pulsar")
        broker_port = int(info.bootstrap.rsplit(":", 1)[1])
        port = _free_port(len(str(broker_port)))
        self.cut_proxy = CutProxy(port, broker_port, cut=pulsar_send, rewrite=pulsar_rewrite(broker_port, port))
        return info, port

    def _backend_url(self) -> str:
        if self.backend == "sqlite":
            return f"sqlite:///{self.env.workdir / (self.run_id + '.db')}"
        if self.backend == "kafka":
            return self.env.service("kafka").url
        info = self.env.service("pulsar")
        return f"{info.url}?admin_url={info.admin_url}"

    def open(self) -> Target:
        """Start what the run needs; return where the producing process sends.

        Raises:
            RuntimeError: a broker or broker server did not start.
        """
        name = f"cmp-{self.run_id}"
        system, backend = self.system, self.backend
        if system == "memory":
            return Target(system, self.topic, f"memory://{self.run_id}", name)
        if system == "sqlite":
            self._read_url = self._backend_url()
            return Target(system, self.topic, self._read_url, name)
        if system in OURS_SERVER:
            self._read_url = self._backend_url()
            if backend in ("kafka", "pulsar"):
                self._read_options = {"read_only": True}
            self.server = BrokerServer(self._read_url, self.env.log(self.run_id, "server"))
            self.server.start()
            self.proxy = FaultyProxy(f"127.0.0.1:{self.server.port}").start()
            return Target(system, self.topic, f"idem://{self.proxy.address}", name, {"timeout": 2.0})
        if backend == "kafka":
            info, through = self._kafka_proxy()
            if system == "kafka":
                self._read_url, self._read_options = info.url, {"read_only": True}
                return Target(system, self.topic, f"kafka://{through}", name)
            self._read_url = info.bootstrap
            return Target(system, self.topic, through, name)
        info, port = self._pulsar_proxy()
        admin = f"?admin_url={info.admin_url}"
        if system == "pulsar":
            self._read_url, self._read_options = info.url + admin, {"read_only": True}
            return Target(system, self.topic, f"pulsar://127.0.0.1:{port}{admin}", name)
        from .baselines import enable_pulsar_dedup

        namespace = DEDUP_NAMESPACE if system == "pulsar-native-dedup" else "public/default"
        if system == "pulsar-native-dedup":
            enable_pulsar_dedup(str(info.admin_url), namespace, self.topic)
        self.topic = f"persistent://{namespace}/{self.topic}"
        self._read_url = info.bootstrap
        return Target(system, self.topic, f"pulsar://127.0.0.1:{port}", name)

    # -- faults ----------------------------------------------------------------------------

    def injected(self) -> int:
        """Faults the proxies have carried out so far."""
        if self.proxy is not None:
            return sum(self.proxy.faults.injected.values())
        if self.cut_proxy is not None:
            return self.cut_proxy.injected
        return 0

    def link_fault(self, fault: str) -> str | None:
        """Inject ``lost-ack``, ``cut`` or ``duplicate-request`` on the wire; return the
        command for the producing process instead when the link is inside it."""
        if self.in_process:
            return fault
        if self.proxy is not None:
            if fault == "cut":
                self.proxy.cut_all()
            else:
                self.proxy.arm("drop_response" if fault == "lost-ack" else "duplicate_request")
            return None
        assert self.cut_proxy is not None
        if fault == "cut":
            self.cut_proxy.cut_all()
        else:
            self.cut_proxy.arm()
        return None

    def broker_fault(self, kill: bool) -> str | None:
        """kill -9 (``kill``) or SIGTERM the broker and bring it back. Returns
        ``"crash-broker"`` for memory (done by the producing process) and
        ``"producer-restart"`` for sqlite (the broker is the producing process)."""
        if self.system == "memory":
            return "crash-broker"
        if self.system == "sqlite":
            return "producer-restart"
        if self.server is not None:
            self.server.stop(kill=kill)
            self.server.start()
            return None
        # Kafka's proxy listens on a port of the broker's own configuration (its advertised
        # second listener): the broker's start refuses to run while it is taken.
        kafka_proxy = self.backend == "kafka" and self.cut_proxy is not None
        if kafka_proxy and self.cut_proxy is not None:
            self.cut_proxy.close()
        try:
            if kill:
                self.env.kill9_and_recover(self.backend)
            else:
                self.env.restart(self.backend)
        finally:
            if kafka_proxy:
                self._kafka_proxy()
        return None

    # -- end -------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the broker server and the proxies."""
        if self.server is not None:
            self.server.stop()
        if self.proxy is not None:
            self.proxy.close()
        if self.cut_proxy is not None:
            self.cut_proxy.close()

    def read_back(self, timeout: float = 60.0, identify: Identify = record_id) -> list[int | None]:
        """The id of every record stored for the run, in log order (call after :meth:`close`);
        ``identify`` reads an id from a value (``copied_id`` for a copy job's output)."""
        if self.system.startswith("kafka-native"):
            return _read_kafka(self._read_url, self.topic, timeout, identify)
        if self.system.startswith("pulsar-native"):
            return _read_pulsar(self._read_url, self.topic, timeout, identify)
        from .. import connect

        broker = connect(self._read_url, **self._read_options)
        try:
            out: list[int | None] = []
            offset = 0
            while True:
                stored = broker.read(self.topic, 0, offset, 1000)
                if not stored:
                    return out
                out.extend(identify(r.value) for r in stored)
                offset = stored[-1].offset + 1
        finally:
            broker.close()


def _read_kafka(bootstrap: str, topic: str, timeout: float, identify: Identify) -> list[int | None]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"compare-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "log_level": 0,
        }
    )
    out: list[int | None] = []
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return out
                continue
            out.append(identify(msg.value()))
        raise TimeoutError(f"read-back of {topic} did not reach the end within {timeout:.0f} s")
    finally:
        consumer.close()


def _read_pulsar(url: str, topic: str, timeout: float, identify: Identify) -> list[int | None]:
    import pulsar

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    out: list[int | None] = []
    try:
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        deadline = time.monotonic() + timeout
        while reader.has_message_available():
            if time.monotonic() > deadline:
                raise TimeoutError(f"read-back of {topic} did not reach the end within {timeout:.0f} s")
            out.append(identify(reader.read_next(int(timeout * 1000)).data()))
        return out
    finally:
        client.close()


__all__ = [
    "BrokerServer",
    "Environment",
    "SystemRun",
]
