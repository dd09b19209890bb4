"""Real single-node Kafka and Pulsar brokers on 127.0.0.1, for tests, CI and by hand.

The brokers are plain JVMs started from classpaths resolved once from Maven Central
(``install``) into :func:`cache_dir`, outside the repository:

* ``kafka``: Apache Kafka 4.x in KRaft mode (combined broker + controller, no
  ZooKeeper), main class ``kafka.Kafka`` (see ``poms/kafka.xml``).
* ``pulsar``: Apache Pulsar 3.0.x standalone (broker + one embedded bookie, RocksDB
  metadata), main class ``org.apache.pulsar.PulsarStandaloneStarter``
  (see ``poms/pulsar.xml``).

State (pid, ports, workdir) lives in ``cache_dir()/run/<name>.json`` so that ``up``
in one process and ``down`` in another work; every mutating call holds an exclusive
``flock`` on ``cache_dir()/run/<name>.lock``. Data lives in the service's workdir
(default ``/dev/shm/idempotent-<uid>-<hash>/<name>``): wiped by ``up`` (fresh), kept
by :func:`restart` and by :func:`kill9` followed by ``up(name, fresh=False)``.

Command line (also wired as ``idempotent services ...``)::

    python -m idempotent.testing.services up|down|status|install|restart|kill9 kafka|pulsar|all
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import json
import os
import pathlib
import shutil
import signal
import socket
import string
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs

__all__ = [
    "SERVICES",
    "ServiceInfo",
    "cache_dir",
    "down",
    "install",
    "kill9",
    "main",
    "restart",
    "status",
    "up",
]

SERVICES = ("kafka", "pulsar")

_HOST = "127.0.0.1"
_PKG_DIR = pathlib.Path(__file__).resolve().parent
_POM_DIR = _PKG_DIR / "poms"
_CONF_DIR = _PKG_DIR / "conf"
_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
_MARKER = ".idempotent-service"  # marks a workdir created (and wipeable) by us
_PROBE_TOPIC = "__idempotent_probe"
_LOG_TAIL_LINES = 40


@attrs.frozen
class ServiceInfo:
    """A running broker.

    ``url`` is ``kafka://127.0.0.1:PORT`` or ``pulsar://127.0.0.1:PORT``;
    ``bootstrap`` is what the native client takes (Kafka ``127.0.0.1:PORT``, Pulsar
    ``pulsar://127.0.0.1:PORT``); ``admin_url`` is Pulsar's REST base
    ``http://127.0.0.1:WEBPORT`` (None for Kafka). ``connect_url`` is what
    :func:`idempotent.connect` takes as it is (for Pulsar, ``url`` plus ``?admin_url=...``).
    """

    name: str
    url: str
    bootstrap: str
    admin_url: str | None
    pid: int
    workdir: str
    #: Kafka only: a second listener, advertised at ``127.0.0.1:proxy_port`` and bound at
    #: ``relay_port``. Nothing listens on ``proxy_port`` until a test starts a proxy there
    #: that forwards to ``relay_port``; a client bootstrapped through that proxy then keeps
    #: talking through it (Kafka hands out the advertised address of the listener a
    #: request came in on), so the proxy can cut connections at chosen requests.
    proxy_port: int | None = None
    relay_port: int | None = None
    #: Pulsar only: the TLS listeners (``pulsar+ssl://127.0.0.1:PORT``, ``https://127.0.0.1:PORT``)
    #: and the CA file that signed their certificate
    tls_url: str | None = None
    tls_admin_url: str | None = None
    ca_cert: str | None = None

    @property
    def connect_url(self) -> str:
        """The backend URL for :func:`idempotent.connect`, usable as it is."""
        if self.admin_url is None:
            return self.url
        return f"{self.url}?{urllib.parse.urlencode({'admin_url': self.admin_url})}"


@attrs.frozen
class _Spec:
    name: str
    pom: str  # file in poms/
    version_property: str  # <properties> entry holding the version
    main_class: str
    marker_jar: str  # prefix of a jar that must be in lib/ after resolution
    port_keys: tuple[str, ...]  # port_keys[0] is the client port
    jvm_flags: tuple[str, ...]


_PULSAR_ADD_OPENS = (
    "java.base/java.io",
    "java.base/java.nio",
    "java.base/jdk.internal.misc",
    "java.base/java.util.zip",
    "java.base/sun.net",
    "java.management/sun.management",
    "jdk.management/com.sun.management.internal",
    "java.base/jdk.internal.platform",
)

_SPECS: dict[str, _Spec] = {
    "kafka": _Spec(
        name="kafka",
        pom="kafka.xml",
        version_property="kafka.version",
        main_class="kafka.Kafka",
        marker_jar="kafka_2.13-",
        port_keys=("port", "controller_port", "relay_port", "proxy_port"),
        jvm_flags=(
            "-Xms256m",
            "-Xmx512m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
        ),
    ),
    "pulsar": _Spec(
        name="pulsar",
        pom="pulsar.xml",
        version_property="pulsar.version",
        main_class="org.apache.pulsar.PulsarStandaloneStarter",
        marker_jar="pulsar-broker-",
        port_keys=("broker_port", "web_port", "bookie_port", "broker_tls_port", "web_tls_port"),
        jvm_flags=(
            "-Xms256m",
            "-Xmx1g",
            "-XX:MaxDirectMemorySize=512m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            *(f"--add-opens={m}=ALL-UNNAMED" for m in _PULSAR_ADD_OPENS),
            "-Dio.netty.tryReflectionSetAccessible=true",
            "-Djava.net.preferIPv4Stack=true",
        ),
    ),
}

# Popen objects of JVMs started by this process: kept so they are not garbage
# collected while running, and so kill9()/down() can reap them (no zombies).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


# --------------------------------------------------------------------------- paths


def cache_dir() -> pathlib.Path:
    """Return the cache root: ``$IDEMPOTENT_CACHE`` or ``~/.cache/idempotent``.

    It holds the resolved classpaths (``<name>-<version>/lib``), the run state
    (``run/``) and, when ``/dev/shm`` is missing, the brokers' workdirs. The
    directory is not created here.
    """
    env = os.environ.get("IDEMPOTENT_CACHE")
    if env:
        return pathlib.Path(env).expanduser().resolve()
    return pathlib.Path.home() / ".cache" / "idempotent"


def _run_dir() -> pathlib.Path:
    path = cache_dir() / "run"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _state_path(name: str) -> pathlib.Path:
    return _run_dir() / f"{name}.json"


def _default_workdir(name: str) -> pathlib.Path:
    shm = pathlib.Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        digest = hashlib.sha256(str(cache_dir()).encode()).hexdigest()[:8]
        return shm / f"idempotent-{os.getuid()}-{digest}" / name
    return _run_dir() / f"{name}-work"


def _spec(name: str) -> _Spec:
    try:
        return _SPECS[name]
    except KeyError:
        raise ValueError(f"unknown service {name!r}; expected one of {SERVICES}") from None


def _version(spec: _Spec) -> str:
    """The broker version, read from the POM's <properties> (single source of truth)."""
    root = ET.parse(_POM_DIR / spec.pom).getroot()
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    node = root.find(f"m:properties/m:{spec.version_property}", ns)
    if node is None or not (node.text or "").strip():
        raise RuntimeError(f"{spec.pom} has no <{spec.version_property}> property")
    return (node.text or "").strip()


def _home(spec: _Spec) -> pathlib.Path:
    return cache_dir() / f"{spec.name}-{_version(spec)}"


@contextlib.contextmanager
def _locked(path: pathlib.Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _tail(path: pathlib.Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def _say(message: str, progress: bool, end: str = "\n") -> None:
    if progress:
        print(message, end=end, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------- install


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (pathlib.Path(home) / "bin" / "java").exists():
        return str(pathlib.Path(home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise RuntimeError("java (17+) not found on PATH or in $JAVA_HOME")
    return found


def install(name: str, progress: bool = True) -> pathlib.Path:
    """Resolve the broker's runtime classpath from Maven Central once; return its lib dir.

    Runs ``mvn -B -f <pom> maven-dependency-plugin:3.8.1:copy-dependencies
    -DincludeScope=runtime`` into ``cache_dir()/<name>-<version>/lib`` (Maven's log
    goes to ``maven.log`` next to it) and writes a marker holding the POM's hash: a
    second call with the same POM runs nothing and downloads nothing. Safe to call
    from concurrent processes (file lock).

    Raises ValueError for an unknown name, RuntimeError if ``mvn`` is missing or
    resolution fails (the message carries the tail of ``maven.log``; the previous lib
    dir, if any, is left untouched).
    """
    spec = _spec(name)
    version = _version(spec)
    home = _home(spec)
    lib = home / "lib"
    marker = home / ".installed"
    pom_bytes = (_POM_DIR / spec.pom).read_bytes()
    pom_hash = hashlib.sha256(pom_bytes).hexdigest()
    with _locked(cache_dir() / f"{spec.name}-{version}.lock"):
        if marker.exists() and lib.is_dir():
            try:
                recorded = json.loads(marker.read_text()).get("pom_sha256")
            except (OSError, ValueError):
                recorded = None
            if recorded == pom_hash and any(lib.glob(f"{spec.marker_jar}*.jar")):
                return lib
        mvn = shutil.which("mvn")
        if not mvn:
            raise RuntimeError("mvn (Maven 3.x) not found on PATH; needed once to resolve jars")
        home.mkdir(parents=True, exist_ok=True)
        pom = home / "pom.xml"  # a copy: Maven may write target/ next to the POM
        pom.write_bytes(pom_bytes)
        staging = home / "lib.partial"
        shutil.rmtree(staging, ignore_errors=True)
        log = home / "maven.log"
        _say(f"resolving {name} {version} from Maven Central ...", progress, end=" ")
        started = time.monotonic()
        cmd = [
            mvn,
            "-B",
            "-f",
            str(pom),
            f"{_DEPENDENCY_PLUGIN}:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={staging}",
        ]
        with log.open("wb") as out:
            rc = subprocess.run(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, check=False
            ).returncode
        if rc != 0:
            _say("FAILED", progress)
            raise RuntimeError(
                f"resolving {name} {version} failed (mvn exit {rc}); last lines of {log}:\n" + _tail(log)
            )
        jars = sorted(staging.glob("*.jar"))
        if not any(j.name.startswith(spec.marker_jar) for j in jars):
            raise RuntimeError(f"{spec.marker_jar}*.jar missing from resolved classpath {staging}")
        size = sum(j.stat().st_size for j in jars)
        shutil.rmtree(lib, ignore_errors=True)
        staging.rename(lib)
        marker.write_text(json.dumps({"pom_sha256": pom_hash, "version": version, "jars": len(jars)}) + "\n")
        _say(
            f"done in {time.monotonic() - started:.0f} s ({len(jars)} jars, {size >> 20} MB)",
            progress,
        )
        return lib


# ----------------------------------------------------------------------- processes


def _proc_state(pid: int) -> str | None:
    """The /proc state letter of pid, or None if it does not exist."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        if not pathlib.Path("/proc").is_dir():  # no procfs: fall back to kill(0)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return None
            except PermissionError:
                return "?"
            return "?"
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _reap(pid: int) -> None:
    """Collect the exit status of a JVM this process started (else it stays a zombie).

    Only our own Popen objects are reaped: waiting on other children of this process
    would steal their exit status.
    """
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        del _CHILDREN[pid]


def _alive(pid: int) -> bool:
    """True if pid is a running (not exited) process."""
    _reap(pid)
    state = _proc_state(pid)
    return state is not None and state not in ("Z", "X")


def _gone(pid: int) -> bool:
    """True once pid has fully exited and released its resources (sockets, files).

    After SIGKILL the thread-group leader of a JVM shows as a zombie while its other
    threads are still exiting and the listening sockets still exist; only once the last
    thread is gone (reapable, or a single task left) are the ports free again.
    """
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is None:
            return False
        del _CHILDREN[pid]
        return True
    state = _proc_state(pid)
    if state is None:
        return True
    if state not in ("Z", "X"):
        return False
    try:
        return len(os.listdir(f"/proc/{pid}/task")) <= 1 and not os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return True


def _cmdline(pid: int) -> list[str]:
    try:
        raw = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _workdir_flag(workdir: pathlib.Path) -> str:
    return f"-Didempotent.service.workdir={workdir}"


def _is_ours(pid: int, spec: _Spec, workdir: pathlib.Path | None = None) -> bool:
    """True if pid is a broker JVM started by this module (for workdir, if given)."""
    args = _cmdline(pid)
    if spec.main_class not in args or f"-Didempotent.service={spec.name}" not in args:
        return False
    return workdir is None or _workdir_flag(workdir) in args


def _running_pid(spec: _Spec, state: Mapping[str, Any] | None) -> int | None:
    """The pid recorded in state if that process is alive and is our JVM for its workdir."""
    if state is None:
        return None
    pid = int(state.get("pid", 0))
    workdir = pathlib.Path(str(state.get("workdir")))
    if pid > 0 and _alive(pid) and _is_ours(pid, spec, workdir):
        return pid
    return None


def _our_jvms(spec: _Spec) -> list[int]:
    pids = []
    for entry in pathlib.Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        if pid != os.getpid() and _is_ours(pid, spec) and _alive(pid):
            pids.append(pid)
    return pids


def _listening_inodes(ports: set[int]) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = pathlib.Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A":  # LISTEN
                port = int(fields[1].rsplit(":", 1)[1], 16)
                if port in ports:
                    inodes.add(fields[9])
    return inodes


def _holds_ports(pid: int, ports: set[int]) -> bool:
    inodes = _listening_inodes(ports)
    if not inodes:
        return False
    try:
        fds = list(pathlib.Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            return True
    return False


def _terminate(pid: int, timeout: float) -> None:
    """SIGTERM pid, wait up to timeout, then SIGKILL; returns once it is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if not _gone(pid):
        _kill(pid)


def _graceful_stop(state: Mapping[str, Any], timeout: float) -> None:
    """Stop our broker JVM gracefully (then SIGKILL after timeout).

    Pulsar standalone runs the broker's and the embedded bookie's shutdown hooks
    concurrently on SIGTERM, so topics still open then fail to close their ledgers and
    persist their cursors ("Not enough non-faulty bookies"). Unloading every namespace
    through the admin API first closes them cleanly while the bookie is still up.
    """
    pid = int(state["pid"])
    deadline = time.monotonic() + timeout
    if state.get("name") == "pulsar":
        with contextlib.suppress(Exception):
            _pulsar_unload_all(_info(state), budget=min(30.0, timeout / 2))
    _terminate(pid, max(1.0, deadline - time.monotonic()))


def _pulsar_unload_all(info: ServiceInfo, budget: float) -> None:
    deadline = time.monotonic() + budget

    def get(path: str) -> list[str]:
        left = max(0.5, deadline - time.monotonic())
        with urllib.request.urlopen(f"{info.admin_url}{path}", timeout=left) as response:
            return [str(item) for item in json.load(response)]

    for tenant in get("/admin/v2/tenants"):
        for namespace in get(f"/admin/v2/namespaces/{tenant}"):
            if time.monotonic() >= deadline:
                return
            with contextlib.suppress(urllib.error.URLError, OSError):
                _http_status(
                    f"{info.admin_url}/admin/v2/namespaces/{namespace}/unload",
                    method="PUT",
                    timeout=max(0.5, deadline - time.monotonic()),
                )


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((_HOST, port))
        except OSError:
            return False
    return True


def _free_ports(count: int, exclude: set[int]) -> list[int]:
    ports: list[int] = []
    socks = []
    try:
        while len(ports) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind((_HOST, 0))
            port = int(sock.getsockname()[1])
            if port not in exclude and port not in ports:
                ports.append(port)
    finally:
        for sock in socks:
            sock.close()
    return ports


def _can_connect(port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((_HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


# --------------------------------------------------------------------------- state


def _read_state(name: str) -> dict[str, Any] | None:
    path = _state_path(name)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        path.unlink(missing_ok=True)  # unreadable: treat as stale
        return None
    return data if isinstance(data, dict) else None


def _write_state(name: str, state: Mapping[str, Any]) -> None:
    path = _state_path(name)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    workdir = pathlib.Path(str(state["workdir"]))
    if workdir.is_dir():
        (workdir / "service.json").write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")


def _info(state: Mapping[str, Any]) -> ServiceInfo:
    name = str(state["name"])
    ports = {k: int(v) for k, v in dict(state["ports"]).items()}
    if name == "kafka":
        return ServiceInfo(
            name=name,
            url=f"kafka://{_HOST}:{ports['port']}",
            bootstrap=f"{_HOST}:{ports['port']}",
            admin_url=None,
            pid=int(state["pid"]),
            workdir=str(state["workdir"]),
            proxy_port=ports.get("proxy_port"),
            relay_port=ports.get("relay_port"),
        )
    tls = "broker_tls_port" in ports and "web_tls_port" in ports
    return ServiceInfo(
        name=name,
        url=f"pulsar://{_HOST}:{ports['broker_port']}",
        bootstrap=f"pulsar://{_HOST}:{ports['broker_port']}",
        admin_url=f"http://{_HOST}:{ports['web_port']}",
        pid=int(state["pid"]),
        workdir=str(state["workdir"]),
        tls_url=f"pulsar+ssl://{_HOST}:{ports['broker_tls_port']}" if tls else None,
        tls_admin_url=f"https://{_HOST}:{ports['web_tls_port']}" if tls else None,
        ca_cert=str(pathlib.Path(str(state["workdir"])) / "tls" / "ca.pem") if tls else None,
    )


def _clean_stale(spec: _Spec, state: Mapping[str, Any] | None, workdir: pathlib.Path) -> None:
    """Stop leftover JVMs of ours: the one recorded in state, and any using workdir.

    A process is only a candidate if its command line carries our main class, our
    ``-Didempotent.service=<name>`` marker and ``-Didempotent.service.workdir=`` of the
    workdir in question; anything else (also our brokers from other workdirs, e.g. of
    another cache) is never touched - a port it holds makes the start fail instead.
    """
    pid = _running_pid(spec, state)
    if pid is not None:
        _terminate(pid, 20)
    if not pathlib.Path("/proc").is_dir():
        return
    for pid in _our_jvms(spec):
        if _is_ours(pid, spec, workdir):
            _terminate(pid, 20)


def _port_holders(ports: set[int]) -> str:
    """Describe which processes listen on ports (best effort, for error messages)."""
    holders = []
    for entry in pathlib.Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        if _holds_ports(pid, ports):
            args = _cmdline(pid)
            marks = [a for a in args if a.startswith("-Didempotent.service")]
            holders.append(f"pid {pid} ({' '.join(marks) or (args[0] if args else '?')})")
    return ", ".join(holders) or "unknown process"


# ----------------------------------------------------------------------- readiness


def _kafka_ready(info: ServiceInfo, deadline: float, check_alive: Callable[[], None]) -> None:
    """Kafka answers: metadata lists the broker, a probe topic can be created, a
    transactional producer commits one record to it, and the topic is deleted."""
    from confluent_kafka import KafkaError, KafkaException, Producer
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    port = int(info.bootstrap.rsplit(":", 1)[1])
    quiet: dict[str, str | int | float] = {"bootstrap.servers": info.bootstrap, "log_level": 0}
    last = "not reachable"
    while time.monotonic() < deadline:
        check_alive()
        if not _can_connect(port):
            time.sleep(0.2)
            continue
        try:
            admin = AdminClient(dict(quiet))
            metadata = admin.list_topics(timeout=5)
            if not metadata.brokers:
                raise RuntimeError("metadata has no brokers yet")
            futures = admin.create_topics([NewTopic(_PROBE_TOPIC, 1, 1)], operation_timeout=15, request_timeout=20)
            try:
                futures[_PROBE_TOPIC].result()
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
            producer = Producer({**quiet, "transactional.id": "idempotent-services-probe", "linger.ms": 0})
            producer.init_transactions(30)
            producer.begin_transaction()
            producer.produce(_PROBE_TOPIC, b"probe")
            producer.commit_transaction(30)
            admin.delete_topics([_PROBE_TOPIC], operation_timeout=15)[_PROBE_TOPIC].result()
            return
        except Exception as exc:  # not ready yet: retry until the deadline
            last = repr(exc)  # a string: keeping exc would keep its frames' clients alive
            time.sleep(0.5)
    raise TimeoutError(f"kafka did not become ready: {last}")


def _http_status(url: str, method: str = "GET", timeout: float = 5.0) -> int:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _pulsar_ready(info: ServiceInfo, deadline: float, check_alive: Callable[[], None]) -> None:
    """Pulsar answers: GET /admin/v2/brokers/health is 200 and a producer can send one
    message to persistent://public/default/<probe> (the topic is then deleted)."""
    import pulsar

    assert info.admin_url is not None
    web_port = int(info.admin_url.rsplit(":", 1)[1])
    topic = f"persistent://public/default/{_PROBE_TOPIC}"
    last = "not reachable"
    while time.monotonic() < deadline:
        check_alive()
        if not _can_connect(web_port):
            time.sleep(0.2)
            continue
        try:
            code = _http_status(f"{info.admin_url}/admin/v2/brokers/health", timeout=10)
            if code != 200:
                raise RuntimeError(f"brokers/health returned HTTP {code}")
            client = pulsar.Client(
                info.bootstrap,
                operation_timeout_seconds=15,
                logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
            )
            try:
                producer = client.create_producer(topic, send_timeout_millis=15000)
                producer.send(b"probe")
                producer.close()
            finally:
                client.close()
            with contextlib.suppress(OSError):
                _http_status(
                    f"{info.admin_url}/admin/v2/persistent/public/default/{_PROBE_TOPIC}?force=true",
                    method="DELETE",
                    timeout=15,
                )
            return
        except Exception as exc:  # not ready yet: retry until the deadline
            last = repr(exc)  # a string: keeping exc would keep its frames' clients alive
            time.sleep(0.5)
    raise TimeoutError(f"pulsar did not become ready: {last}")


def _answers(info: ServiceInfo, timeout: float = 5.0) -> bool:
    """A quick 'is it answering' check (no writes)."""
    try:
        if info.name == "kafka":
            port = int(info.bootstrap.rsplit(":", 1)[1])
            if not _can_connect(port, timeout):
                return False
            from confluent_kafka.admin import AdminClient

            admin = AdminClient({"bootstrap.servers": info.bootstrap, "log_level": 0})
            return bool(admin.list_topics(timeout=timeout).brokers)
        assert info.admin_url is not None
        return _http_status(f"{info.admin_url}/admin/v2/brokers/health", timeout=timeout) == 200
    except Exception:
        return False


# ------------------------------------------------------------------------- launch


def _render(template: str, target: pathlib.Path, values: Mapping[str, object]) -> None:
    text = (_CONF_DIR / template).read_text()
    target.write_text(string.Template(text).substitute({k: str(v) for k, v in values.items()}))


def _kafka_cluster_id() -> str:
    while True:  # Kafka's Uuid.randomUuid() also rejects ids starting with '-'
        cid = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _prepare_kafka(
    lib: pathlib.Path, workdir: pathlib.Path, ports: Mapping[str, int], log: pathlib.Path
) -> tuple[list[str], list[str]]:
    data = workdir / "data"
    props = workdir / "server.properties"
    _render("kafka-server.properties", props, {**ports, "data_dir": data})
    log4j = f"-Dlog4j2.configurationFile={_CONF_DIR / 'log4j2.properties'}"
    if not (data / "meta.properties").exists():
        fmt = [
            _java(),
            "-Xmx128m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            log4j,
            "-cp",
            f"{lib}/*",
            "kafka.tools.StorageTool",
            "format",
            "-c",
            str(props),
            "-t",
            _kafka_cluster_id(),
            "--ignore-formatted",
        ]
        with log.open("ab") as out:
            rc = subprocess.run(
                fmt,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=workdir,
                check=False,
            ).returncode
        if rc != 0:
            raise RuntimeError(f"kafka storage format failed (exit {rc}):\n{_tail(log)}")
    return [log4j], [str(props)]


def _prepare_pulsar(
    lib: pathlib.Path, workdir: pathlib.Path, ports: Mapping[str, int], log: pathlib.Path
) -> tuple[list[str], list[str]]:
    from .certs import make_certs

    conf = workdir / "standalone.conf"
    tls = make_certs(workdir / "tls", hosts=(_HOST, "localhost"), rsa=True, days=365)
    files = {"tls_cert": tls.server_cert, "tls_key": tls.server_key, "tls_ca": tls.ca_cert}
    _render("pulsar-standalone.conf", conf, {**ports, **files})
    metadata = workdir / "data" / "metadata"
    if metadata.is_dir():
        _pulsar_metadata_cleanup(lib, metadata, log)
    args = [
        "--config",
        str(conf),
        "--metadata-dir",
        str(metadata),
        "--bookkeeper-dir",
        str(workdir / "data" / "standalone" / "bookkeeper"),
        "--bookkeeper-port",
        str(ports["bookie_port"]),
        "--no-functions-worker",
        "--no-stream-storage",
        "--advertised-address",
        _HOST,
    ]
    return [f"-Dlog4j2.configurationFile={_CONF_DIR / 'log4j2.properties'}"], args


def _pulsar_metadata_cleanup(lib: pathlib.Path, metadata: pathlib.Path, log: pathlib.Path) -> None:
    """Delete stale ephemeral nodes left in the RocksDB metadata store by a previous JVM
    (see conf/PulsarMetadataCleanup.java for why). Compiled once into the cache."""
    source = _CONF_DIR / "PulsarMetadataCleanup.java"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    classes = lib.parent / f"helper-{digest}"
    java = _java()
    javac = pathlib.Path(java).with_name("javac")
    if not (classes / "PulsarMetadataCleanup.class").exists() and javac.exists():
        staging = lib.parent / f"helper-{digest}.tmp-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        compiled = subprocess.run(
            [str(javac), "-nowarn", "-cp", f"{lib}/*", "-d", str(staging), str(source)],
            capture_output=True,
            check=False,
        )
        if compiled.returncode == 0:
            with contextlib.suppress(OSError):  # another process may have won the race
                staging.rename(classes)
        shutil.rmtree(staging, ignore_errors=True)
    common = ["-Xmx64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
    if (classes / "PulsarMetadataCleanup.class").exists():
        cmd = [java, *common, "-cp", f"{classes}:{lib}/*", "PulsarMetadataCleanup", str(metadata)]
    else:  # no javac: single-file source launch (slower: compiles in memory each time)
        cmd = [java, *common, "-cp", f"{lib}/*", str(source), str(metadata)]
    with log.open("ab") as out:
        out.write(b"--- idempotent: removing stale ephemeral metadata ---\n")
        out.flush()
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, check=False).returncode
    if rc != 0:
        raise RuntimeError(f"pulsar metadata cleanup failed (exit {rc}):\n{_tail(log)}")


def _check_wipeable(workdir: pathlib.Path) -> None:
    """Raise ValueError unless workdir is absent, empty or was created by us."""
    if not workdir.exists():
        return
    if not workdir.is_dir():
        raise ValueError(f"workdir {workdir} exists and is not a directory")
    if not (workdir / _MARKER).exists() and any(workdir.iterdir()):
        raise ValueError(f"refusing to wipe {workdir}: not empty and not created by idempotent.testing.services")


def _prepare_workdir(workdir: pathlib.Path, fresh: bool) -> None:
    if fresh and workdir.exists():
        _check_wipeable(workdir)
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / _MARKER).write_text("created by idempotent.testing.services; wiped by up()\n")


def _start(spec: _Spec, *, ports: dict[str, int], workdir: pathlib.Path, fresh: bool, timeout: float) -> ServiceInfo:
    """Start the JVM (lock held by the caller) and wait until it answers."""
    lib = install(spec.name)
    _prepare_workdir(workdir, fresh)
    log = workdir / "broker.log"
    with log.open("ab") as out:
        out.write(f"--- idempotent: starting {spec.name} at {time.ctime()} ---\n".encode())
    prepare = _prepare_kafka if spec.name == "kafka" else _prepare_pulsar
    jvm_extra, main_args = prepare(lib, workdir, ports, log)
    cmd = [
        _java(),
        *spec.jvm_flags,
        *jvm_extra,
        f"-Didempotent.service={spec.name}",
        _workdir_flag(workdir),
        "-cp",
        f"{lib}/*",
        spec.main_class,
        *main_args,
    ]
    env = {k: v for k, v in os.environ.items() if k != "PULSAR_STANDALONE_USE_ZOOKEEPER"}
    started = time.monotonic()
    with log.open("ab") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    _CHILDREN[proc.pid] = proc
    state: dict[str, Any] = {
        "name": spec.name,
        "pid": proc.pid,
        "ports": dict(ports),
        "workdir": str(workdir),
        "main_class": spec.main_class,
        "version": _version(spec),
        "started_at": time.time(),
    }
    _write_state(spec.name, state)
    info = _info(state)

    def check_alive() -> None:
        if proc.poll() is not None:
            raise _Died(f"{spec.name} JVM exited with code {proc.returncode} while starting")

    ready = _kafka_ready if spec.name == "kafka" else _pulsar_ready
    try:
        ready(info, started + timeout, check_alive)
    except BaseException as exc:
        _kill(proc.pid)
        _state_path(spec.name).unlink(missing_ok=True)
        if isinstance(exc, _Died | TimeoutError):
            raise RuntimeError(
                f"{spec.name} did not become ready within {timeout:.0f} s ({exc}); last lines of {log}:\n{_tail(log)}"
            ) from exc
        raise
    state["ready_seconds"] = round(time.monotonic() - started, 2)
    _write_state(spec.name, state)
    return info


class _Died(RuntimeError):
    pass


def _stored_ports(spec: _Spec, state: Mapping[str, Any] | None, workdir: pathlib.Path) -> dict[str, int] | None:
    sources: list[Mapping[str, Any]] = []
    if state is not None and pathlib.Path(str(state.get("workdir"))) == workdir:
        sources.append(state)
    with contextlib.suppress(OSError, ValueError):
        sources.append(json.loads((workdir / "service.json").read_text()))
    for source in sources:
        ports = source.get("ports")
        if isinstance(ports, dict) and all(k in ports for k in spec.port_keys):
            return {k: int(ports[k]) for k in spec.port_keys}
        if isinstance(ports, dict) and all(k in ports for k in spec.port_keys[:3]):
            return _with_new_ports(spec, ports)  # kept from before the TLS listeners
    return None


def _with_new_ports(spec: _Spec, ports: Mapping[str, Any]) -> dict[str, int]:
    """``ports`` plus free ports for the keys it lacks (listeners added since it was stored)."""
    kept = {k: int(ports[k]) for k in spec.port_keys if k in ports}
    missing = [k for k in spec.port_keys if k not in kept]
    return {**kept, **dict(zip(missing, _free_ports(len(missing), exclude=set(kept.values())), strict=True))}


# ----------------------------------------------------------------------------- API


def up(
    name: str, *, port: int | None = None, workdir: str | None = None, timeout: float = 180.0, fresh: bool = True
) -> ServiceInfo:
    """Start broker ``name`` on 127.0.0.1 and wait until it really answers.

    Idempotent: if our broker is already running and answering it is returned as is
    (``port``/``fresh`` are then ignored unless ``port`` conflicts). Otherwise stale
    state is cleaned first: a state file with a dead pid is dropped, and a hung or
    leftover JVM of ours - command line with our main class, the
    ``-Didempotent.service=<name>`` marker and this workdir - is stopped (SIGTERM, then
    SIGKILL). Other processes are never touched; if one holds a needed port, the start
    fails with RuntimeError naming it.

    ``port`` is the client port (Kafka listener / Pulsar binary port); all other
    ports (Kafka controller, Pulsar web + bookie) are chosen free. ``workdir``
    defaults to ``/dev/shm/idempotent-<uid>-<hash>/<name>`` (or under the run dir).
    ``fresh=True`` wipes the workdir (only if it is empty or was created by us);
    ``fresh=False`` keeps its data and reuses the previous run's ports (needed by the
    Pulsar bookie, whose id is its port) unless ``port`` is given - e.g. after
    :func:`kill9`. Kafka is formatted only when its data dir is not yet formatted.

    Readiness: Kafka = metadata + probe topic create + transactional commit + delete;
    Pulsar = ``/admin/v2/brokers/health`` 200 + one message sent by a producer.

    Raises ValueError (unknown name, workdir we may not wipe, port conflicts with the
    running broker), RuntimeError (install failed, port held by a foreign process, or
    not ready within ``timeout`` s: the message has the last 40 lines of
    ``<workdir>/broker.log`` and no JVM is left running).
    """
    spec = _spec(name)
    with _locked(_run_dir() / f"{name}.lock"):
        state = _read_state(name)
        if state is not None and _running_pid(spec, state) is not None:
            info = _info(state)
            if port is not None and int(state["ports"][spec.port_keys[0]]) != port:
                raise ValueError(f"{name} already running on {info.url}; call down() first to use {port}")
            if _answers(info, timeout=10):
                return info
        if workdir is not None:
            target = pathlib.Path(workdir).expanduser().resolve()
        elif state is not None and not fresh:
            target = pathlib.Path(str(state["workdir"]))
        else:
            target = _default_workdir(name)
        if fresh:
            _check_wipeable(target)
        ports = None if fresh else _stored_ports(spec, state, target)
        chosen_by_us = ports is None
        if ports is None:
            free = _free_ports(len(spec.port_keys), exclude={port} if port else set())
            ports = dict(zip(spec.port_keys, free, strict=True))
        if port is not None:
            ports[spec.port_keys[0]] = port
        _clean_stale(spec, state, target)
        _state_path(name).unlink(missing_ok=True)
        attempts = 3 if chosen_by_us and port is None else 1
        for attempt in range(attempts):
            busy = [p for p in ports.values() if not _port_free(p)]
            if busy and attempt + 1 < attempts:  # lost a race for a free port: pick again
                free = _free_ports(len(spec.port_keys), exclude=set(busy))
                ports = dict(zip(spec.port_keys, free, strict=True))
                continue
            if busy:
                raise RuntimeError(
                    f"cannot start {name}: port(s) {busy} on {_HOST} are in use by another process: "
                    + _port_holders(set(busy))
                )
            return _start(spec, ports=ports, workdir=target, fresh=fresh, timeout=timeout)
        raise AssertionError("unreachable")


def down(name: str, timeout: float = 60.0) -> bool:
    """Stop broker ``name``: SIGTERM, wait up to ``timeout`` s, then SIGKILL.

    Also stops leftover JVMs of ours using the same workdir. Removes the run state
    file; the workdir (data and ``broker.log``) is kept until the next fresh ``up``.
    Returns True if a process was stopped, False if nothing was running. Raises
    ValueError for an unknown name.
    """
    spec = _spec(name)
    with _locked(_run_dir() / f"{name}.lock"):
        state = _read_state(name)
        stopped = False
        if state is not None:
            workdir = pathlib.Path(str(state["workdir"]))
            if _running_pid(spec, state) is not None:
                _graceful_stop(state, timeout)
                stopped = True
            if pathlib.Path("/proc").is_dir():
                for other in _our_jvms(spec):
                    if _is_ours(other, spec, workdir):
                        _terminate(other, timeout)
                        stopped = True
        _state_path(name).unlink(missing_ok=True)
        return stopped


def status(name: str) -> ServiceInfo | None:
    """Return the running broker if its JVM is alive, ours and answering, else None.

    Read-only: takes no lock and leaves stale state in place (``up`` cleans it, and
    ``up(fresh=False)`` after :func:`kill9` reuses it). Raises ValueError for an
    unknown name.
    """
    spec = _spec(name)
    state = _read_state(name)
    if state is None or _running_pid(spec, state) is None:
        return None
    info = _info(state)
    return info if _answers(info) else None


def kill9(name: str) -> None:
    """SIGKILL the broker JVM (crash tests) and wait until it is gone.

    The state file and workdir are kept, so ``up(name, fresh=False)`` restarts on the
    same ports and data. Raises RuntimeError if the broker is not running, ValueError
    for an unknown name.
    """
    spec = _spec(name)
    with _locked(_run_dir() / f"{name}.lock"):
        pid = _running_pid(spec, _read_state(name))
        if pid is None:
            raise RuntimeError(f"{name} is not running")
        _kill(pid)


def restart(name: str, timeout: float = 180.0) -> ServiceInfo:
    """Stop the broker gracefully and start it again on the same ports and data dir.

    Works after :func:`kill9` as well (then there is nothing to stop). Raises
    RuntimeError if there is no state for ``name`` (never started, or ``down`` was
    called) or if it does not become ready (see :func:`up`).
    """
    spec = _spec(name)
    with _locked(_run_dir() / f"{name}.lock"):
        state = _read_state(name)
        if state is None:
            raise RuntimeError(f"{name} is not running; nothing to restart")
        workdir = pathlib.Path(str(state["workdir"]))
        if _running_pid(spec, state) is not None:
            _graceful_stop(state, 60)
        ports = _with_new_ports(spec, state["ports"])
        _clean_stale(spec, None, workdir)
        busy = [p for p in ports.values() if not _port_free(p)]
        if busy:
            raise RuntimeError(f"cannot restart {name}: port(s) {busy} are in use: " + _port_holders(set(busy)))
        return _start(spec, ports=ports, workdir=workdir, fresh=False, timeout=timeout)


# ----------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    """``services up|down|status|install|restart|kill9 kafka|pulsar|all``.

    ``up`` prints each broker's URL on stdout (one line per service, for
    ``URL=$(... up kafka)``); ``status`` prints ``NAME URL (pid N)`` or
    ``NAME not running`` and exits 1 if any is not running; ``install`` prints the
    lib dir. Progress and errors go to stderr; the exit code is 1 on failure.
    """
    parser = argparse.ArgumentParser(
        prog="idempotent services", description="Run real single-node brokers on 127.0.0.1."
    )
    parser.add_argument("command", choices=("up", "down", "status", "install", "restart", "kill9"))
    parser.add_argument("service", choices=(*SERVICES, "all"))
    parser.add_argument("--port", type=int, default=None, help="client port (up; one service)")
    parser.add_argument(
        "--keep-data", action="store_true", help="up: keep the previous data dir and ports (fresh=False)"
    )
    parser.add_argument("--timeout", type=float, default=None, help="seconds")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    names = list(SERVICES) if args.service == "all" else [args.service]
    if args.port is not None and len(names) > 1:
        parser.error("--port needs a single service")
    rc = 0
    for name in names:
        try:
            if args.command == "install":
                print(install(name))
            elif args.command == "up":
                info = up(name, port=args.port, fresh=not args.keep_data, timeout=args.timeout or 180.0)
                print(info.connect_url)
            elif args.command == "restart":
                print(restart(name, timeout=args.timeout or 180.0).connect_url)
            elif args.command == "down":
                stopped = down(name, timeout=args.timeout or 60.0)
                print(f"{name} {'stopped' if stopped else 'was not running'}")
            elif args.command == "kill9":
                kill9(name)
                print(f"{name} killed")
            else:
                found = status(name)
                if found is None:
                    print(f"{name} not running")
                    rc = 1
                else:
                    print(f"{found.name} {found.connect_url} (pid {found.pid})")
        except (RuntimeError, ValueError, OSError) as exc:
            print(f"error: {name}: {exc}", file=sys.stderr)
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
