"""One broker server per backend URL on this machine, shared by Spark's Python processes.

Spark runs a data source's code in many short-lived Python worker processes. They cannot each
open an in-process broker over the same backend: a SQLite file has one writing process, and
brokers over Kafka or Pulsar would take each other's partitions over on every task. So every
``sqlite://``, ``kafka://``, ``pulsar://`` or ``memory://`` URL is served by one *host*: a
detached ``python -m idempotent.spark`` process running a
:class:`~idempotent.net.server.BrokerServer` on 127.0.0.1. Spark's processes reach it as
``idem://127.0.0.1:PORT``; ``idem://`` and ``idems://`` URLs are used as they are.

Files (in ``$IDEMPOTENT_SPARK_HOSTS``, default ``<tmp>/idempotent-spark-<uid>``), per URL key:

* ``<key>.run``: the host holds an exclusive ``flock`` on it for its whole life, so a host is
  alive exactly when the lock is taken (no stale pid or port guesses after a kill -9);
* ``<key>.addr``: the host's ``host:port``, written once it listens;
* ``<key>.spawn``: locked while a process starts a host, so two processes never start two;
* ``<key>.log``: the host's output.

A host leaves once no client has been connected for ``idle_seconds`` (default 60), or on
SIGTERM; it closes its broker cleanly (final snapshots). It outlives a killed Spark driver, so
a rerun finds it and continues.

The driver resolves a URL once (:func:`resolve_url`: a relative SQLite path made absolute
from the driver's working directory) and hands tasks that URL with the name of its machine
(:func:`machine`). A task reaches it through :func:`executor_url`: on the driver's machine it
finds (or starts) the same host as the driver; a URL that only the driver's machine can serve
(a SQLite file, ``memory://``, an ``idem://`` loopback address) is refused on any other
machine, and a task never creates a SQLite file the driver did not.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

from idempotent.runtime.collector import fewer_collections

from ..errors import BackendUnavailableError, ConfigError

DEFAULT_IDLE_SECONDS = 60.0


def hosts_dir() -> Path:
    """Where hosts keep their lock, address and log files."""
    configured = os.environ.get("IDEMPOTENT_SPARK_HOSTS")
    path = Path(configured) if configured else Path(tempfile.gettempdir()) / f"idempotent-spark-{os.getuid()}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def absolute_url(url: str) -> str:
    """``url`` with a relative SQLite path made absolute (from the current directory), so
    that every process means the same file."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url.startswith(prefix + "/"):
        return prefix + os.path.abspath(url[len(prefix) :])
    return url


def resolve_url(url: object) -> str:
    """``url`` as the driver hands it to tasks: a relative SQLite path made absolute from the
    driver's working directory (a task's working directory is its executor's).

    Raises:
        ConfigError: ``url`` is not a non-empty string.
    """
    if not isinstance(url, str) or not url:
        raise ConfigError(f"a broker URL is a non-empty string, not {url!r}")
    return absolute_url(url)


def machine() -> str:
    """The name of this machine in :func:`executor_url`'s check: its host name, and its boot
    id where the system has one (two machines may share a host name)."""
    boot = ""
    with contextlib.suppress(OSError):
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return f"{socket.gethostname()}/{boot}" if boot else socket.gethostname()


