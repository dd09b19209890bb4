"""Which brokers :mod:`idempotent.testing.services` runs, where their files live, and the run
state that lets ``up`` in one process and ``down`` in another work.

The state of a service is ``cache_dir()/run/<name>.json`` (pid, ports, workdir), mirrored in
``<workdir>/service.json``; the workdir defaults to ``/dev/shm/idempotent-<uid>-<hash>/<name>``.
Part of the services helpers: use the public API of :mod:`idempotent.testing.services`.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import urllib.parse
from collections.abc import Mapping
from typing import Any

import attrs

SERVICES = ("kafka", "pulsar")

_HOST = "127.0.0.1"

_PKG_DIR = pathlib.Path(__file__).resolve().parent

_POM_DIR = _PKG_DIR / "poms"

_CONF_DIR = _PKG_DIR / "conf"

_MARKER = ".idempotent-service"  # marks a workdir created (and wipeable) by us


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
    text = json.dumps(state, indent=2, sort_keys=True) + "\n"
    tmp.write_text(text)
    tmp.replace(path)
    workdir = pathlib.Path(str(state["workdir"]))
    if workdir.is_dir():
        (workdir / "service.json").write_text(text)


def _remove_workdir(name: str) -> list[pathlib.Path]:
    """Remove ``name``'s default work directory, and the per-cache directory holding it when
    that is left empty (the caller holds the service's lock and has checked it is stopped).
    Returns what was removed."""
    workdir = _default_workdir(name)
    removed = []
    if workdir.exists():
        shutil.rmtree(workdir)
        removed.append(workdir)
    parent = workdir.parent
    if parent.name.startswith("idempotent-") and parent.is_dir() and not any(parent.iterdir()):
        parent.rmdir()
        removed.append(parent)
    return removed


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