def machine_bound(url: str) -> str | None:
    """What in ``url`` only its own machine can serve (a SQLite file, an in-memory broker, a
    loopback address), described for an error message; None for a URL any machine reaches."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        return f"the SQLite file {sqlite_path(url)!r}"
    if parts.scheme == "memory":
        return "an in-memory broker"
    if parts.scheme in ("idem", "idems"):
        host = (parts.hostname or "").lower()
        if host == "localhost" or host == "::1" or host.startswith("127."):
            return f"the broker server at {parts.netloc} (a loopback address)"
    return None


def sqlite_path(url: str) -> str:
    """The file a ``sqlite:///`` URL names (its query left out).

    Raises:
        ConfigError: not a well-formed SQLite URL.
    """
    from idempotent.adapters.sqlite.backend import parse_sqlite_url

    return parse_sqlite_url(url)[0]


def executor_url(url: str, origin: str) -> str:
    """The ``idem://`` URL through which a task reaches ``url``, which the driver resolved
    (:func:`resolve_url`) on the machine named ``origin`` (:func:`machine`). On that machine
    this is the host the driver uses; on another, a URL any machine reaches gets that
    machine's own host.

    Raises:
        ConfigError: ``url`` names something only the driver's machine serves (a SQLite file,
            ``memory://``, a loopback ``idem://`` address) and this task runs on another
            machine, or its SQLite file does not exist here (a task never creates one). The
            message names the URL and what to do; nothing was written.
        BackendUnavailableError: the host did not start (see :func:`ensure_host`).
    """
    check_reachable(url, origin)
    return ensure_host(url)


def check_reachable(url: str, origin: str) -> None:
    """Refuse, in a task, a URL that the driver resolved on ``origin`` and this machine cannot
    serve as the driver does (see :func:`executor_url`).

    Raises:
        ConfigError: as :func:`executor_url`; nothing was opened.
    """
    what = machine_bound(url)
    if what is None:
        return
    here = machine()
    remedy = (
        "run `idempotent broker --backend URL --listen 0.0.0.0:PORT` on one machine and pass its "
        "idem://HOST:PORT URL, which every executor reaches (docs/spark.md, Where Spark's processes meet the backend)"
    )
    if here != origin:
        raise ConfigError(
            f"{url} names {what} on the Spark driver's machine ({origin}), but this task runs on {here}: "
            f"an executor on another machine cannot reach it and must not open another one; {remedy}"
        )
    if url.startswith("sqlite:") and not os.path.exists(sqlite_path(url)):
        raise ConfigError(
            f"{url} names {what}, which the driver opened but which does not exist for this task (moved, deleted, "
            f"or another file system): a task never creates a SQLite file; {remedy}"
        )


def _key(url: str) -> str:
    return hashlib.sha256(url.encode("utf-8")).hexdigest()[:20]


@contextlib.contextmanager
def _locked(path: Path, *, wait: bool) -> Iterator[IO[str] | None]:
    """An exclusive flock on ``path``; yields None when ``wait`` is False and it is taken."""
    handle = open(path, "a")  # noqa: SIM115 - closed below
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        yield handle
    finally:
        handle.close()


def _running_address(key: str) -> str | None:
    """The address of the live host for ``key``, or None when none runs."""
    if not _host_alive(key):
        return None
    try:
        address = (hosts_dir() / f"{key}.addr").read_text().strip()
    except FileNotFoundError:
        return None  # starting: the address comes once it listens
    return address or None


def ensure_host(url: str, *, idle_seconds: float = DEFAULT_IDLE_SECONDS, timeout: float = 60.0) -> str:
    """The ``idem://`` URL of the broker server that serves ``url`` on this machine, started
    (detached) when none runs. ``idem://`` and ``idems://`` URLs come back unchanged.

    Raises:
        ConfigError: ``url`` is not a string.
        BackendUnavailableError: the host did not start within ``timeout`` (its log is quoted);
            nothing was written.
    """
    if not isinstance(url, str) or not url:
        raise ConfigError(f"a broker URL is a non-empty string, not {url!r}")
    if url.startswith(("idem://", "idems://")):
        return url
    url = absolute_url(url)
    key = _key(url)
    base = hosts_dir()
    address = _running_address(key)
    if address is not None:
        return f"idem://{address}"
    with _locked(base / f"{key}.spawn", wait=True):
        log_path = base / f"{key}.log"
        process: subprocess.Popen[bytes] | None = None
        spawned = 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            address = _running_address(key)
            if address is not None:
                return f"idem://{address}"
            if process is not None and process.poll() not in (None, 0):
                break  # the host failed to start: report its log
            if (process is None or process.poll() == 0) and not _host_alive(key):
                if spawned == 3:
                    break  # hosts that leave at once (a host of another life just leaving)
                process = _spawn(url, key, idle_seconds, log_path)
                spawned += 1
            time.sleep(0.05)
        if process is not None and process.poll() is None:
            process.kill()
        tail = log_path.read_text(errors="replace")[-2000:] if log_path.exists() else ""
        raise BackendUnavailableError(f"no broker server for {url} came up (log {log_path}):\n{tail}")


def _host_alive(key: str) -> bool:
    with _locked(hosts_dir() / f"{key}.run", wait=False) as free:
        return free is None


def _spawn(url: str, key: str, idle_seconds: float, log_path: Path) -> subprocess.Popen[bytes]:
    with contextlib.suppress(FileNotFoundError):
        (hosts_dir() / f"{key}.addr").unlink()
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "idempotent.spark", url, key, str(idle_seconds)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # survives the Spark worker (and driver) that started it
            close_fds=True,
        )


def stop_host(url: str, *, timeout: float = 30.0) -> bool:
    """Ask the host serving ``url`` to leave (SIGTERM) and wait for it. True if one ran."""
    key = _key(absolute_url(url))
    base = hosts_dir()
    if _running_address(key) is None:
        return False
    try:
        pid = int((base / f"{key}.pid").read_text())
    except (FileNotFoundError, ValueError):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _running_address(key) is not None:
        time.sleep(0.05)
    return True


def _serve(url: str, key: str, idle_seconds: float) -> int:
    import idempotent
    from idempotent.broker.broker import Broker
    from idempotent.net.server import BrokerServer

    base = hosts_dir()
    # fewer_collections: this process serves bulk writes only (see idempotent.runtime.collector)
    with _locked(base / f"{key}.run", wait=False) as held, fewer_collections():
        if held is None:
            return 0  # another host serves this URL
        (base / f"{key}.pid").write_text(str(os.getpid()))
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        broker = idempotent.connect(url)
        if not isinstance(broker, Broker):
            broker.close()
            raise ConfigError(f"{url} names a broker server already; use it directly")
        server = BrokerServer(broker, "127.0.0.1", 0).start()
        try:
            tmp = base / f"{key}.addr.tmp"
            tmp.write_text(server.address)
            tmp.replace(base / f"{key}.addr")
            print(f"serving {url} on {server.address}", flush=True)
            idle_since = time.monotonic()
            while not stop.wait(0.5):
                if server.connection_count:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since >= idle_seconds:
                    break
        finally:
            with contextlib.suppress(FileNotFoundError):
                (base / f"{key}.addr").unlink()
            server.close()
    return 0


def main(argv: list[str]) -> int:
    """``python -m idempotent.spark URL KEY IDLE_SECONDS``: run a host (what ensure_host starts)."""
    url, key, idle = argv
    return _serve(url, key, float(idle))
